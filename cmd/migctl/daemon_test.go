package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/internal/testutil"
)

type testDaemon struct {
	swapSocket, ctlSocket string
	log                   *testutil.LockedBuffer
}

// startTestDaemon runs `migctl daemon` in-process with its sockets in a
// fresh directory (and extra flags).
func startTestDaemon(t *testing.T, extra ...string) *testDaemon {
	t.Helper()
	dir, err := os.MkdirTemp("", "mcd") // short: Unix socket paths are limited to 108 bytes
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	d := &testDaemon{swapSocket: filepath.Join(dir, "run", "swap.sock"), ctlSocket: filepath.Join(dir, "run", "ctl.sock"), log: &testutil.LockedBuffer{}}
	runTestDaemon(t, d, append([]string{"daemon", "--swap-socket", d.swapSocket, "--socket", d.ctlSocket, "--rebalance-every", "0"}, extra...))
	return d
}

// runTestDaemon runs the daemon command args in-process until the test
// ends, and waits until it is ready.
func runTestDaemon(t *testing.T, d *testDaemon, args []string) {
	t.Helper()
	cmd := newRootCmd(streams{In: strings.NewReader(""), Out: d.log, ErrOut: d.log})
	cmd.SetArgs(args)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
			_, err = os.Stat(d.ctlSocket)
			require.True(t, os.IsNotExist(err), "the daemon removes its sockets on exit")
		case <-time.After(10 * time.Second):
			buf := make([]byte, 1<<20)
			t.Errorf("daemon did not stop:\n%s\n%s", d.log.String(), buf[:runtime.Stack(buf, true)])
		}
	})
	require.Eventually(t, func() bool {
		select {
		case err := <-done:
			t.Fatalf("daemon exited: %v\n%s", err, d.log.String())
		default:
		}
		return strings.Contains(d.log.String(), "migctl daemon ready")
	}, 10*time.Second, 10*time.Millisecond)
}

// migctl runs one CLI command in-process and returns stdout, stderr, error.
func migctl(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := newRootCmd(streams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), errOut.String(), err
}

func TestDaemonSocketsAndFlags(t *testing.T) {
	d := startTestDaemon(t, "--gpu-memory", "8GiB")
	for _, p := range []struct {
		path string
		mode os.FileMode
	}{{filepath.Dir(d.ctlSocket), 0o700}, {d.ctlSocket, 0o600}, {d.swapSocket, 0o600}} {
		fi, err := os.Stat(p.path)
		require.NoError(t, err)
		require.Equal(t, p.mode, fi.Mode().Perm(), p.path)
	}
	require.Contains(t, d.log.String(), "declared 8.0 GiB per device")

	tests := []struct {
		desc string
		args []string
		want string
	}{
		{"same sockets", []string{"daemon", "--socket", "/tmp/x.sock", "--swap-socket", "/tmp/x.sock", "--gpu-memory", "1G"}, "must differ"},
		{"bad size", []string{"daemon", "--gpu-memory", "lots"}, `invalid byte size "lots"`},
		{"bad log level", []string{"daemon", "--gpu-memory", "1G", "--log-level", "loud"}, "--log-level"},
		{"second daemon on the same sockets", []string{"daemon", "--socket", d.ctlSocket + "2", "--swap-socket", d.swapSocket, "--gpu-memory", "1G"}, "another daemon is listening"},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			_, _, err := migctl(t, tc.args...)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestDaemonHelpTeaches(t *testing.T) {
	out, _, err := migctl(t, "daemon", "--help")
	require.NoError(t, err)
	for _, want := range []string{"LD_PRELOAD=", "libmigswap.so", "MIGSWAP_JOB", "MIGSWAP_PRIORITY", "MIGSWAP_SOCKET",
		"/run/migctl/migswap.sock", "/run/migctl/control.sock", "--gpu-memory", "SO_PEERCRED", "0600"} {
		require.Contains(t, out, want)
	}
}
