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

// TestChildBuild is the child's whole run: two calls build once.
func TestChildBuild(t *testing.T) {
	if os.Getenv("TESTUTIL_CHILD") != "1" {
		t.Skip("run by TestMigctlBinBuildsOnceAndMainRemovesIt")
	}
	a := testutil.MigctlBin(t)
	b := testutil.MigctlBin(t)
	require.Equal(t, a, b, "built once")
	out, err := exec.Command(a, "--help").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.NoError(t, os.WriteFile(os.Getenv("TESTUTIL_REPORT"), []byte(a), 0o600))
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
	cmd.Env = append(env, "TESTUTIL_CHILD=1", "TESTUTIL_REPORT="+report)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	bin, err := os.ReadFile(report)
	require.NoError(t, err, "the child reported no binary: %s", out)
	require.NotEmpty(t, bin)
	_, err = os.Stat(filepath.Dir(string(bin)))
	require.True(t, os.IsNotExist(err), "Main left %s behind", filepath.Dir(string(bin)))
}

// TestMigctlBinPrefersTheEnvironment: $MIGCTL_BIN is used as given.
func TestMigctlBinPrefersTheEnvironment(t *testing.T) {
	t.Setenv(testutil.EnvMigctlBin, "/opt/migctl/bin/migctl")
	require.Equal(t, "/opt/migctl/bin/migctl", testutil.MigctlBin(t))
}
