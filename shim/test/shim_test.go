package shimtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/context/swapproto"
)

const (
	modePassthrough = "1"
	modeVMM         = "2"
	stateSwappedOut = "2"
)

// Every way a program reaches the driver ends in the shim: the allocations
// become VMM allocations (cuMemCreate in the fake, no plain cuMemAlloc), the
// table tracks them, launches pass the gate, and frees give everything back.
func TestInterpositionPaths(t *testing.T) {
	needBin(t)
	for _, tc := range []struct{ desc, resolve string }{
		{"direct symbols (linked against libcuda.so.1)", "direct"},
		{"dlopen + dlsym", "dlsym"},
		{"cuGetProcAddress_v2 fetched through itself", "gpa"},
		{"cuGetProcAddress (v1)", "gpa1"},
		{"cuGetProcAddress per-thread default stream", "ptsz"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			e, d := newEnvWithDaemon(t)
			p := e.start(t, tc.resolve, "basic")
			c := d.waitConn(t)
			require.Equal(t, p.cmd.Process.Pid, c.pid())
			require.Equal(t, float64(1), c.hello.num("version"))
			require.Equal(t, "GPU-f0f1f2f3-f4f5-f6f7-f8f9-fafbfcfdfeff", c.hello.str("device"))
			lines := p.finish(t, 20*time.Second)
			res := line(t, lines, "RESULT")
			require.Equal(t, "1", res["ok"], "data wrong: %v", res)
			st := line(t, lines, "STATS")
			require.Equal(t, modeVMM, st["mode"])
			require.Equal(t, uint64(3), num(t, st, "allocations"))
			require.Equal(t, uint64(3), num(t, st, "vmm_creates"), "every allocation is VMM-backed")
			require.Equal(t, uint64(0), num(t, st, "plain_allocs"), "no allocation bypassed the shim")
			// 3 allocations of 3 MiB+100 B, 10 rows of pitch 4096 and 1000 B at 2 MiB granularity
			require.Equal(t, uint64((2+1+1)<<21), num(t, st, "bytes"))
			require.Equal(t, num(t, st, "bytes"), num(t, st, "vmm_in_use"))
			// 5 launches, 1 LaunchKernelEx, 3 graph launches, HtoD, memset, 2 DtoH
			require.GreaterOrEqual(t, num(t, st, "gated"), uint64(13))
			require.Equal(t, uint64(9), num(t, st, "launches"))
			fr := line(t, lines, "FREED")
			require.Equal(t, uint64(0), num(t, fr, "allocations"))
			require.Equal(t, uint64(0), num(t, fr, "in_use"), "frees release VMM memory")
		})
	}
}

// Without a daemon the shim stays out of the way: same allocations (plain
// cuMemAlloc), same results, same device usage as without the shim.
func TestPassthroughWithoutDaemon(t *testing.T) {
	needBin(t)
	run := func(t *testing.T, e *env) []string {
		p := e.start(t, "gpa", "basic")
		return p.finish(t, 20*time.Second)
	}
	bare := newEnv(t)
	bare.shim = false
	want := run(t, bare)
	wantStats := line(t, want, "STATS")

	for _, tc := range []struct {
		desc  string
		setup func(t *testing.T, e *env)
	}{
		{"socket path absent", func(t *testing.T, e *env) {}},
		{"socket file without a listener", func(t *testing.T, e *env) {
			p := filepath.Join(e.dir, "dead.sock")
			require.NoError(t, os.WriteFile(p, nil, 0o600))
			e.socket = p
		}},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			e := newEnv(t)
			tc.setup(t, e)
			got := run(t, e)
			require.Equal(t, "1", line(t, got, "RESULT")["ok"])
			st := line(t, got, "STATS")
			require.Equal(t, "1", st["shim"])
			require.Equal(t, modePassthrough, st["mode"])
			require.Equal(t, "0", st["connected"])
			for _, k := range []string{"in_use", "vmm_creates", "plain_allocs", "launches"} {
				require.Equal(t, wantStats[k], st[k], "fake device counter %s differs from a run without the shim", k)
			}
			require.Equal(t, "0", line(t, got, "FREED")["in_use"])
		})
	}
}

