package benchrank

import (
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/allreduce"
	"github.com/migctl/migctl/comm/rendezvous"
	"github.com/migctl/migctl/trainer"
)

// sweepCase is a sweep checked on in-process ranks.
type sweepCase struct {
	desc    string
	coll    string
	dtype   string
	op      string
	min     int64
	inPlace bool
	rows    int
}

// checkSweep runs c's sweep up to 8 KiB on three ranks that are goroutines
// (host backend), results checked: rank 0 gets one row per size, every
// element right; the other ranks get nil.
func checkSweep(t *testing.T, c sweepCase) {
	t.Helper()
	const n = 3
	cfg := Config{Coll: c.coll, NP: n, Backend: "host", Transport: "auto", Algorithm: "auto",
		DType: c.dtype, Op: c.op, MinBytes: c.min, MaxBytes: 8 << 10, Factor: 4, Iters: 2, Warmup: 1,
		Check: true, InPlace: c.inPlace, Timeout: 20 * time.Second, Chunk: 64 << 10, Slots: 4, Depth: 2,
		Small: 1 << 10, ShmRoot: t.TempDir(), Job: "benchrank-test"}
	if c.coll == "broadcast" {
		cfg.Root = 2
	}
	coll, err := allreduce.ParseColl(cfg.Coll)
	require.NoError(t, err)
	dt, err := ParseDType(cfg.DType)
	require.NoError(t, err)
	op, err := ParseOp(cfg.Op)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var mu sync.Mutex
	reports := map[int]*Report{}
	err = trainer.RunLocal(ctx, n, func(g *trainer.Group) error {
		rep, err := run(ctx, g, cfg, coll, dt, op, io.Discard)
		mu.Lock()
		reports[g.Rank()] = rep
		mu.Unlock()
		return err
	}, groupOptions(cfg, 0, io.Discard)...)
	require.NoError(t, err)
	require.Nil(t, reports[1])
	require.Nil(t, reports[2])
	rep := reports[0]
	require.NotNil(t, rep)
	require.Equal(t, n, rep.NP)
	require.Equal(t, "host", rep.Backend)
	require.Len(t, rep.Rows, c.rows)
	for i, row := range rep.Rows {
		require.Zero(t, row.Wrong, "row %d (%d bytes)", i, row.Bytes)
		require.Positive(t, row.TimeUS, "row %d", i)
		require.Equal(t, row.Count*int64(dt.Size()), row.Bytes, "row %d", i)
	}
}

// TestRunChecksEveryCollective: every collective out of place (in place:
// run_inplace_norace_test.go).
func TestRunChecksEveryCollective(t *testing.T) {
	tests := []sweepCase{
		{"all-reduce", "allreduce", "float", "sum", 8, false, 6},
		{"all-reduce, bfloat16 max", "allreduce", "bfloat16", "max", 8, false, 6},
		{"reduce-scatter", "reducescatter", "double", "avg", 24, false, 5},
		{"all-gather", "allgather", "uint8", "sum", 8, false, 6},
		{"broadcast from rank 2", "broadcast", "half", "sum", 8, false, 6},
		{"barrier", "barrier", "float", "sum", 8, false, 1},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) { checkSweep(t, tc) })
	}
}

// TestRunRefusesBadConfig: a config that names no collective, type or
// reduction fails before joining any group.
func TestRunRefusesBadConfig(t *testing.T) {
	tests := []struct {
		desc string
		cfg  Config
		want string
	}{
		{"collective", Config{Coll: "alltoall", DType: "float", Op: "sum"}, "alltoall"},
		{"dtype", Config{Coll: "allreduce", DType: "complex", Op: "sum"}, "--dtype"},
		{"op", Config{Coll: "allreduce", DType: "float", Op: "prod"}, "--op"},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			rep, err := Run(context.Background(), tc.cfg, Join{Addr: "unix:///nonexistent", Rank: -1}, io.Discard)
			require.ErrorContains(t, err, tc.want)
			require.Nil(t, rep)
		})
	}
}

// A sweep that lasts longer than the collectives' deadline plus the join's
// slack still merges its results: the merge's deadline starts when the sweep
// ends (it used to run under the join's deadline, so `migctl bench` failed at
// the end of any sweep over ~70 s with "putting bench/result/0: context
// deadline exceeded"). Two ranks through Run and a real rendezvous server,
// whose store calls honour their deadlines.
func TestRunLongSweepMerges(t *testing.T) {
	saved := slack
	slack = 50 * time.Millisecond
	defer func() { slack = saved }()
	const n, token = 2, "0123456789abcdef0123456789abcdef"
	dir := t.TempDir()
	cfg := Config{Coll: "allreduce", NP: n, Backend: "host", Transport: "auto", Algorithm: "auto",
		DType: "float", Op: "sum", MinBytes: 8, MaxBytes: 8, Factor: 2, Iters: 1, Warmup: 0,
		Check: true, Timeout: 2 * time.Second, Chunk: 64 << 10, Slots: 4, Depth: 2,
		Small: 1 << 10, ShmRoot: dir, Job: "benchrank-long"}
	// iterations enough to outlast Timeout+slack: about 4 s on a 2-core box
	// (the host backend's 8-byte all-reduce between two goroutines: ~20 us)
	cfg.Iters = 200000
	srv, err := rendezvous.NewServer(token, n)
	require.NoError(t, err)
	lis, err := net.Listen("unix", filepath.Join(dir, "rdzv.sock"))
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	var wg sync.WaitGroup
	reps := make([]*Report, n)
	errs := make([]error, n)
	start := time.Now()
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reps[r], errs[r] = Run(context.Background(), cfg, Join{Addr: "unix://" + filepath.Join(dir, "rdzv.sock"),
				Token: token, Rank: r}, io.Discard)
		}()
	}
	wg.Wait()
	el := time.Since(start)
	require.NoError(t, errors.Join(errs...), "a %v sweep", el)
	if el < cfg.Timeout+slack {
		t.Skipf("the sweep took %v, not longer than the deadline %v: nothing shown", el, cfg.Timeout+slack)
	}
	require.NotNil(t, reps[0])
	require.Nil(t, reps[1])
	require.Len(t, reps[0].Rows, 1)
	require.Zero(t, reps[0].Rows[0].Wrong)
}
