package launcher

import (
	"context"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/comm/rendezvous"
	"github.com/migctl/migctl/internal/supervisor"
)

// The test binary doubles as an SDK-like worker: with envJoinWorker set,
// TestMain runs joinWorker instead of the tests. joinWorker never calls
// Run, so the re-execution cannot recurse.
const envJoinWorker = "LAUNCHER_TEST_WORKER"

func TestMain(m *testing.M) {
	if os.Getenv(envJoinWorker) != "" {
		os.Exit(joinWorker())
	}
	os.Exit(m.Run())
}

// joinWorker ignores SIGINT and SIGTERM; rank 0 joins the rendezvous from
// the launcher's environment (and waits there: rank 1 never joins).
func joinWorker() int {
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM)
	rank, _ := strconv.Atoi(os.Getenv(EnvRank))
	if rank == 0 {
		c, err := rendezvous.Dial(os.Getenv(EnvRdzvAddr), os.Getenv(EnvJobToken))
		if err != nil {
			return 2
		}
		_ = os.WriteFile(filepath.Join(os.Getenv("T_DIR"), "joining"), nil, 0o600)
		_, _ = c.Register(context.Background(), 0, rendezvous.Peer{PID: os.Getpid()})
	}
	time.Sleep(time.Minute)
	return 0
}

// TestInterruptWhileJoining: a Ctrl-C while SDK workers are still joining
// the rendezvous (one connected, the world not formed) kills them at once,
// without the grace period, even though they ignore SIGINT and SIGTERM.
func TestInterruptWhileJoining(t *testing.T) {
	self, err := os.Executable()
	require.NoError(t, err)
	dir := t.TempDir()
	sigs := make(chan os.Signal, 1)
	cfg := Config{Command: []string{self}, NProc: 2, Backend: "host", Grace: 30 * time.Second, Signals: sigs,
		Env: []string{envJoinWorker + "=1", "T_DIR=" + dir}}
	go func() {
		for range 400 {
			if _, err := os.Stat(filepath.Join(dir, "joining")); err == nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(500 * time.Millisecond) // the Register call reaches the server
		sigs <- syscall.SIGINT
	}()
	start := time.Now()
	res, err := Run(context.Background(), cfg)
	require.ErrorIs(t, err, supervisor.ErrInterrupted)
	require.Less(t, time.Since(start), 15*time.Second, "the grace period was applied while the workers were joining")
	require.Equal(t, "SIGINT", res.Interrupted)
	for _, w := range res.Workers {
		require.Equal(t, "SIGKILL", w.Signal)
	}
}