// Many swap cycles while the program launches kernels and graphs: launches
// stop while out, memory is really released, every byte comes back
// (MIGSWAP_CHECKSUM=1 and the program checks every float).
func TestSwapCyclesKeepDataAndReleaseMemory(t *testing.T) {
	needBin(t)
	for _, tc := range []struct {
		desc    string
		resolve string
		cycles  int
	}{
		{"launches via cuGetProcAddress", "gpa", 25},
		{"launches via direct symbols", "direct", 10},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			e, d := newEnvWithDaemon(t)
			const nbuf, size = 4, 3<<20 + 4096
			p := e.start(t, tc.resolve, "loop", "4", "3149824")
			c := d.waitConn(t)
			p.waitLine(t, "READY", 20*time.Second)
			resident := readFakeStats(t, e.stats)
			require.Equal(t, uint64(nbuf*(4<<20)), resident.VMMInUse)

			for i := 0; i < tc.cycles; i++ {
				out := c.swap(t, "swap_out")
				require.Equal(t, true, out["ok"], "swap_out %d: %v", i, out)
				require.Equal(t, float64(nbuf*size), out.num("bytes"))

				st := readFakeStats(t, e.stats)
				require.Equal(t, uint64(0), st.InUse, "device memory not released while swapped out")
				time.Sleep(20 * time.Millisecond)
				st2 := readFakeStats(t, e.stats)
				require.Equal(t, st.Launches, st2.Launches, "a kernel ran while swapped out")

				in := c.swap(t, "swap_in")
				require.Equal(t, true, in["ok"], "swap_in %d: %v", i, in)
				require.Equal(t, resident.VMMInUse, readFakeStats(t, e.stats).VMMInUse)
				// More than nbuf launches: the loop crossed at least one iteration
				// boundary (an iteration is nbuf kernels or one graph of them),
				// so the program's own count, checked below, grows every cycle.
				require.Eventually(t, func() bool { return readFakeStats(t, e.stats).Launches > st2.Launches+nbuf },
					5*time.Second, time.Millisecond, "launches did not resume after swap_in")
			}
			require.GreaterOrEqual(t, c.progressCount(), 2*tc.cycles, "a progress message per swap at least")
			lines := p.finish(t, 30*time.Second)
			res := line(t, lines, "RESULT")
			require.Equal(t, "1", res["ok"], "data lost: %v", res)
			require.Equal(t, "0", res["wrong"])
			require.GreaterOrEqual(t, num(t, res, "iters"), uint64(tc.cycles), "launches resumed after every swap-in")
			st := line(t, lines, "STATS")
			require.Equal(t, uint64(tc.cycles), num(t, st, "swaps_out"))
			require.Equal(t, uint64(tc.cycles), num(t, st, "swaps_in"))
		})
	}
}

// What cannot be moved safely makes the shim refuse with a reason; the
// program keeps running untouched.
func TestSwapRefusedWithReason(t *testing.T) {
	needBin(t)
	for _, tc := range []struct{ kind, reason string }{
		{"ipc", "IPC-exported memory"},
		{"async", "stream-ordered allocations"},
		{"async_free", "stream-ordered allocations"},
		{"managed", "managed memory"},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			e, d := newEnvWithDaemon(t)
			p := e.start(t, "gpa", "refuse", tc.kind)
			c := d.waitConn(t)
			ready := p.waitLine(t, "READY", 20*time.Second)
			require.Contains(t, ready["reason"], tc.reason)
			before := readFakeStats(t, e.stats)
			res := c.swap(t, "swap_out")
			require.Equal(t, false, res["ok"])
			require.Contains(t, res.str("error"), tc.reason)
			require.Equal(t, before.VMMInUse, readFakeStats(t, e.stats).VMMInUse, "nothing was released")
			require.Eventually(t, func() bool { return readFakeStats(t, e.stats).Launches > before.Launches },
				5*time.Second, time.Millisecond, "the program is blocked after a refused swap")
			in := c.swap(t, "swap_in")
			require.Equal(t, true, in["ok"], "swap_in of a resident process is a no-op")
			lines := p.finish(t, 20*time.Second)
			require.Equal(t, "1", line(t, lines, "RESULT")["ok"])
			if tc.kind == "async" || tc.kind == "async_free" {
				require.Equal(t, "", line(t, lines, "FREED_ASYNC")["reason"], "freeing the async allocation makes it swappable")
			}
		})
	}
}

