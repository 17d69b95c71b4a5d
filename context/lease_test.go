package ctxmgr_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/stretchr/testify/require"

	ctxmgr "github.com/migctl/migctl/context"
	"github.com/migctl/migctl/mig"
	"github.com/migctl/migctl/mig/migsim"
)

// simNode returns a simulated H200 node of n GPUs, each partitioned as req
// (MIG left off when req is nil), and a journalled mig.Manager over it.
func simNode(t *testing.T, n int, req *mig.Request) (*migsim.Node, *mig.Manager) {
	t.Helper()
	node := migsim.New(migsim.H200, n)
	mm := mig.NewManager(node, mig.WithJournal(filepath.Join(t.TempDir(), "journal")))
	if req != nil {
		reqs := map[int]mig.Request{}
		for i := 0; i < n; i++ {
			reqs[i] = *req
		}
		_, err := mm.Apply(context.Background(), reqs, mig.ApplyOptions{})
		require.NoError(t, err)
	}
	return node, mm
}

func layoutReq(s string) *mig.Request {
	r, err := mig.ParseLayout(s)
	if err != nil {
		panic(err)
	}
	return &r
}

// layouts is the node's layout, one string per GPU ("-" for MIG off).
func layouts(t *testing.T, src ctxmgr.MIGSource) []string {
	t.Helper()
	node, err := src.Discover(context.Background())
	require.NoError(t, err)
	var out []string
	for _, g := range node.GPUs {
		if !g.MIGEnabled {
			out = append(out, "-")
			continue
		}
		out = append(out, g.Layout().String())
	}
	return out
}

// counts is, per GPU, how many MIG devices of each profile it has
// ("1g.18gb×4, 3g.71gb×1"; "-" for MIG off): what a test asserts instead of
// the planner's placements.
func counts(t *testing.T, src ctxmgr.MIGSource) []string {
	t.Helper()
	node, err := src.Discover(context.Background())
	require.NoError(t, err)
	var out []string
	for _, g := range node.GPUs {
		if !g.MIGEnabled {
			out = append(out, "-")
			continue
		}
		n := map[string]int{}
		for _, in := range g.Instances {
			for _, c := range in.Compute {
				n[c.Profile]++
			}
		}
		var parts []string
		for _, p := range slices.Sorted(maps.Keys(n)) {
			parts = append(parts, fmt.Sprintf("%s×%d", p, n[p]))
		}
		out = append(out, strings.Join(parts, ", "))
	}
	return out
}

// devices maps every MIG device UUID on the node to "gpu/gi/ci".
func devices(t *testing.T, src ctxmgr.MIGSource) map[string]string {
	t.Helper()
	node, err := src.Discover(context.Background())
	require.NoError(t, err)
	out := map[string]string{}
	for _, d := range node.MIGDevices() {
		out[d.UUID] = fmt.Sprintf("%d/%d/%d", d.GPU, d.GIID, d.CIID)
	}
	return out
}

func acq(job, profile string, count int) ctxmgr.AcquireRequest {
	return ctxmgr.AcquireRequest{Job: job, Profile: profile, Count: count, GPU: -1}
}

