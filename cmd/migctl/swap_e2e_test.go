package main

// End to end: the real `migctl daemon` binary, the real libmigswap.so and the
// shim's C test program on the fake libcuda.so (all built by shim/Makefile),
// driven by the real `migctl swap` binary.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/internal/testutil"
)

// e2eBinaries finds or builds what the end-to-end test runs: $MIGSWAP_BIN
// when set (as `make test` sets it), else the shim built with shim/Makefile
// into the test's temporary directory; and testutil.MigctlBin.
func e2eBinaries(t *testing.T) (shimDir, migctlBin string) {
	t.Helper()
	shimDir = os.Getenv("MIGSWAP_BIN")
	if shimDir == "" {
		for _, tool := range []string{"make", "gcc"} {
			if _, err := exec.LookPath(tool); err != nil {
				t.Skipf("cannot build the shim: %s not found (or set MIGSWAP_BIN)", tool)
			}
		}
		_, file, _, _ := runtime.Caller(0)
		repo := filepath.Join(filepath.Dir(file), "..", "..")
		shimDir = filepath.Join(t.TempDir(), "shim")
		out, err := exec.Command("make", "-s", "-C", filepath.Join(repo, "shim"), "BIN="+shimDir).CombinedOutput()
		require.NoError(t, err, "building the shim: %s", out)
	}
	for _, f := range []string{"libmigswap.so", "fakecuda/libcuda.so.1", "migswap_testprog"} {
		_, err := os.Stat(filepath.Join(shimDir, f))
		require.NoError(t, err, "the shim build in %s lacks %s", shimDir, f)
	}
	return shimDir, testutil.MigctlBin(t)
}

// e2eEnv is the environment of a shimmed test program.
func e2eEnv(shimDir, socket, stats, job string, priority int) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "LD_PRELOAD=") || strings.HasPrefix(kv, "LD_LIBRARY_PATH=") ||
			strings.HasPrefix(kv, "MIGSWAP_") || strings.HasPrefix(kv, "FAKECUDA_") {
			continue
		}
		env = append(env, kv)
	}
	return append(env,
		"LD_PRELOAD="+filepath.Join(shimDir, "libmigswap.so"),
		"LD_LIBRARY_PATH="+filepath.Join(shimDir, "fakecuda"),
		"MIGSWAP_SOCKET="+socket,
		"MIGSWAP_JOB="+job,
		"MIGSWAP_PRIORITY="+strconv.Itoa(priority),
		"MIGSWAP_CHECKSUM=1",
		"FAKECUDA_STATS="+stats,
		"FAKECUDA_MEM_BYTES="+strconv.Itoa(64<<20),
	)
}

// program is a running shimmed test program.
type program struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
	done  chan struct{}
}

func startProgram(t *testing.T, shimDir string, env []string, args ...string) *program {
	t.Helper()
	cmd := exec.Command(filepath.Join(shimDir, "migswap_testprog"), args...)
	cmd.Env = env
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &program{cmd: cmd, stdin: stdin, lines: make(chan string, 64), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return p
}

// expect returns the key=value fields of the first line starting with prefix.
func (p *program) expect(t *testing.T, prefix string, timeout time.Duration) map[string]string {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case l, ok := <-p.lines:
			require.True(t, ok, "program ended before printing %s", prefix)
			if strings.HasPrefix(l, prefix+" ") {
				kv := map[string]string{}
				for _, f := range strings.Fields(strings.TrimPrefix(l, prefix+" ")) {
					if k, v, ok := strings.Cut(f, "="); ok {
						kv[k] = strings.Trim(v, `"`)
					}
				}
				return kv
			}
		case <-deadline:
			t.Fatalf("no %s line within %s", prefix, timeout)
		}
	}
}

// fakeInUse reads the bytes the fake device has in use from its stats file
// (struct fakecuda_stats: little-endian uint64 words magic, capacity, in_use).
func fakeInUse(t *testing.T, stats string) int64 {
	t.Helper()
	b, err := os.ReadFile(stats)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(b), 24)
	return int64(binary.LittleEndian.Uint64(b[16:24]))
}

func runMigctl(t *testing.T, bin string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if err != nil {
		err = fmt.Errorf("migctl %s: %w: %s", strings.Join(args, " "), err, errOut.String())
	}
	return out.String(), err
}

func e2eStatus(t *testing.T, bin, socket string) map[string]processView {
	t.Helper()
	out, err := runMigctl(t, bin, "swap", "status", "--socket", socket, "-o", "json")
	require.NoError(t, err)
	var v statusView
	require.NoError(t, json.Unmarshal([]byte(out), &v))
	byJob := map[string]processView{}
	for _, p := range v.Processes {
		byJob[p.Job] = p
	}
	return byJob
}