// A forked child never shares the parent's connection or table: it starts
// undecided, registers itself under its own pid, and the parent keeps
// swapping normally.
func TestForkSafety(t *testing.T) {
	needBin(t)
	e, d := newEnvWithDaemon(t)
	p := e.start(t, "gpa", "loop", "2", "1048576", "fork")
	parent := d.waitConn(t)
	require.Equal(t, p.cmd.Process.Pid, parent.pid())
	child := d.waitConn(t)
	require.NotEqual(t, parent.pid(), child.pid(), "the child registered under its own pid")
	after := p.waitLine(t, "CHILD_AFTER_FORK", 20*time.Second)
	require.Equal(t, "0", after["connected"], "the child inherited the parent's connection")
	require.Equal(t, "0", after["mode"])
	require.Equal(t, "0", after["allocations"], "the child inherited the parent's allocation table")
	cres := p.waitLine(t, "CHILD_RESULT", 20*time.Second)
	require.Equal(t, "1", cres["ok"])
	select {
	case <-child.closed:
	case <-time.After(20 * time.Second):
		require.FailNow(t, "the child's connection did not close when it exited")
	}
	for i := 0; i < 5; i++ {
		require.Equal(t, true, parent.swap(t, "swap_out")["ok"])
		require.Equal(t, true, parent.swap(t, "swap_in")["ok"])
	}
	lines := p.finish(t, 20*time.Second)
	res := line(t, lines, "RESULT")
	require.Equal(t, "1", res["ok"])
	require.Equal(t, "0", res["child_status"])
}

// OUT_OF_MEMORY → need → the daemon frees memory (swaps a victim out) →
// granted → the allocation is retried and succeeds; denied → it fails as it
// would without the shim.
func TestNeedGrantedRetry(t *testing.T) {
	needBin(t)
	for _, tc := range []struct {
		desc  string
		grant bool
	}{
		{"granted after swapping a victim out", true},
		{"denied", false},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			e, d := newEnvWithDaemon(t)
			e.extra = []string{"FAKECUDA_MEM_BYTES=67108864"} // one shared 64 MiB device
			victimProc := e.start(t, "gpa", "loop", "2", "16777216")
			victim := d.waitConn(t)
			victimProc.waitLine(t, "READY", 20*time.Second)
			needs := make(chan uint64, 4)
			d.setNeed(func(c *shimConn, bytes uint64) (bool, string) {
				needs <- bytes
				if !tc.grant {
					return false, "nothing to preempt"
				}
				// on the fake daemon's goroutine: no require here; a
				// failed swap denies the need and the test's checks fail
				r, err := victim.trySwap("swap_out")
				if err != nil {
					return false, err.Error()
				}
				return r["ok"] == true, r.str("error")
			})
			req := e.start(t, "gpa", "oom", "41943040")
			reqConn := d.waitConn(t)
			lines := req.finish(t, 30*time.Second)
			require.Equal(t, uint64(40<<20), <-needs)
			res := line(t, lines, "RESULT")
			st := line(t, lines, "STATS")
			if tc.grant {
				require.Equal(t, "1", res["ok"], "the retried allocation failed: %v", res)
				require.Equal(t, "0", res["code"])
			} else {
				require.Equal(t, "2", res["code"], "CUDA_ERROR_OUT_OF_MEMORY as without the shim")
			}
			<-reqConn.closed
			if tc.grant {
				in := victim.swap(t, "swap_in")
				require.Equal(t, true, in["ok"], "%v", in)
			}
			vl := victimProc.finish(t, 20*time.Second)
			require.Equal(t, "1", line(t, vl, "RESULT")["ok"])
			_ = st
		})
	}
}