func TestLeaseAcquireRelease(t *testing.T) {
	ctx := context.Background()
	_, mm := simNode(t, 2, layoutReq("3g.71gb=2"))
	l := ctxmgr.NewLeases(mm, ctxmgr.LeaseOptions{})

	var got []ctxmgr.Lease
	for _, job := range []string{"a", "b", "c", "d"} {
		ls, err := l.Acquire(ctx, acq(job, "3g.71gb", 1))
		require.NoError(t, err)
		require.Len(t, ls, 1)
		require.Regexp(t, `^MIG-`, ls[0].UUID)
		require.False(t, ls[0].Created, "an existing instance was free")
		got = append(got, ls[0])
	}
	// lowest GPU first, then lowest placement
	require.Equal(t, []int{0, 0, 1, 1}, []int{got[0].GPU, got[1].GPU, got[2].GPU, got[3].GPU})
	require.Equal(t, []int{0, 4, 0, 4}, []int{got[0].Placement.Start, got[1].Placement.Start, got[2].Placement.Start, got[3].Placement.Start})
	uuids := map[string]bool{}
	for _, le := range got {
		uuids[le.UUID] = true
	}
	require.Len(t, uuids, 4, "every lease is a different MIG device")

	before := layouts(t, mm)
	for _, profile := range []string{"3g.71gb", "1g.18gb"} {
		_, err := l.Acquire(ctx, acq("e", profile, 1))
		require.ErrorIs(t, err, ctxmgr.ErrNoFreeInstance, profile)
		require.ErrorContains(t, err, "leased by job a")
	}
	require.Equal(t, before, layouts(t, mm), "a refusal changes nothing")

	rel := l.Release("b")
	require.Len(t, rel, 1)
	require.Equal(t, got[1].UUID, rel[0].UUID)
	require.Empty(t, l.Release("b"), "releasing twice finds nothing")
	ls, err := l.Acquire(ctx, ctxmgr.AcquireRequest{Job: "e", Profile: "3g.71gb", GPU: 0})
	require.NoError(t, err)
	require.Equal(t, got[1].UUID, ls[0].UUID, "the released instance is leased again")
	require.Len(t, l.List(), 4)

	_, err = l.ReleaseUUID("MIG-nope")
	require.ErrorIs(t, err, ctxmgr.ErrNoLease)
	_, err = l.ReleaseUUID(ls[0].UUID)
	require.NoError(t, err)
	require.Len(t, l.List(), 3)
}

func TestLeaseBadRequests(t *testing.T) {
	_, mm := simNode(t, 1, layoutReq("1g.18gb=7"))
	l := ctxmgr.NewLeases(mm, ctxmgr.LeaseOptions{})
	dead := exec.Command("true")
	require.NoError(t, dead.Run())
	tests := []struct {
		desc string
		req  ctxmgr.AcquireRequest
		want error
		msg  string
	}{
		{"empty job", acq("", "1g.18gb", 1), ctxmgr.ErrBadRequest, "job name"},
		{"negative count", acq("j", "1g.18gb", -2), ctxmgr.ErrBadRequest, "count -2"},
		{"malformed profile", acq("j", "1gig", 1), mig.ErrUnknownProfile, "1gig"},
		{"profile the GPU lacks", acq("j", "5g.99gb", 1), mig.ErrUnknownProfile, "partition profiles"},
		{"GPU out of range", ctxmgr.AcquireRequest{Job: "j", Profile: "1g.18gb", GPU: 3}, ctxmgr.ErrBadRequest, "GPU 3 out of range"},
		{"dead pid", ctxmgr.AcquireRequest{Job: "j", Profile: "1g.18gb", GPU: -1, PID: dead.Process.Pid}, ctxmgr.ErrBadRequest, "is not running"},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			_, err := l.Acquire(context.Background(), tc.req)
			require.ErrorIs(t, err, tc.want)
			require.ErrorContains(t, err, tc.msg)
			require.Empty(t, l.List())
		})
	}
}

