package nccl

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// Where NCCL is not installed (CI), Open says so and what to do; where it
// is (the GPU machine, with MIGCTL_NCCL_LIB or LD_LIBRARY_PATH set), Open
// works and the version is 2.x.
func TestOpenRealLibrary(t *testing.T) {
	lib, err := Open()
	if err != nil {
		if os.Getenv("MIGCTL_NCCL_REQUIRED") == "1" {
			t.Fatalf("MIGCTL_NCCL_REQUIRED=1 but: %v", err)
		}
		require.ErrorIs(t, err, ErrLibraryNotFound)
		require.ErrorContains(t, err, "libnccl.so.2 not found")
		require.ErrorContains(t, err, "set LD_LIBRARY_PATH")
		require.ErrorContains(t, err, "install NCCL")
		_, again := Open()
		require.Equal(t, err, again)
		return
	}
	v, err := lib.GetVersion()
	require.NoError(t, err)
	major, _, _ := Version(v)
	require.Equal(t, 2, major, "version code %d", v)
	t.Logf("NCCL %s (code %d) loaded", VersionString(v), v)
	_, err = lib.GetUniqueID()
	require.NoError(t, err)
	require.Contains(t, lib.GetErrorString(ErrRemote), "remote")
}
