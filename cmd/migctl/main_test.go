package main

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/migctl/migctl/internal/testutil"
)

// TestMain refuses to run when this test binary is started as migctl, with
// a subcommand instead of -test.* flags: that is a test that ran a launcher
// in-process (it re-executes os.Executable, here the test binary, for every
// rank). Without this guard every "rank" ran the whole test suite again,
// which launched ranks again: a recursive hang instead of a failure. Tests
// that need ranks run the migctl binary (testutil.MigctlBin).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && !strings.HasPrefix(os.Args[1], "-") {
		fmt.Fprintf(os.Stderr, "%s started as 'migctl %s': a test ran a launcher in-process, "+
			"which re-executes the test binary; run the migctl binary instead (testutil.MigctlBin)\n",
			os.Args[0], strings.Join(os.Args[1:min(3, len(os.Args))], " "))
		os.Exit(3)
	}
	testutil.Main(m) // removes the migctl that testutil.MigctlBin built
}