func TestAcquireCreates(t *testing.T) {
	tests := []struct {
		desc      string
		gpus      int
		layout    *mig.Request
		enableMIG bool
		busy      bool // a process on GPU 0's first instance
		held      []ctxmgr.AcquireRequest
		req       ctxmgr.AcquireRequest
		created   int
		wantErr   string
		counts    []string
	}{
		{desc: "7 × 1g.18gb from nothing on an empty H200", gpus: 1, enableMIG: true,
			req: acq("b", "1g.18gb", 7), created: 7, counts: []string{"1g.18gb×7"}},
		{desc: "MIG left off without EnableMIG", gpus: 1,
			req: acq("b", "1g.18gb", 1), wantErr: "GPU 0: MIG is off and the daemon may not turn it on (start it with --enable-mig", counts: []string{"-"}},
		{desc: "room beside a lease is used before turning MIG on elsewhere", gpus: 2, enableMIG: true,
			held: []ctxmgr.AcquireRequest{acq("a", "3g.71gb", 1)},
			req:  acq("b", "1g.18gb", 4), created: 4, counts: []string{"1g.18gb×4, 3g.71gb×1", "-"}},
		{desc: "spills over to a second GPU, turning MIG on there", gpus: 2, enableMIG: true,
			held: []ctxmgr.AcquireRequest{acq("a", "3g.71gb", 1)},
			req:  acq("b", "2g.35gb", 3), created: 3, counts: []string{"2g.35gb×2, 3g.71gb×1", "2g.35gb×1"}},
		{desc: "unleased idle instances are reshaped, leased ones kept", gpus: 1, layout: layoutReq("3g.71gb=1,2g.35gb=1,1g.18gb=1"),
			held: []ctxmgr.AcquireRequest{acq("a", "3g.71gb", 1)},
			req:  acq("b", "1g.18gb", 4), created: 3, counts: []string{"1g.18gb×4, 3g.71gb×1"}},
		{desc: "all or nothing: 5 do not fit beside a lease, nothing is created", gpus: 1, enableMIG: true,
			held: []ctxmgr.AcquireRequest{acq("a", "3g.71gb", 1)},
			req:  acq("b", "1g.18gb", 5), wantErr: "cannot lease 5 × 1g.18gb for job b", counts: []string{"3g.71gb×1"}},
		{desc: "more than a GPU can ever hold", gpus: 1, enableMIG: true,
			req: acq("b", "3g.71gb", 3), wantErr: "can never hold more than 2 × 3g.71gb", counts: []string{"-"}},
		{desc: "a busy unleased instance is not destroyed", gpus: 1, layout: layoutReq("7g.141gb=1"), busy: true,
			req: acq("b", "1g.18gb", 1), wantErr: "processes [4242] run on it", counts: []string{"7g.141gb×1"}},
		{desc: "compute instances of a shared GPU instance", gpus: 1, enableMIG: true,
			held: []ctxmgr.AcquireRequest{acq("a", "1c.2g.35gb", 1)},
			req:  acq("b", "1c.2g.35gb", 3), created: 3, counts: []string{"1c.2g.35gb×4"}},
		{desc: "an idle unleased 7g is split", gpus: 1, layout: layoutReq("7g.141gb=1"),
			req: acq("b", "3g.71gb", 2), created: 2, counts: []string{"3g.71gb×2"}},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			ctx := context.Background()
			node, mm := simNode(t, tc.gpus, tc.layout)
			if tc.busy {
				require.NoError(t, node.AttachProcess(0, 0, 0, 4242, 1<<30))
			}
			l := ctxmgr.NewLeases(mm, ctxmgr.LeaseOptions{EnableMIG: tc.enableMIG})
			var heldUUIDs []string
			for _, h := range tc.held {
				ls, err := l.Acquire(ctx, h)
				require.NoError(t, err)
				for _, le := range ls {
					heldUUIDs = append(heldUUIDs, le.UUID)
				}
			}
			before := devices(t, mm)
			ls, err := l.Acquire(ctx, tc.req)
			after := devices(t, mm)
			for _, u := range heldUUIDs {
				require.Equal(t, before[u], after[u], "leased %s is untouched", u)
			}
			require.Equal(t, tc.counts, counts(t, mm))
			if tc.wantErr != "" {
				require.ErrorIs(t, err, ctxmgr.ErrNoFreeInstance)
				require.ErrorContains(t, err, tc.wantErr)
				require.Len(t, l.List(), len(heldUUIDs), "nothing more is leased")
				return
			}
			require.NoError(t, err)
			require.Len(t, ls, tc.req.Count)
			n := 0
			seen := map[string]bool{}
			for _, le := range ls {
				require.Equal(t, tc.req.Profile, le.Profile)
				require.Contains(t, after, le.UUID, "a lease names a MIG device that exists")
				require.False(t, seen[le.UUID])
				seen[le.UUID] = true
				if le.Created {
					n++
					require.NotContains(t, before, le.UUID)
				}
			}
			require.Equal(t, tc.created, n)
		})
	}
}

