// Package supervisor starts and watches the worker processes of one job on
// one node: the process part of `migctl run` and `migctl bench`, torchrun's
// local elastic agent without the rendezvous.
//
// Run starts Config.N copies of Config.Command, one per local rank, each:
//   - in its own session and process group (setsid), so signals and kills
//     reach the worker and everything it started, and a terminal's Ctrl-C
//     reaches the workers only through the supervisor;
//   - with Pdeathsig = SIGKILL, so a worker never outlives the supervising
//     process, even when that process is killed with SIGKILL (the kernel
//     sends it when the thread that forked ends: do not call Run from a
//     goroutine locked to an OS thread that exits before the workers);
//   - with its own environment (Config.Env) plus, when Config.ErrorFileEnv is
//     set, the path of its error file (torchrun's TORCHELASTIC_ERROR_FILE);
//   - with its stdout and stderr read line by line: each whole line goes to
//     the console prefixed with the rank ("[3]: ...", one Write per line, so
//     lines of different ranks never interleave mid-line) and, with LogDir,
//     to LogDir/attempt_<generation>/<rank>/{stdout,stderr}.log unprefixed
//     (torchrun's --log-dir layout; Tee picks which streams also go to the
//     console, as torchrun's --tee: without LogDir everything goes there).
//
// # Failure, restart and the time it takes
//
// A generation succeeds when every worker exits 0. The first worker to exit
// otherwise (a non-zero code, or killed by a signal) is the generation's
// root cause, unless Config.Suspect names another rank (the launcher: the
// rank whose death aborted the rendezvous, which made its peers fail at
// once, possibly before its own exit was reaped) and that rank fails
// before the others are signalled: then it is. Then, in order:
//
//  1. Config.OnFailure is called (the launcher aborts the rendezvous, so the
//     other ranks fail at once with the reason instead of at their deadline);
//  2. the other workers get Config.Settle to exit on their own;
//  3. every process group still alive gets SIGTERM followed by SIGCONT (a
//     stopped worker must be able to act on the SIGTERM);
//  4. after Config.Grace, every group still alive gets SIGKILL.
//
// Once every worker has exited, every group gets SIGKILL again, which ends
// anything a worker left running in its group; no process of a generation
// survives it. Up to MaxRestarts times the whole generation is then started
// again (every rank, not just the failed one) after Config.BeforeRestart.
//
// The margin: from the first failure, a generation ends within
// Settle + Grace + the time to reap (milliseconds). A worker that stalls
// (SIGSTOP, a deadlock) is noticed by the other ranks at their collective
// deadline (MIGCTL_TIMEOUT); so a job with a stalled rank ends within
// deadline + Settle + Grace, and Run adds no fixed wait of its own. The
// launcher's defaults are Settle 1 s and Grace 5 s (a 6 s margin).
//
// # Signals
//
// The caller passes a channel of os.Signal (Config.Signals); this package
// never calls signal.Notify. SIGINT, SIGTERM, SIGHUP and SIGQUIT are
// forwarded to every worker's process group and end the run: no restart, the
// workers get Grace to exit, then SIGKILL. While the workers are still
// starting (while processes are being spawned, or while Config.Ready
// says they are not past start-up) such a signal kills them at once. Any other signal
// (SIGUSR1, SIGUSR2, ...) is forwarded and nothing else happens; a worker
// that dies of it is a failure like any other. Cancelling the context acts as
// a SIGTERM.
//
// # Result
//
// Run returns a Result with the number of restarts, one Failure per failed
// generation (the root cause: rank, pid, exit code or signal, and the error
// file's contents when the worker wrote one, as torchrun's error handler
// does), and the last generation's workers. Errors wrap ErrWorkerFailed,
// ErrInterrupted or ErrStart.
package supervisor
