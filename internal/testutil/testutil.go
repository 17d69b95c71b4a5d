package testutil

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

// EnvMigctlBin names a prebuilt migctl binary for the tests (make test sets
// it to bin/migctl).
const EnvMigctlBin = "MIGCTL_BIN"

var (
	mu       sync.Mutex
	mainRan  bool     // Main is running the tests
	buildDir string   // what MigctlBin built, removed by Main
	atEnd    []string // what RemoveAtEnd registered, removed by Main
	built    string
	buildErr error
)

// EnvCacheHome is where migctl keeps its cache ($XDG_CACHE_HOME/migctl:
// `migctl bench limits`' figures, which every `migctl bench` also writes and
// `migctl run` reads).
const EnvCacheHome = "XDG_CACHE_HOME"

// EnvStateHome is where migctl keeps a simulated node's default state
// ($XDG_STATE_HOME/migctl/sim-NAME.json, for --sim without --sim-state) and
// the lease lock beside it.
const EnvStateHome = "XDG_STATE_HOME"

// Main runs the tests with cache and state directories of their own, removes them and
// what MigctlBin built, and exits with the tests' status. Call it from
// TestMain (it does not return). The tests' migctl, in process or run as a
// binary, then never reads the user's cached figures of the machine nor
// leaves its own there: figures taken on a test's fake GPU or on CPUs busy
// with other tests would otherwise become the LIMIT columns and the
// collectives' cost model of the user's later runs. Nor does a test's
// `--sim` without --sim-state reshape the user's default simulated node, or
// find it leased by the user's own `migctl daemon --sim`.
func Main(m *testing.M) {
	cache, err := os.MkdirTemp("", "migctl-testcache-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "testutil: a cache directory for the tests: %v\n", err)
		os.Exit(1)
	}
	if err := os.Setenv(EnvCacheHome, cache); err != nil {
		fmt.Fprintf(os.Stderr, "testutil: setting $%s: %v\n", EnvCacheHome, err)
		os.Exit(1)
	}
	if err := os.Setenv(EnvStateHome, filepath.Join(cache, "state")); err != nil {
		fmt.Fprintf(os.Stderr, "testutil: setting $%s: %v\n", EnvStateHome, err)
		os.Exit(1)
	}
	mu.Lock()
	mainRan = true
	mu.Unlock()
	code := m.Run()
	mu.Lock()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	for _, dir := range atEnd {
		_ = os.RemoveAll(dir)
	}
	mu.Unlock()
	_ = os.RemoveAll(cache)
	os.Exit(code)
}

// RemoveAtEnd has Main remove dir when the tests end: what several tests of
// one binary share (a library built once for all of them), which
// t.TempDir would remove with the first. Without Main it fails t.
func RemoveAtEnd(t testing.TB, dir string) {
	t.Helper()
	mu.Lock()
	defer mu.Unlock()
	if !mainRan {
		t.Fatalf("testutil.RemoveAtEnd(%s) needs testutil.Main in the package's TestMain, which removes it", dir)
	}
	atEnd = append(atEnd, dir)
}

// MigctlBin returns the path of the migctl binary: $MIGCTL_BIN when set,
// else migctl built on first use (once per test binary, the later calls
// wait for it) into a temporary directory that Main removes. Without Main
// in the package's TestMain it fails t instead of leaving the ~25 MB binary
// behind. Safe for concurrent use.
func MigctlBin(t testing.TB) string {
	t.Helper()
	if b := os.Getenv(EnvMigctlBin); b != "" {
		return b
	}
	mu.Lock()
	defer mu.Unlock()
	if !mainRan {
		t.Fatalf("testutil.MigctlBin builds migctl only under testutil.Main (add func TestMain(m *testing.M) { testutil.Main(m) }), so that the build is removed; or set $%s", EnvMigctlBin)
	}
	if built == "" && buildErr == nil {
		built, buildErr = build()
	}
	if buildErr != nil {
		t.Fatalf("building migctl: %v", buildErr)
	}
	return built
}

// build runs go build for ./cmd/migctl of this module into a new
// temporary directory (recorded in buildDir before the build, so that Main
// removes it even when the build fails half-way).
func build() (string, error) {
	dir, err := os.MkdirTemp("", "migctl-testbin-")
	if err != nil {
		return "", err
	}
	buildDir = dir
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if p, err := exec.LookPath("go"); err == nil {
		goBin = p
	}
	bin := filepath.Join(dir, "migctl")
	// by import path: the test's working directory is its package's,
	// inside this module
	out, err := exec.Command(goBin, "build", "-o", bin, "github.com/migctl/migctl/cmd/migctl").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%w\n%s", err, out)
	}
	return bin, nil
}

// LockedBuffer is a bytes.Buffer that a running process's copying
// goroutine may write while the test reads it. The zero value is ready.
type LockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (l *LockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String is what was written so far.
func (l *LockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// FakeMPSControl is the absolute path of the stand-in for
// nvidia-cuda-mps-control (internal/mps/testdata/fake-mps-control) that the
// MPS tests of every package run.
func FakeMPSControl(t testing.TB) string {
	t.Helper()
	_, self, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("testutil: no caller information for the fake MPS control program")
	}
	p := filepath.Join(filepath.Dir(self), "..", "mps", "testdata", "fake-mps-control")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("testutil: the fake MPS control program: %v", err)
	}
	return filepath.Clean(p)
}