// A swap-in that cannot get memory leaves the program blocked and says so;
// a later swap-in succeeds and nothing is lost.
func TestSwapInWithoutMemoryStaysBlocked(t *testing.T) {
	needBin(t)
	e, d := newEnvWithDaemon(t)
	e.extra = []string{"FAKECUDA_MEM_BYTES=33554432"}
	p := e.start(t, "gpa", "loop", "2", "8388608")
	c := d.waitConn(t)
	p.waitLine(t, "READY", 20*time.Second)
	require.Equal(t, true, c.swap(t, "swap_out")["ok"])

	hogEnv := *e
	hogEnv.socket = "" // passthrough
	hog := hogEnv.start(t, "gpa", "hold", "25165824")
	hog.waitLine(t, "READY", 20*time.Second)

	res := c.swap(t, "swap_in")
	require.Equal(t, false, res["ok"])
	require.Contains(t, res.str("error"), "stays swapped out and blocked")
	st := readFakeStats(t, e.stats)
	require.Equal(t, uint64(24<<20), st.InUse, "the failed swap-in gave back what it took")
	time.Sleep(50 * time.Millisecond)
	require.Equal(t, st.Launches, readFakeStats(t, e.stats).Launches, "the program ran without its memory")

	hog.finish(t, 20*time.Second)
	require.Equal(t, true, c.swap(t, "swap_in")["ok"])
	lines := p.finish(t, 20*time.Second)
	require.Equal(t, "1", line(t, lines, "RESULT")["ok"])
}

// If the daemon goes away while the program is swapped out, the shim brings
// the memory back by itself and the program continues.
func TestDaemonGoneSwapsBackIn(t *testing.T) {
	needBin(t)
	e, d := newEnvWithDaemon(t)
	p := e.start(t, "gpa", "loop", "2", "1048576")
	c := d.waitConn(t)
	p.waitLine(t, "READY", 20*time.Second)
	require.Equal(t, true, c.swap(t, "swap_out")["ok"])
	launches := readFakeStats(t, e.stats).Launches
	require.NoError(t, c.c.Close())
	require.Eventually(t, func() bool { return readFakeStats(t, e.stats).Launches > launches },
		10*time.Second, time.Millisecond)
	lines := p.finish(t, 20*time.Second)
	res := line(t, lines, "RESULT")
	require.Equal(t, "1", res["ok"])
	require.Equal(t, "0", line(t, lines, "STATS")["connected"])
}

// Unknown message types are answered with an error and otherwise ignored.
func TestProtocolUnknownType(t *testing.T) {
	needBin(t)
	e, d := newEnvWithDaemon(t)
	p := e.start(t, "gpa", "loop", "1", "65536")
	c := d.waitConn(t)
	p.waitLine(t, "READY", 20*time.Second)
	c.send(msg{"type": "frobnicate", "id": 7})
	require.Eventually(t, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.errors) == 1
	}, 5*time.Second, time.Millisecond)
	c.mu.Lock()
	reason := c.errors[0].str("reason")
	c.mu.Unlock()
	require.Contains(t, reason, "frobnicate")
	require.Equal(t, true, c.swap(t, "swap_out")["ok"], "the connection still works")
	require.Equal(t, true, c.swap(t, "swap_in")["ok"])
	require.Eventually(t, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.usage == 1<<21
	}, 5*time.Second, 10*time.Millisecond, "usage reports the bytes held")
	require.Equal(t, "1", line(t, p.finish(t, 20*time.Second), "RESULT")["ok"])
}

