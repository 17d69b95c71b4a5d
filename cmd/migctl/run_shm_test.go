package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/internal/testutil"
)

func TestShmAdvice(t *testing.T) {
	for _, tc := range []struct {
		desc     string
		np       int
		backend  string
		capacity int64
		want     string // "" : no warning
	}{
		{"unknown size", 7, "gpu", 0, ""},
		{"roomy", 7, "gpu", 64 << 30, ""},
		{"7 gpu workers in a container's 64 MiB", 7, "gpu", 64 << 20,
			"holds 64 MiB; the job's shared arena of 128 MiB for 7 workers does not fit in half of it"},
		{"exactly twice the arena", 7, "gpu", 256 << 20, ""},
		{"2 gpu workers, 256 MiB", 2, "gpu", 256 << 20, "arena of 192 MiB for 2 workers"},
		{"2 host workers in 64 MiB fit", 2, "host", 64 << 20, ""},
		{"7 host workers in 64 MiB", 7, "host", 64 << 20, "arena of 64 MiB for 7 workers"},
		{"64 gpu workers ask for more than a GiB", 64, "gpu", 256 << 20, "arena of 520 MiB for 64 workers does not fit in half of it, so the workers shrink it and their collectives run slower. Give it at least 4 GiB: docker run --shm-size=4g"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			got := shmAdvice("/dev/shm", tc.np, tc.backend, tc.capacity)
			if tc.want == "" {
				require.Empty(t, got)
				return
			}
			require.Contains(t, got, tc.want)
			require.Contains(t, got, "/dev/shm")
			require.Contains(t, got, "--shm-size")
		})
	}
}

// migctl run on a small shared-memory file system warns once, then runs the
// job.
func TestRunWarnsOfASmallShm(t *testing.T) {
	dir := testutil.MountTmpfs(t, 64<<20)
	r := newRunCLI(t, testutil.MigctlBin(t))
	for _, tc := range []struct {
		np   int
		warn bool
	}{{7, true}, {2, false}} {
		_, stderr, err := r.run(t, nil, "--np", fmt.Sprint(tc.np), "--backend", "host", "--shm-dir", dir, "-q", "--", "true")
		require.NoError(t, err, stderr)
		want := fmt.Sprintf("run: warning: %s holds 64 MiB", dir)
		if tc.warn {
			require.Equal(t, 1, strings.Count(stderr, want), "np %d: %q", tc.np, stderr)
		} else {
			require.NotContains(t, stderr, "holds 64 MiB", "np %d", tc.np)
		}
	}
	r.requireClean(t)
}