func TestRefusalNamesWhatIsLeased(t *testing.T) {
	ctx := context.Background()
	self := os.Getpid()
	_, mm := simNode(t, 1, nil)
	l := ctxmgr.NewLeases(mm, ctxmgr.LeaseOptions{EnableMIG: true})
	_, err := l.Acquire(ctx, ctxmgr.AcquireRequest{Job: "alpha", Profile: "1g.18gb", Count: 7, GPU: -1, PID: self})
	require.NoError(t, err)

	_, err = l.Acquire(ctx, acq("beta", "2g.35gb", 1))
	var re *ctxmgr.RefusalError
	require.ErrorAs(t, err, &re)
	require.Equal(t, 0, re.Free)
	require.Equal(t, 0, re.Creatable)
	require.Equal(t, 1, re.Max)
	require.Len(t, re.InTheWay, 7)
	for _, o := range re.InTheWay {
		require.Equal(t, "alpha", o.Job)
		require.Equal(t, self, o.PID)
	}
	require.ErrorContains(t, err, fmt.Sprintf("leased by job alpha (pid %d)", self))
	require.ErrorContains(t, err, "'migctl lease release --job alpha'")

	l.Release("alpha")
	ls, err := l.Acquire(ctx, acq("beta", "2g.35gb", 1))
	require.NoError(t, err, "once alpha released, its idle instances are reshaped for beta")
	require.True(t, ls[0].Created)
}

// TestAcquireUnderFaults makes every mutating NVML call of an Acquire that
// must create instances fail in turn, before or after it takes effect: the
// leased instance survives every time, and a failed Acquire leaves nothing
// leased and every GPU as it was (a GPU changed before the failing one is
// converged back).
func TestAcquireUnderFaults(t *testing.T) {
	ctx := context.Background()
	scenarios := []struct {
		desc   string
		gpus   int
		layout string // GPU 0's; the others keep MIG off
		keep   ctxmgr.AcquireRequest
		req    ctxmgr.AcquireRequest
	}{
		{"reshaping unleased instances beside a lease", 1, "3g.71gb=1,2g.35gb=1,1g.18gb=1", acq("keeper", "3g.71gb", 1), acq("b", "1g.18gb", 4)},
		{"two GPUs: room beside a lease, then MIG turned on", 2, "3g.71gb=1", acq("keeper", "3g.71gb", 1), acq("b", "1g.18gb", 6)},
	}
	for _, sc := range scenarios {
		setup := func(t *testing.T, fault migsim.Fault) (*ctxmgr.Leases, *mig.Manager, ctxmgr.Lease) {
			node := migsim.New(migsim.H200, sc.gpus)
			_, err := mig.NewManager(node).Apply(ctx, map[int]mig.Request{0: *layoutReq(sc.layout)}, mig.ApplyOptions{})
			require.NoError(t, err)
			mm := mig.NewManager(migsim.Faulty(node, fault), mig.WithJournal(filepath.Join(t.TempDir(), "journal")))
			l := ctxmgr.NewLeases(mm, ctxmgr.LeaseOptions{EnableMIG: true})
			ls, err := l.Acquire(ctx, sc.keep)
			require.NoError(t, err)
			require.False(t, ls[0].Created)
			return l, mm, ls[0]
		}
		t.Run(sc.desc, func(t *testing.T) {
			// a clean run counts the mutating calls
			calls := 0
			l, mm, kept := setup(t, func(migsim.Call) (nvml.Return, migsim.When) { calls++; return nvml.SUCCESS, migsim.Before })
			_, err := l.Acquire(ctx, sc.req)
			require.NoError(t, err)
			require.Contains(t, devices(t, mm), kept.UUID)
			require.GreaterOrEqual(t, calls, 5, "instances are created (and destroyed)")

			for k := 1; k <= calls; k++ {
				for _, when := range []migsim.When{migsim.Before, migsim.After} {
					t.Run(fmt.Sprintf("call %d fails %s", k, map[migsim.When]string{migsim.Before: "before", migsim.After: "after"}[when]), func(t *testing.T) {
						l, mm, kept := setup(t, func(c migsim.Call) (nvml.Return, migsim.When) {
							if c.Seq == k {
								return nvml.ERROR_UNKNOWN, when
							}
							return nvml.SUCCESS, when
						})
						before, layoutBefore := devices(t, mm), layouts(t, mm)
						_, err := l.Acquire(ctx, sc.req)
						require.Error(t, err, "call %d fails", k)
						after := devices(t, mm)
						require.Equal(t, before[kept.UUID], after[kept.UUID], "the leased instance survives, same GPU/GI/CI")
						require.Equal(t, []ctxmgr.Lease{kept}, l.List(), "nothing more is leased")
						require.Equal(t, layoutBefore, layouts(t, mm), "every GPU is as it was")
					})
				}
			}
		})
	}
}