func TestSwapEndToEndWithShim(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the shim and the migctl binary; skipped with -short")
	}
	shimDir, bin := e2eBinaries(t)
	swapSock, ctlSock, stats, dlog := startE2EDaemon(t, bin, "--gpu-memory", "64MiB", "--rebalance-every", "0")

	// A low-priority job: 4 buffers of 8 MiB, launching kernels until told to stop.
	low := startProgram(t, shimDir, e2eEnv(shimDir, swapSock, stats, "low", 1), "dlsym", "loop", "4", strconv.Itoa(8<<20))
	low.expect(t, "READY", 10*time.Second)
	require.Eventually(t, func() bool { return e2eStatus(t, bin, ctlSock)["low"].Bytes == 32<<20 }, 10*time.Second, 20*time.Millisecond,
		"the shim never reported its 32 MiB")
	require.Equal(t, int64(32<<20), fakeInUse(t, stats))

	// migctl swap out: the GPU memory is really released.
	out, err := runMigctl(t, bin, "swap", "out", "--job", "low", "--socket", ctlSock, "-o", "json")
	require.NoError(t, err)
	var res swapResults
	require.NoError(t, json.Unmarshal([]byte(out), &res))
	require.Len(t, res.Results, 1)
	require.True(t, res.Results[0].OK, res.Results[0].Error)
	require.Equal(t, int64(32<<20), res.Results[0].Bytes)
	require.Zero(t, fakeInUse(t, stats), "swapped out: nothing left on the device")
	st := e2eStatus(t, bin, ctlSock)["low"]
	require.Equal(t, "out", st.State)
	require.True(t, st.Hold)
	_, err = runMigctl(t, bin, "swap", "out", "--job", "low", "--socket", ctlSock)
	require.ErrorContains(t, err, "already swapped out")

	// migctl swap in: same addresses, the program goes on.
	time.Sleep(100 * time.Millisecond)
	out, err = runMigctl(t, bin, "swap", "in", "--job", "low", "--socket", ctlSock, "-o", "json")
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal([]byte(out), &res))
	require.True(t, res.Results[0].OK, res.Results[0].Error)
	require.Equal(t, int64(32<<20), fakeInUse(t, stats))
	require.Equal(t, "running", e2eStatus(t, bin, ctlSock)["low"].State)

	// The policy: a high-priority job needs 48 MiB of the 64 MiB device while
	// the low one holds 32. Its allocation fails, the shim asks (need), the
	// daemon swaps the low job out and grants; the retry succeeds.
	high := startProgram(t, shimDir, e2eEnv(shimDir, swapSock, stats, "high", 10), "dlsym", "oom", strconv.Itoa(48<<20))
	r := high.expect(t, "RESULT", 30*time.Second)
	require.Equal(t, "1", r["ok"], "high-priority allocation after the need: %v", r)
	require.Equal(t, "0", r["code"])
	require.Equal(t, "0", r["wrong"])
	<-high.done
	// It exited and freed its memory: the policy brings the low job back.
	require.Eventually(t, func() bool {
		p := e2eStatus(t, bin, ctlSock)["low"]
		return p.State == "running"
	}, 10*time.Second, 20*time.Millisecond, "the low job was never swapped back in")
	require.Equal(t, int64(32<<20), fakeInUse(t, stats))
	require.Contains(t, dlog.String(), "need granted")

	// Stop the low job: it checks every float of its buffers.
	_, err = io.WriteString(low.stdin, "stop\n")
	require.NoError(t, err)
	stats2 := low.expect(t, "STATS", 30*time.Second)
	require.Equal(t, "2", stats2["swaps_out"])
	require.Equal(t, "2", stats2["swaps_in"])
	r = low.expect(t, "RESULT", 30*time.Second)
	require.Equal(t, "1", r["ok"], "low job after two swaps: %v", r)
	require.Equal(t, "0", r["wrong"])
	require.Equal(t, "0", r["bad_probe"])
	<-low.done
	require.Eventually(t, func() bool { _, ok := e2eStatus(t, bin, ctlSock)["low"]; return !ok }, 10*time.Second, 20*time.Millisecond,
		"the daemon forgets an exited process")
}

// startE2EDaemon starts `migctl daemon` with args and its sockets in a short
// temporary directory (Unix socket paths are limited to 108 bytes), stops it
// when the test ends (printing its log if the test failed), and waits until it
// answers. It returns the sockets, the fake driver's stats file and the
// daemon's output.
func startE2EDaemon(t *testing.T, bin string, args ...string) (swapSock, ctlSock, stats string, dlog *testutil.LockedBuffer) {
	t.Helper()
	dir, err := os.MkdirTemp("", "mce")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	swapSock, ctlSock, stats = filepath.Join(dir, "run", "swap.sock"), filepath.Join(dir, "run", "ctl.sock"), filepath.Join(dir, "fakecuda.stats")
	dlog = &testutil.LockedBuffer{}
	daemon := exec.Command(bin, append([]string{"daemon", "--swap-socket", swapSock, "--socket", ctlSock}, args...)...)
	daemon.Stdout, daemon.Stderr = dlog, dlog
	require.NoError(t, daemon.Start())
	t.Cleanup(func() {
		_ = daemon.Process.Signal(syscall.SIGTERM)
		_ = daemon.Wait()
		if t.Failed() {
			t.Logf("daemon log:\n%s", dlog.String())
		}
	})
	require.Eventually(t, func() bool { _, err := runMigctl(t, bin, "swap", "status", "--socket", ctlSock); return err == nil },
		10*time.Second, 20*time.Millisecond, "daemon never answered")
	return swapSock, ctlSock, stats, dlog
}