// Memory that comes back wrong is never run on: the swap-in fails with the
// checksum error, and the program stays blocked.
func TestCorruptSwapInStaysBlocked(t *testing.T) {
	needBin(t)
	e, d := newEnvWithDaemon(t)
	e.extra = []string{"FAKECUDA_CORRUPT_HTOD_ASYNC=2"}
	p := e.start(t, "gpa", "loop", "2", "1048576")
	c := d.waitConn(t)
	p.waitLine(t, "READY", 20*time.Second)
	require.Equal(t, true, c.swap(t, "swap_out")["ok"])
	res := c.swap(t, "swap_in")
	require.Equal(t, false, res["ok"])
	require.Contains(t, res.str("error"), "checksum mismatch")
	launches := readFakeStats(t, e.stats).Launches
	time.Sleep(100 * time.Millisecond)
	require.Equal(t, launches, readFakeStats(t, e.stats).Launches, "the program ran on corrupt memory")
	again := c.swap(t, "swap_in")
	require.Equal(t, false, again["ok"], "a corrupt process never resumes")
	require.Contains(t, again.str("error"), "stays blocked")
}

// MIGSWAP_PREPIN=1 pins the host arena in the background as the program
// allocates, so the first swap-out does not pay for it; swaps work as usual.
func TestPrepinGrowsArenaAhead(t *testing.T) {
	needBin(t)
	for _, tc := range []struct {
		desc   string
		prepin bool
	}{
		{"with MIGSWAP_PREPIN=1 the arena exists before any swap", true},
		{"without it the arena waits for the first swap-out", false},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			e, d := newEnvWithDaemon(t)
			if tc.prepin {
				e.extra = []string{"MIGSWAP_PREPIN=1"}
			}
			p := e.start(t, "gpa", "loop", "3", "3145728")
			c := d.waitConn(t)
			ready := p.waitLine(t, "READY_STATS", 20*time.Second)
			bytes := num(t, ready, "bytes")
			require.Equal(t, uint64(3*(4<<20)), bytes)
			var arena uint64
			deadline := time.Now().Add(2 * time.Second)
			for time.Now().Before(deadline) {
				_, _ = p.stdin.Write([]byte("stats\n"))
				arena = num(t, p.waitLine(t, "STATS_NOW", 5*time.Second), "arena")
				if arena >= bytes || !tc.prepin {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if tc.prepin {
				require.GreaterOrEqual(t, arena, bytes, "the arena was not grown ahead of the first swap")
			} else {
				time.Sleep(300 * time.Millisecond)
				_, _ = p.stdin.Write([]byte("stats\n"))
				require.Equal(t, uint64(0), num(t, p.waitLine(t, "STATS_NOW", 5*time.Second), "arena"))
			}
			for i := 0; i < 3; i++ {
				require.Equal(t, true, c.swap(t, "swap_out")["ok"])
				require.Equal(t, true, c.swap(t, "swap_in")["ok"])
			}
			lines := p.finish(t, 20*time.Second)
			require.Equal(t, "1", line(t, lines, "RESULT")["ok"])
			require.GreaterOrEqual(t, num(t, line(t, lines, "STATS"), "arena"), bytes)
		})
	}
}

// The shim defines dlsym; dlsym(RTLD_NEXT, ...) must still mean "the next
// definition after the caller": a library that wraps a function that way
// (libmigswap_nexta wrapping libmigswap_nextb) must not find itself. And
// looking up a non-CUDA name that starts with "cu" (cuserid) must not load the
// driver into a program that never uses CUDA (the fake is on the path, so a
// load would succeed and show).
func TestDlsymRTLDNextUnchanged(t *testing.T) {
	needBin(t)
	dir := filepath.Join(binDir, "nexttest")
	for _, tc := range []struct {
		desc string
		shim bool
	}{
		{"without the shim", false},
		{"with the shim preloaded", true},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			cmd := exec.Command(filepath.Join(dir, "migswap_nexttest"))
			cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+dir+":"+filepath.Join(binDir, "fakecuda"))
			if tc.shim {
				cmd.Env = append(cmd.Env, "LD_PRELOAD="+filepath.Join(binDir, "libmigswap.so"))
			}
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "%s", out)
			require.Equal(t, "next_probe=42\ncuserid=1 libcuda_loaded=0\n", string(out))
		})
	}
}

