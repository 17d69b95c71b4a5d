package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/migctl/migctl/allreduce"
)

// checkShmDir fails, naming flag, unless dir is a directory: every worker
// creates its shared segments there, and would otherwise each fail with
// the same error only once started. A directory that cannot be examined
// (permissions) is left to the workers' own errors.
func checkShmDir(flag, dir string) error {
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%s %s: no such directory: create it (a tmpfs: mount -t tmpfs -o size=8g tmpfs %s) or leave %s out for /dev/shm",
			flag, dir, dir, flag)
	case err == nil && !st.IsDir():
		return fmt.Errorf("%s %s: not a directory: give the directory of the shared-memory segments (a tmpfs)", flag, dir)
	}
	return nil
}

// shmAdvice is the warning migctl run prints before starting np workers
// per node on backend ("gpu" or "host") when the shared-memory file system
// holds capacity bytes (0: unknown) and that is too small for the arena
// the job's group measured fastest: the workers still run (trainer shrinks
// its arenas to fit, allreduce.FitArena) but their collectives are slower,
// and a container's default 64 MiB is the usual cause. "" when it fits.
func shmAdvice(dir string, np int, backend string, capacity int64) string {
	if capacity <= 0 {
		return ""
	}
	chunk, slots := 2<<20, 4
	if backend == "gpu" {
		chunk, slots = allreduce.Staged(np, 0)
	}
	need := int64(allreduce.ArenaBytes(np, chunk, slots))
	if capacity/2 >= need {
		return ""
	}
	want := int64(1 << 30) // room for the job's group and its point-to-point links too
	for want < 4*need {
		want *= 2
	}
	return fmt.Sprintf("%s holds %d MiB; the job's shared arena of %d MiB for %d workers does not fit in half of it, "+
		"so the workers shrink it and their collectives run slower. Give it at least %d GiB: docker run --shm-size=%dg, "+
		"a Kubernetes emptyDir with medium: Memory mounted at /dev/shm, or --shm-dir on a larger tmpfs",
		dir, capacity>>20, need>>20, np, want>>30, want>>30)
}
