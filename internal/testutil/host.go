package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// MountTmpfs mounts a tmpfs of size bytes on a fresh directory for the test
// (a container's small /dev/shm), unmounted at its end, or skips the test
// where it may not mount one (not root, no CAP_SYS_ADMIN).
func MountTmpfs(t testing.TB, size int64) string {
	t.Helper()
	dir := t.TempDir()
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", size), "tmpfs", dir).CombinedOutput()
	if err != nil {
		t.Skipf("cannot mount a tmpfs here (needs root): %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() })
	return dir
}

// CPUs are the first n CPUs this process may run on, in order; the test is
// skipped where it may run on fewer.
func CPUs(t testing.TB, n int) []int {
	t.Helper()
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		t.Fatalf("reading this process's CPUs: %v", err)
	}
	var out []int
	for c := 0; c < len(set)*64 && len(out) < n; c++ {
		if set.IsSet(c) {
			out = append(out, c)
		}
	}
	if len(out) < n {
		t.Skipf("needs %d CPUs, may run on %d", n, len(out))
	}
	return out
}

// WriteTree writes files (path relative to a fresh directory → contents,
// a newline added) and returns the directory: a fake sysfs, say.
func WriteTree(t testing.TB, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for rel, v := range files {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}