func TestLeaseReapOnExit(t *testing.T) {
	ctx := context.Background()
	_, mm := simNode(t, 1, layoutReq("1g.18gb=3"))
	starts := map[int]uint64{100: 1, 101: 1}
	l := ctxmgr.NewLeases(mm, ctxmgr.LeaseOptions{ProcStart: func(pid int) (uint64, error) {
		if s, ok := starts[pid]; ok {
			return s, nil
		}
		return 0, os.ErrNotExist
	}})
	for _, r := range []ctxmgr.AcquireRequest{{Job: "w", PID: 100}, {Job: "w", PID: 101}, {Job: "svc"}} {
		r.Profile, r.GPU = "1g.18gb", -1
		_, err := l.Acquire(ctx, r)
		require.NoError(t, err)
	}
	require.Empty(t, l.Reap(), "everyone alive")
	delete(starts, 100)
	reaped := l.Reap()
	require.Len(t, reaped, 1)
	require.Equal(t, 100, reaped[0].PID)
	starts[101] = 2 // pid 101 now names another process
	reaped = l.Reap()
	require.Len(t, reaped, 1, "a reused pid is not the leasing process")
	require.Equal(t, 101, reaped[0].PID)
	require.Len(t, l.List(), 1)
	require.Equal(t, "svc", l.List()[0].Job, "job-level leases are not reaped")
}

func TestLeaseStateSurvivesRestart(t *testing.T) {
	ctx := context.Background()
	_, mm := simNode(t, 1, nil)
	state := filepath.Join(t.TempDir(), "state", "leases.json")
	live := exec.Command("sleep", "60")
	require.NoError(t, live.Start())
	t.Cleanup(func() { live.Process.Kill(); live.Wait() })
	dying := exec.Command("sleep", "60")
	require.NoError(t, dying.Start())

	l := ctxmgr.NewLeases(mm, ctxmgr.LeaseOptions{StatePath: state, EnableMIG: true})
	live1, err := l.Acquire(ctx, ctxmgr.AcquireRequest{Job: "live", Profile: "1g.18gb", Count: 2, GPU: -1, PID: live.Process.Pid})
	require.NoError(t, err)
	_, err = l.Acquire(ctx, ctxmgr.AcquireRequest{Job: "dies", Profile: "1g.18gb", Count: 2, GPU: -1, PID: dying.Process.Pid})
	require.NoError(t, err)
	svc, err := l.Acquire(ctx, acq("svc", "1g.18gb", 1))
	require.NoError(t, err)
	gone, err := l.Acquire(ctx, acq("gone", "1g.18gb", 1))
	require.NoError(t, err)

	var st map[string]any
	data, err := os.ReadFile(state)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &st))
	require.Len(t, st["leases"], 6, "every lease is in the state file")
	fi, err := os.Stat(filepath.Dir(state))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), fi.Mode().Perm())

	// while the daemon is down: a process dies, a device is destroyed
	require.NoError(t, dying.Process.Kill())
	_, _ = dying.Process.Wait()
	node, err := mm.Discover(ctx)
	require.NoError(t, err)
	var keep mig.Request
	keep.MIGEnabled = true
	for _, in := range node.GPUs[0].Instances {
		if in.Compute[0].UUID != gone[0].UUID {
			keep.Devices = append(keep.Devices, mig.DeviceRequest{Profile: in.Profile, Count: 1, Starts: []int{in.Placement.Start}})
		}
	}
	_, err = mm.Apply(ctx, map[int]mig.Request{0: keep}, mig.ApplyOptions{})
	require.NoError(t, err)

	var events []ctxmgr.Event
	l2 := ctxmgr.NewLeases(mm, ctxmgr.LeaseOptions{StatePath: state, OnEvent: func(e ctxmgr.Event) { events = append(events, e) }})
	kept, dropped, err := l2.Restore(ctx)
	require.NoError(t, err)
	require.Equal(t, append(append([]ctxmgr.Lease{}, live1...), svc...), kept)
	require.Len(t, dropped, 3)
	require.Equal(t, kept, l2.List())
	reasons := map[string]bool{}
	for _, e := range events {
		require.Equal(t, ctxmgr.EventExpired, e.Type)
		reasons[e.Job+": "+e.Reason] = true
	}
	require.Equal(t, map[string]bool{
		fmt.Sprintf("dies: pid %d exited while the daemon was down", dying.Process.Pid): true,
		"gone: its MIG device no longer exists":                                         true,
	}, reasons)

	// the state file now holds only what was kept
	l3 := ctxmgr.NewLeases(mm, ctxmgr.LeaseOptions{StatePath: state})
	kept3, dropped3, err := l3.Restore(ctx)
	require.NoError(t, err)
	require.Equal(t, kept, kept3)
	require.Empty(t, dropped3)

	require.NoError(t, os.WriteFile(state, []byte("{not json"), 0o600))
	_, _, err = ctxmgr.NewLeases(mm, ctxmgr.LeaseOptions{StatePath: state}).Restore(ctx)
	require.ErrorContains(t, err, "move it away")
}