// Several threads launch and copy at once while the daemon swaps: the gate
// stops them all, and every thread's buffer comes back intact.
func TestSwapWithConcurrentLaunchingThreads(t *testing.T) {
	needBin(t)
	e, d := newEnvWithDaemon(t)
	p := e.start(t, "ptsz", "loop", "6", "1048576", "threads")
	c := d.waitConn(t)
	p.waitLine(t, "READY", 20*time.Second)
	for i := 0; i < 15; i++ {
		require.Equal(t, true, c.swap(t, "swap_out")["ok"], "cycle %d", i)
		st := readFakeStats(t, e.stats)
		require.Equal(t, uint64(0), st.InUse)
		time.Sleep(10 * time.Millisecond)
		require.Equal(t, st.Launches, readFakeStats(t, e.stats).Launches, "a thread launched while swapped out")
		require.Equal(t, true, c.swap(t, "swap_in")["ok"], "cycle %d", i)
		time.Sleep(5 * time.Millisecond)
	}
	lines := p.finish(t, 30*time.Second)
	res := line(t, lines, "RESULT")
	require.Equal(t, "1", res["ok"], "%v", res)
	require.Equal(t, "6", res["threads"])
	require.Equal(t, uint64(15), num(t, line(t, lines, "STATS"), "swaps_out"))
}

// A job name the daemon would refuse (PROTOCOL.md "Limits": valid UTF-8, no
// control characters) made the hello fail and the program run in passthrough,
// unswappable: the shim cut a long non-ASCII MIGSWAP_JOB in the middle of a
// character and sent control characters as they were. It sends a name that
// passes the daemon's own check now.
func TestJobNameTheDaemonAccepts(t *testing.T) {
	needBin(t)
	for _, tc := range []struct{ desc, job, want string }{
		{"a 2-byte character cut at 255 bytes", strings.Repeat("é", 200), strings.Repeat("é", 127)},
		{"a 3-byte character cut at 255 bytes", strings.Repeat("日本語x", 30), strings.Repeat("日本語x", 25) + "日"},
		{"control characters", "a\tb\x7fc\u0085d", "a_b_c_d"},
		{"bytes that are not UTF-8", "x\xffy\xc3z\xed\xa0\x80", "x?y?z???"},
		{"plain", "train-7.b", "train-7.b"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			e, d := newEnvWithDaemon(t)
			e.extra = []string{"MIGSWAP_JOB=" + tc.job}
			p := e.start(t, "gpa", "basic")
			c := d.waitConn(t)
			job := c.hello.str("job")
			require.Equal(t, tc.want, job)
			require.NoError(t, swapproto.Message{Type: swapproto.TypeHello, Version: swapproto.Version, Job: job}.Validate())
			require.Equal(t, "1", line(t, p.finish(t, 20*time.Second), "RESULT")["ok"])
		})
	}
}

// TestMemAllocPitchSizeWraps: cuMemAllocPitch under the shim refuses a
// width and height whose padded product wraps around size_t
// (CUDA_ERROR_INVALID_VALUE, as the driver does) instead of allocating, or
// asking the daemon for, a far smaller size than asked.
func TestMemAllocPitchSizeWraps(t *testing.T) {
	needBin(t)
	e, d := newEnvWithDaemon(t)
	p := e.start(t, "direct", "pitch")
	d.waitConn(t)
	lines := p.finish(t, 20*time.Second)
	res := line(t, lines, "PITCH")
	const invalidValue = "1" // CUDA_ERROR_INVALID_VALUE
	require.Equal(t, invalidValue, res["wide"], "2^32 x (2^32+1) rows: %v", res)
	require.Equal(t, invalidValue, res["padded"], "a width that wraps when padded: %v", res)
	st := line(t, lines, "STATS")
	require.Equal(t, modeVMM, st["mode"])
	require.Equal(t, uint64(0), num(t, st, "allocations"), "nothing was allocated")
}
