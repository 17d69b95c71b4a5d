package testutil_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/internal/testutil"
)

func TestMain(m *testing.M) {
	// the child run of TestMigctlBinBuildsOnceAndMainRemovesIt reports the
	// directory MigctlBin built into, then Main removes it
	if os.Getenv("TESTUTIL_CHILD") == "1" {
		testutil.Main(m)
	}
	os.Exit(m.Run())
}

// TestChildBuild is the child's whole run: two calls build once, a bench
// run (which caches the machine's figures) writes them into the tests' own
// cache directory, not the one the child was started with, and a directory
// is left to RemoveAtEnd.
func TestChildBuild(t *testing.T) {
	if os.Getenv("TESTUTIL_CHILD") != "1" {
		t.Skip("run by TestMigctlBinBuildsOnceAndMainRemovesIt")
	}
	a := testutil.MigctlBin(t)
	b := testutil.MigctlBin(t)
	require.Equal(t, a, b, "built once")
	out, err := exec.Command(a, "--help").CombinedOutput()
	require.NoError(t, err, "%s", out)
	cache := os.Getenv(testutil.EnvCacheHome)
	require.NotEmpty(t, cache)
	require.NotEqual(t, os.Getenv("TESTUTIL_USER_CACHE"), cache, "Main keeps the user's cache directory")
	out, err = exec.Command(a, "bench", "allreduce", "--np", "1", "--backend", "host", "-b", "4KiB", "-e", "4KiB",
		"-n", "2", "-w", "1", "-o", "json").CombinedOutput()
	require.NoError(t, err, "%s", out)
	_, err = os.Stat(filepath.Join(cache, "migctl", "limits.json"))
	require.NoError(t, err, "bench cached no figures in the tests' cache directory: %s", out)
	shared, err := os.MkdirTemp("", "testutil-shared-")
	require.NoError(t, err)
	testutil.RemoveAtEnd(t, shared)
	require.NoError(t, os.WriteFile(os.Getenv("TESTUTIL_REPORT"), []byte(a+"\n"+cache+"\n"+shared), 0o600))
}

// TestMigctlBinBuildsOnceAndMainRemovesIt runs this test binary again with
// $MIGCTL_BIN unset: the child builds migctl once, runs it, and the build is
// gone once the child has exited.
func TestMigctlBinBuildsOnceAndMainRemovesIt(t *testing.T) {
	if testing.Short() {
		t.Skip("builds migctl")
	}
	report := filepath.Join(t.TempDir(), "bin")
	self, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(self, "-test.run", "^TestChildBuild$", "-test.count", "1")
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, testutil.EnvMigctlBin+"=") {
			env = append(env, kv)
		}
	}
	user := t.TempDir() // the cache directory the child's user has
	cmd.Env = append(env, "TESTUTIL_CHILD=1", "TESTUTIL_REPORT="+report, testutil.EnvCacheHome+"="+user,
		"TESTUTIL_USER_CACHE="+user)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	got, err := os.ReadFile(report)
	require.NoError(t, err, "the child reported no binary: %s", out)
	lines := strings.Split(string(got), "\n")
	require.Len(t, lines, 3, "the child's report: %q", got)
	bin, cache, shared := lines[0], lines[1], lines[2]
	require.NotEmpty(t, bin)
	_, err = os.Stat(shared)
	require.True(t, os.IsNotExist(err), "Main left %s (RemoveAtEnd) behind", shared)
	_, err = os.Stat(filepath.Dir(bin))
	require.True(t, os.IsNotExist(err), "Main left %s behind", filepath.Dir(bin))
	_, err = os.Stat(cache)
	require.True(t, os.IsNotExist(err), "Main left the tests' cache %s behind", cache)
	entries, err := os.ReadDir(user)
	require.NoError(t, err)
	require.Empty(t, entries, "the tests wrote into the user's cache directory")
}

// TestMigctlBinPrefersTheEnvironment: $MIGCTL_BIN is used as given.
func TestMigctlBinPrefersTheEnvironment(t *testing.T) {
	t.Setenv(testutil.EnvMigctlBin, "/opt/migctl/bin/migctl")
	require.Equal(t, "/opt/migctl/bin/migctl", testutil.MigctlBin(t))
}
