package main

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/internal/testutil"
)

// TestBenchStalledRank (issue 8 item 1): a rank stopped with SIGSTOP makes
// the others fail at the collective deadline, and the bench then ends
// within the launcher's documented margin (1 s settle + benchGrace), not a
// fixed 30 s; the stopped rank is gone afterwards. Its job token is in no
// rank's command line.
func TestBenchStalledRank(t *testing.T) {
	bin := testutil.MigctlBin(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const deadline = 5 * time.Second
	cmd := exec.CommandContext(ctx, bin, "bench", "allreduce", "--np", "3", "--backend", "host", "--token", "s3cret-token",
		"-b", "1MiB", "-e", "1MiB", "-n", "1000000", "-w", "0", "--timeout", deadline.String(), "--shm-dir", t.TempDir())
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	cmd.Stdout = &bytes.Buffer{}
	require.NoError(t, cmd.Start())
	started := regexp.MustCompile(`started rank (\d) \(pid (\d+)\)`)
	pids := map[int]int{}
	var log strings.Builder
	sc := bufio.NewScanner(stderr)
	for len(pids) < 3 && sc.Scan() {
		log.WriteString(sc.Text() + "\n")
		if m := started.FindStringSubmatch(sc.Text()); m != nil {
			r, _ := strconv.Atoi(m[1])
			pids[r], _ = strconv.Atoi(m[2])
		}
	}
	require.Len(t, pids, 3, "ranks not started:\n%s", log.String())
	done := make(chan struct{})
	go func() {
		for sc.Scan() {
			log.WriteString(sc.Text() + "\n")
		}
		close(done)
	}()
	for r, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		require.NoError(t, err)
		require.NotContains(t, string(b), "s3cret-token", "rank %d has the token on its command line", r)
	}
	time.Sleep(2 * time.Second) // into the collectives
	stopped := time.Now()
	require.NoError(t, syscall.Kill(pids[1], syscall.SIGSTOP))
	err = cmd.Wait()
	took := time.Since(stopped)
	<-done
	require.Error(t, err, "bench succeeded although rank 1 was stopped")
	margin := time.Second + benchGrace
	require.Less(t, took, deadline+margin+2*time.Second, "not within the deadline plus the margin:\n%s", log.String())
	_, err = os.Stat("/proc/" + strconv.Itoa(pids[1]))
	if err == nil {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(pids[1]) + "/stat")
		require.Contains(t, string(b), ") Z", "the stopped rank outlived the bench")
	}
	t.Logf("ended %v after the stop (deadline %v)", took.Round(time.Millisecond), deadline)
}

// benchCmd is `migctl bench allreduce --backend host --timeout 30s args...`
// with a TMPDIR of its own (short: the rendezvous socket made in it must fit
// in sun_path), removed when the test ends, and returned.
func benchCmd(ctx context.Context, t *testing.T, bin string, args ...string) (*exec.Cmd, string) {
	t.Helper()
	tmp, err := os.MkdirTemp("", "mb")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(tmp) })
	cmd := exec.CommandContext(ctx, bin, append([]string{"bench", "allreduce", "--backend", "host", "--timeout", "30s"}, args...)...)
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	return cmd, tmp
}

// TestBenchLauncherKilled (issue 8 item 6): a bench launcher killed with
// SIGKILL at any moment after start leaves no rank running and no
// shared-memory segment behind. (What the killed launcher made in $TMPDIR,
// its report and rendezvous directories, it cannot remove: the test gives
// it a TMPDIR of its own and removes that.)
func TestBenchLauncherKilled(t *testing.T) {
	bin := testutil.MigctlBin(t)
	for _, delay := range []time.Duration{0, 30 * time.Millisecond, 100 * time.Millisecond, 300 * time.Millisecond, time.Second} {
		t.Run(delay.String(), func(t *testing.T) {
			shmDir := t.TempDir()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd, _ := benchCmd(ctx, t, bin, "--np", "3", "-b", "1MiB", "-e", "1MiB", "-n", "1000000", "-w", "0", "--shm-dir", shmDir)
			stderr, err := cmd.StderrPipe()
			require.NoError(t, err)
			require.NoError(t, cmd.Start())
			started := regexp.MustCompile(`started rank \d \(pid (\d+)\)`)
			var pids []int
			sc := bufio.NewScanner(stderr)
			for len(pids) < 3 && sc.Scan() {
				if m := started.FindStringSubmatch(sc.Text()); m != nil {
					pid, _ := strconv.Atoi(m[1])
					pids = append(pids, pid)
				}
			}
			require.Len(t, pids, 3)
			go func() {
				for sc.Scan() {
				}
			}()
			time.Sleep(delay)
			require.NoError(t, cmd.Process.Kill())
			_ = cmd.Wait()
			var alive []int
			for range 250 {
				alive = alive[:0]
				for _, pid := range pids {
					if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil && !strings.Contains(string(b), ") Z") {
						alive = append(alive, pid)
					}
				}
				if len(alive) == 0 {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			require.Empty(t, alive, "ranks outlived the launcher")
			ents, err := os.ReadDir(shmDir)
			require.NoError(t, err)
			require.Empty(t, ents, "shared-memory segments left behind")
		})
	}
}

// TestBenchOutlivesAClosedPipe: `migctl bench ... | head -1` (the reader of
// its output gone) does not kill the launcher with SIGPIPE half way: it
// stops its ranks and leaves nothing in $TMPDIR (report and rendezvous
// directories) nor in the shared-memory directory.
func TestBenchOutlivesAClosedPipe(t *testing.T) {
	bin := testutil.MigctlBin(t)
	shmDir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd, tmp := benchCmd(ctx, t, bin, "--np", "2", "-b", "4KiB", "-e", "64KiB", "-n", "5", "-w", "1", "--shm-dir", shmDir)
	pr, pw, err := os.Pipe()
	require.NoError(t, err)
	cmd.Stdout, cmd.Stderr = pw, pw // 2>&1 | head: read up to the first rank's start, then gone
	require.NoError(t, cmd.Start())
	require.NoError(t, pw.Close())
	sc := bufio.NewScanner(pr)
	for sc.Scan() && !strings.Contains(sc.Text(), "started rank 0") {
	}
	require.NoError(t, pr.Close())
	err = cmd.Wait()
	// It fails (its report went nowhere), by its own error or, once it has
	// cleaned up, by SIGPIPE at the error's last line: the conventional end
	// of a tool whose reader left. What it must not do is die before.
	require.Error(t, err, "a bench whose report cannot be written must fail")
	for _, dir := range []string{tmp, shmDir} {
		ents, err := os.ReadDir(dir)
		require.NoError(t, err)
		require.Empty(t, ents, "left behind in %s", dir)
	}
}