func TestRepartitionRespectsLeases(t *testing.T) {
	ctx := context.Background()
	_, mm := simNode(t, 1, layoutReq("3g.71gb=2"))
	l := ctxmgr.NewLeases(mm, ctxmgr.LeaseOptions{})
	ls, err := l.Acquire(ctx, ctxmgr.AcquireRequest{Job: "train", Profile: "3g.71gb", GPU: 0})
	require.NoError(t, err)
	le := ls[0]
	require.Equal(t, 0, le.Placement.Start)

	tests := []struct {
		desc    string
		req     mig.Request
		wantErr error
		layout  string
	}{
		{"replacing the leased instance is refused", *layoutReq("7g.141gb=1"), ctxmgr.ErrLeased, "3g.71gb@0:4, 3g.71gb@4:4"},
		{"MIG off under a lease is refused", mig.Request{MIGEnabled: false}, ctxmgr.ErrLeased, "3g.71gb@0:4, 3g.71gb@4:4"},
		{"changing only the unleased half works", *layoutReq("3g.71gb=1,1g.18gb=2"), nil, "3g.71gb@0:4, 1g.18gb@4:1, 1g.18gb@5:1"},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			_, err := l.Repartition(ctx, 0, tc.req)
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
				require.ErrorContains(t, err, le.UUID)
			} else {
				require.NoError(t, err)
			}
			require.Equal(t, []string{tc.layout}, layouts(t, mm))
		})
	}
	require.Equal(t, []ctxmgr.Lease{le}, l.List(), "the kept instance is still leased")
	ls, err = l.Acquire(ctx, ctxmgr.AcquireRequest{Job: "small", Profile: "1g.18gb", GPU: 0})
	require.NoError(t, err)
	require.Equal(t, 4, ls[0].Placement.Start)
}

func TestPIDAlive(t *testing.T) {
	require.True(t, ctxmgr.PIDAlive(os.Getpid()))
	cmd := exec.Command("true")
	require.NoError(t, cmd.Run())
	require.False(t, ctxmgr.PIDAlive(cmd.Process.Pid), "an exited and reaped child")
	require.False(t, ctxmgr.PIDAlive(0))
}

// applyHook runs onApply before each Apply of the source it wraps.
type applyHook struct {
	ctxmgr.MIGSource
	onApply func()
}

func (a applyHook) Apply(ctx context.Context, reqs map[int]mig.Request, opts mig.ApplyOptions) (*mig.ApplyResult, error) {
	a.onApply()
	return a.MIGSource.Apply(ctx, reqs, opts)
}

func TestAcquireAbandonedMidCreateLeasesNothing(t *testing.T) {
	_, mm := simNode(t, 1, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l := ctxmgr.NewLeases(applyHook{MIGSource: mm, onApply: cancel}, ctxmgr.LeaseOptions{EnableMIG: true})
	_, err := l.Acquire(ctx, acq("gone", "1g.18gb", 3))
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorContains(t, err, "nothing leased, the 3 instances created stay free")
	require.Empty(t, l.List())
	require.Equal(t, []string{"1g.18gb×3"}, counts(t, mm), "the apply ran to its end, not torn by the cancel")
	ls, err := l.Acquire(context.Background(), acq("next", "1g.18gb", 3))
	require.NoError(t, err)
	for _, le := range ls {
		require.False(t, le.Created, "the next job gets the instances made for the abandoned one")
	}
}
