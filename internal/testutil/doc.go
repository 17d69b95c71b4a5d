// Package testutil holds what several packages' tests share. It is imported
// by _test.go files only.
//
// MigctlBin is the one way a test gets the migctl binary to run as a
// separate process (the bench and run launchers, crash and reliability
// tests): $MIGCTL_BIN when set, as `make test` sets it, else migctl built
// once per test binary into a temporary directory that Main removes when
// the tests end. Main also gives the tests a cache directory of their own
// ($XDG_CACHE_HOME), so that no test reads or writes the user's cached
// figures of the machine, and removes what RemoveAtEnd registered (what the
// tests of one binary share, such as a library built once). A package that
// calls MigctlBin or RemoveAtEnd runs its tests through Main:
//
//	func TestMain(m *testing.M) { testutil.Main(m) }
package testutil
