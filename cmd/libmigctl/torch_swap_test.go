package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// rank0Report is the JSON line rank 0 of an examples/pytorch script printed
// under `migctl run` ("[0]: {...}").
func rank0Report(t *testing.T, out string) map[string]any {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(line, "[0]: {"); ok {
			var m map[string]any
			require.NoError(t, json.Unmarshal([]byte("{"+rest), &m), "rank 0's report: %s", line)
			return m
		}
	}
	t.Fatalf("no report from rank 0 in:\n%s", out)
	return nil
}

// TestTorchDDPUnderGangSwap: DDP over the migctl backend (2 ranks, host
// backend, the small GPT on CPU) under `migctl run --swap` with a daemon;
// `migctl swap out --job` at step 5 holds the whole job for longer than its
// 5-s collective deadline, `swap in` resumes it, and it ends with the losses
// and parameters of the same job never swapped. (The GPU version, with a
// priority-10 job preempting it for memory: scripts/h200-train.d/pytorch-swap.sh.)
func TestTorchDDPUnderGangSwap(t *testing.T) {
	lib, bin := artifacts(t)
	needTorch(t)
	shim := filepath.Join(os.Getenv("MIGSWAP_BIN"), "libmigswap.so")
	if os.Getenv("MIGSWAP_BIN") == "" {
		shim = filepath.Join(repoRoot(t), "bin", "libmigswap.so")
	}
	if _, err := os.Stat(shim); err != nil {
		t.Skipf("no %s (make shim, or MIGSWAP_BIN): %v", shim, err)
	}
	dir, err := os.MkdirTemp("", "ptswap") // short: Unix socket paths
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	ctl, swp := filepath.Join(dir, "c.sock"), filepath.Join(dir, "s.sock")
	var dlog bytes.Buffer
	daemon := exec.Command(bin, "daemon", "--gpu-memory", "80GiB", "--socket", ctl, "--swap-socket", swp, "--rebalance-every", "0")
	daemon.Stdout, daemon.Stderr = &dlog, &dlog
	require.NoError(t, daemon.Start())
	t.Cleanup(func() {
		_ = daemon.Process.Signal(syscall.SIGTERM)
		_ = daemon.Wait()
		if t.Failed() {
			t.Logf("daemon log:\n%s", dlog.String())
		}
	})
	cli := func(args ...string) (string, error) {
		out, err := exec.Command(bin, append(args, "--socket", ctl)...).CombinedOutput()
		return string(out), err
	}
	require.Eventually(t, func() bool { _, err := cli("swap", "status"); return err == nil }, 15*time.Second,
		50*time.Millisecond, "the daemon never answered")

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	job := func(name string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, bin, "run", "--backend", "host", "--np", "2", "--socket", ctl, "--swap",
			"--swap-lib", shim, "--swap-socket", swp, "--job", name, "--timeout", "5s", "-q", "--",
			python, filepath.Join(repoRoot(t), "examples", "pytorch", "ddp_gpt.py"), "--backend", "migctl",
			"--device", "cpu", "--layers", "1", "--d-model", "32", "--heads", "2", "--seq", "16", "--vocab", "64",
			"--batch", "2", "--pool", "2", "--warmup", "0", "--steps", "20", "--losses", "20", "--step-delay", "0.1",
			"--mark-at", "5", "--mark-file", filepath.Join(dir, name+".mark"))
		cmd.Env = append(os.Environ(), "MIGCTL_LIB="+lib, "OMP_NUM_THREADS=1")
		cmd.WaitDelay = 5 * time.Second
		return cmd
	}
	// the reference runs beside the swapped job (they share nothing but the daemon)
	type result struct {
		out []byte
		err error
	}
	refDone := make(chan result, 1)
	go func() {
		out, err := job("ref").CombinedOutput()
		refDone <- result{out, err}
	}()
	held := job("held")
	var heldOut bytes.Buffer
	held.Stdout, held.Stderr = &heldOut, &heldOut
	require.NoError(t, held.Start())
	done := make(chan error, 1)
	go func() { done <- held.Wait() }()
	mark := filepath.Join(dir, "held.mark")
	require.Eventually(t, func() bool { _, err := os.Stat(mark); return err == nil }, 2*time.Minute, 20*time.Millisecond,
		"the job never reached step 5")
	out, err := cli("swap", "out", "--job", "held")
	require.NoError(t, err, "swap out: %s", out)
	time.Sleep(6 * time.Second) // past the 5-s collective deadline: held time does not count
	out, err = cli("swap", "status", "-o", "json")
	require.NoError(t, err, out)
	var st struct {
		Processes []struct{ Job, State string } `json:"processes"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &st))
	n := 0
	for _, p := range st.Processes {
		if p.Job == "held" {
			require.Equal(t, "out", p.State, "every rank of the job is held")
			n++
		}
	}
	require.Equal(t, 2, n, "both ranks registered with the daemon: %s", out)
	out, err = cli("swap", "in", "--job", "held")
	require.NoError(t, err, "swap in: %s", out)
	require.NoError(t, <-done, "the swapped job:\n%s", heldOut.String())
	r := <-refDone
	refOut := r.out
	require.NoError(t, r.err, "the unswapped job:\n%s", refOut)

	ref, got := rank0Report(t, string(refOut)), rank0Report(t, heldOut.String())
	require.Len(t, ref["losses"], 20)
	require.Equal(t, ref["losses"], got["losses"], "losses after a gang swap")
	require.Equal(t, ref["param_checksum"], got["param_checksum"], "parameters after a gang swap")
	require.Equal(t, true, got["ranks_identical"])
	t.Logf("%d losses identical, last %v", len(ref["losses"].([]any)), fmt.Sprint(ref["losses"].([]any)[19]))
}
