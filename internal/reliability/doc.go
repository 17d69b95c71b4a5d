// Package reliability is the fault-injection suite behind docs/reliability.md:
// `go test -run Reliability ./internal/reliability` drives the real migctl
// binary ($MIGCTL_BIN, or one built into a temporary directory) and the real
// daemon through each fault class (hostile shim messages, a refused uid, bad
// input per command, a crash in the middle of a partition apply, a rank killed
// or stopped during a bench), several trials each, and asserts the outcomes.
// With MIGCTL_WRITE_RELIABILITY=1 it records every row instead of failing on
// it and writes the table (fault class, trials, outcome, worst time) to
// docs/reliability.md, failures shown as failures.
//
// The package's code is the table (Row, Markdown); the suite is its test.
package reliability
