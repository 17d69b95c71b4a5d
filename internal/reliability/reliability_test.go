package reliability

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/migctl/migctl/internal/testutil"
)

// envWrite makes the suite record every row and write docs/reliability.md
// instead of failing on a row.
const envWrite = "MIGCTL_WRITE_RELIABILITY"

// suite is one run: the binary under test and the rows so far.
type suite struct {
	bin     string
	write   bool
	mu      sync.Mutex
	rows    []Row
	skipped int // rows -run filtered out
}

// trials collects one row's trials.
type trials struct {
	n        int
	failures []string
	worst    time.Duration
	skipped  string
	note     string
}

// try runs one trial: f returns how long the fault took to reach its outcome
// and an error when the outcome was not the expected one.
func (tr *trials) try(name string, f func() (time.Duration, error)) {
	tr.n++
	d, err := f()
	if d > tr.worst {
		tr.worst = d
	}
	if err != nil {
		tr.failures = append(tr.failures, name+": "+err.Error())
	}
}

// fail records a failure outside any trial (setup).
func (tr *trials) fail(what string, err error) {
	tr.failures = append(tr.failures, what+": "+err.Error())
}

// row runs one fault class as a subtest and records it. In write mode a
// failing row is logged, not failed.
func (s *suite) row(t *testing.T, area, class, expected string, f func(t *testing.T, tr *trials)) {
	ran := false
	t.Run(area+"/"+class, func(t *testing.T) {
		ran = true
		tr := &trials{}
		f(t, tr)
		r := Row{Area: area, Class: class, Expected: expected, Trials: tr.n, Failed: len(tr.failures), Worst: tr.worst, Skipped: tr.skipped, Note: tr.note}
		r.Failures = tr.failures
		if len(r.Failures) > 3 {
			r.Failures = append(r.Failures[:3:3], fmt.Sprintf("and %d more", len(tr.failures)-3))
		}
		if r.Failed > r.Trials {
			r.Trials = r.Failed // setup failures count as trials that failed
		}
		s.mu.Lock()
		s.rows = append(s.rows, r)
		s.mu.Unlock()
		for _, f := range tr.failures {
			if s.write {
				t.Log("FAIL " + f)
			} else {
				t.Error(f)
			}
		}
		if tr.note != "" {
			t.Log(tr.note)
		}
		if tr.skipped != "" {
			t.Skip(tr.skipped)
		}
	})
	if !ran {
		s.skipped++
	}
}

// TestReliability runs every fault class; see the package doc.
func TestReliability(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the migctl binary through every fault class (minutes); skipped with -short")
	}
	s := &suite{bin: testutil.MigctlBin(t), write: os.Getenv(envWrite) == "1"}
	start := time.Now()
	s.daemonRows(t)
	s.cliRows(t)
	s.crashRows(t)
	s.benchRows(t)
	s.joinRows(t)
	if !s.write {
		return
	}
	if s.skipped > 0 {
		t.Logf("%d rows filtered out by -run: docs/reliability.md not written", s.skipped)
		return
	}
	path := filepath.Join(repoRoot(t), "docs", "reliability.md")
	if err := os.WriteFile(path, []byte(Markdown(header(t, time.Since(start)), s.rows)), 0o644); err != nil {
		t.Fatalf("writing %s: %v", path, err)
	}
	t.Logf("wrote %s", path)
}

// header says where and when the table was measured.
func header(t *testing.T, took time.Duration) string {
	root := repoRoot(t)
	commit := strings.TrimSpace(gitOut(root, "rev-parse", "--short", "HEAD"))
	dirty := ""
	if n := len(strings.Fields(gitOut(root, "status", "--porcelain", "--untracked-files=no"))); n > 0 {
		dirty = " plus uncommitted changes in the tree"
	}
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	bin := "migctl built from the tree"
	if b := os.Getenv("MIGCTL_BIN"); b != "" {
		bin = "$MIGCTL_BIN"
	}
	return fmt.Sprintf("Measured %s at commit %s%s (%s); %s, Linux %s, %d CPUs, uid %d; the suite took %s.",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), commit, dirty, bin, runtime.Version(), strings.TrimSpace(string(kernel)),
		runtime.NumCPU(), os.Getuid(), took.Round(time.Second))
}

func gitOut(dir string, args ...string) string {
	out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).Output()
	if err != nil {
		return "unknown"
	}
	return string(out)
}

// repoRoot is the module root (two levels above this package).
func repoRoot(t *testing.T) string {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(filepath.Dir(wd))
}

// result is how one run of the binary ended.
type result struct {
	stdout, stderr string
	code           int // exit code; -1 when killed by a signal
	signal         syscall.Signal
	took           time.Duration
	timedOut       bool
}

func (r result) String() string {
	s := fmt.Sprintf("exit %d", r.code)
	switch {
	case r.timedOut:
		s = "did not end (killed at the limit)"
	case r.signal != 0:
		s = "killed by " + r.signal.String()
	}
	msg := strings.TrimSpace(r.stderr)
	if len(msg) > 200 {
		msg = msg[:200] + "…"
	}
	return fmt.Sprintf("%s after %s: %q", s, r.took.Round(time.Millisecond), msg)
}

// run runs the binary with args, bounded by limit, with extra environment;
// cred, when not nil, runs it as another user.
func (s *suite) run(limit time.Duration, env []string, cred *syscall.Credential, args ...string) result {
	return runCmd(limit, env, cred, s.bin, args...)
}

func runCmd(limit time.Duration, env []string, cred *syscall.Credential, bin string, args ...string) result {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: cred}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String(), took: time.Since(start), timedOut: ctx.Err() != nil}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			r.signal = ws.Signal()
		}
	default:
		r.code, r.stderr = -1, err.Error()
	}
	return r
}

// rejected checks that r is a clean refusal: non-zero exit (not a signal,
// not a timeout) with a message on stderr containing every of want.
func rejected(r result, want ...string) error {
	switch {
	case r.timedOut:
		return fmt.Errorf("did not end: %s", r)
	case r.signal != 0:
		return fmt.Errorf("crashed: %s", r)
	case r.code == 0:
		return fmt.Errorf("accepted (exit 0): %s", strings.TrimSpace(r.stdout+r.stderr))
	case strings.TrimSpace(r.stderr) == "":
		return fmt.Errorf("exit %d without a message", r.code)
	}
	for _, w := range want {
		if !strings.Contains(strings.ToLower(r.stderr), strings.ToLower(w)) {
			return fmt.Errorf("message does not say %q: %s", w, r)
		}
	}
	return nil
}

// tempDir is a short-named temporary directory (Unix socket paths are
// limited to 108 bytes), removed at the end of the test.
func tempDir(t *testing.T, mode os.FileMode) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "mcr")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
	return dir
}
