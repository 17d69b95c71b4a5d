package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCompleteOrder builds cabi.c alone with the Go side stubbed
// (testdata/complete_order.c): a migctl_run that runs on the calling thread
// as soon as the dispatcher lets the run lock go finds the collective the
// dispatcher just completed done, as it would through the ring; transfers
// start where they should; migctl_wait_stream returns early only for a
// readied collective, whose slot the completion then frees.
func TestCompleteOrder(t *testing.T) {
	cc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("no gcc")
	}
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "_cgo_export.h"), nil, 0o644)) // the test declares the stubs
	exe := filepath.Join(dir, "complete_order")
	out, err := exec.Command(cc, "-Wall", "-Werror", "-pthread", "-I", filepath.Join(repoRoot(t), "include"), "-I", dir,
		"testdata/complete_order.c", "-o", exe).CombinedOutput()
	require.NoError(t, err, "%s", out)
	out, err = exec.Command(exe).CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Equal(t, "ok\n", string(out))
}
