package trainer

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/comm/shm"
)

// A failure to register the shared segment with the GPU says why when the
// segments' directory is on a file system whose pages cannot be pinned, and
// is left as it was otherwise.
func TestShmRootHint(t *testing.T) {
	base := errors.New("registering 134217728 bytes of host memory: invalid argument")
	tmpfs := ""
	if fs, err := shm.FSOf(shm.DefaultRoot); err == nil && fs.Memory {
		tmpfs = shm.DefaultRoot
	}
	for _, tc := range []struct {
		name, root string
		hint       string // "" : err unchanged
	}{
		{"not memory", "/proc", "the shared-memory directory /proc is on proc, whose pages the GPU driver cannot pin"},
		{"missing directory", filepath.Join(t.TempDir(), "gone"), ""},
		{"tmpfs", tmpfs, ""},
		{"default root", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.root == "" && tmpfs == "" {
				t.Skip("/dev/shm is not a tmpfs here")
			}
			err := shmRootHint(tc.root, base)
			require.ErrorIs(t, err, base)
			if tc.hint == "" {
				require.Equal(t, base, err)
				return
			}
			require.ErrorContains(t, err, tc.hint)
			require.ErrorContains(t, err, EnvShmRoot)
		})
	}
}
