package allreduce

import (
	"fmt"
	"strconv"
	"strings"
)

// GPUShareOne is Params.GPUShare for a reduction done entirely by the
// devices: shares are in thousandths of every chunk.
const GPUShareOne = 1000

// ReduceOn says where a host-staged all-reduce reduces the staged inputs:
// on the CPU threads of every rank (the plain host-staged schedule), on the
// ranks' devices from mapped host memory, or split between the two. It is a
// job-wide setting: every rank must resolve it to the same Params.GPUShare.
type ReduceOn string

// The modes. A split may carry the devices' fraction: "split:0.25".
const (
	// ReduceOnAuto: the cost model's share (Machine.GPUShare): 0 on the
	// H200 figures for 2 to 8 ranks on one GPU (measured 2026-12-01: the
	// CPU won every row); a split only on a host that reduces far slower.
	ReduceOnAuto ReduceOn = "auto"
	// ReduceOnCPU: every rank's CPU threads reduce one part of each chunk
	// (share 0).
	ReduceOnCPU ReduceOn = "cpu"
	// ReduceOnGPU: every rank's device reduces one part of each chunk from
	// the peers' staged copies in mapped host memory (share 1).
	ReduceOnGPU ReduceOn = "gpu"
	// ReduceOnSplit: the first fraction of each chunk on the devices, the
	// rest on the CPU threads; without a fraction, the cost model's best
	// share strictly between 0 and 1.
	ReduceOnSplit ReduceOn = "split"
)

// ParseReduceOn parses "auto" (or ""), "cpu", "gpu", "split" or
// "split:F" with 0 < F < 1. share is the fraction in thousandths for
// "cpu" (0), "gpu" (GPUShareOne) and "split:F"; -1 where the cost model
// decides ("auto", "split").
func ParseReduceOn(s string) (mode ReduceOn, share int, err error) {
	name, frac, hasFrac := strings.Cut(strings.TrimSpace(s), ":")
	bad := func() (ReduceOn, int, error) {
		return "", 0, fmt.Errorf("reduce-on %q: want auto, cpu, gpu, split or split:F with 0 < F < 1: %w", s, ErrUnsupported)
	}
	switch mode = ReduceOn(name); mode {
	case "", ReduceOnAuto:
		mode, share = ReduceOnAuto, -1
	case ReduceOnCPU:
		share = 0
	case ReduceOnGPU:
		share = GPUShareOne
	case ReduceOnSplit:
		share = -1
		if hasFrac {
			f, err := strconv.ParseFloat(frac, 64)
			share = int(f*GPUShareOne + 0.5)
			if err != nil || share <= 0 || share >= GPUShareOne {
				return bad()
			}
		}
	default:
		return bad()
	}
	if hasFrac && mode != ReduceOnSplit {
		return bad()
	}
	return mode, share, nil
}

// ResolveGPUShare turns a reduce-on setting into Params.GPUShare for the
// host-staged all-reduce of w (w.Algorithm and w.GPUShare are ignored):
// explicit shares as given, the cost model's otherwise. Every rank that
// passes equal arguments gets the same share.
func (m Machine) ResolveGPUShare(s string, w Workload) (int, error) {
	mode, share, err := ParseReduceOn(s)
	if err != nil || share >= 0 {
		return share, err
	}
	lo, hi := 0, GPUShareOne
	if mode == ReduceOnSplit {
		lo, hi = shareStep, GPUShareOne-shareStep
	}
	return m.GPUShare(w, lo, hi)
}

// alignedCut is the start of part i of n of length bytes: on 64-byte
// boundaries (so that the reduction kernels take their 16-byte vector path
// and no two ranks write one cache line), the last part ending at length.
func alignedCut(length, n, i int) int {
	if i >= n {
		return length
	}
	return (length * i / n) &^ 63
}

// gpuCut is where the devices' region of a chunk of ln bytes ends.
func gpuCut(ln, share int) int {
	if share >= GPUShareOne {
		return ln
	}
	return (ln * share / GPUShareOne) &^ 63
}

// buildSplitAllReduce is the host-staged all-reduce with the first
// GPUShare thousandths of every chunk reduced by the devices. For chunk c
// in slot c mod K, the chunk's device region [0, g) cut in n parts
// [lo_r, hi_r), its CPU region [g, ln) cut in n pieces, rank r:
//
//	out lane:    copy the chunk but device part r to in[r][slot]       sets staged (A)
//	reduce lane: out[slot][CPU piece r] = Σ_q in[q][slot][piece] (CPU) sets reduced (B)
//	in lane:     Recv[part r] = Send[part r] + Σ_{q≠r} in[q][slot][part r] (device, ReduceIn)
//	             copy Recv[part r] to out[slot][part r]                sets written (D)
//	             copy out[slot] but part r to Recv, one chunk behind   sets fetched (C)
//
// A fetch waits for every rank's CPU piece and every other rank's device
// part. A rank restages a slot once every rank fetched the slot's previous
// chunk: by then every reader of its area is done (each fetch waited for
// the device parts that read it). The write of a device part into
// out[slot] follows this call's staging of every peer, so every rank has
// fetched what the slot held before, in this call or the previous one: no
// fence between host-staged calls, whatever their shares (needsFence).
//
// Per rank over the link: S out (the staged chunk but part r, and part r
// reduced), S + f·S·(n−2)/n in (the fetch but part r, and the n−1 peers'
// copies of part r read by the kernel); the CPU reads n·(1−f)·S in all.
func buildSplitAllReduce(s *Schedule) {
	p := s.Params
	n, K, C := p.World, p.Slots, p.Chunk
	s.HostBytes = ArenaBytes(n, C, K)
	nc := ceilDiv(p.Bytes, C)
	lag := min(K-1, 1) // fetch a chunk behind: its wait does not hold up the next reduction
	cpu := p.GPUShare < GPUShareOne
	for r := range n {
		var outL, redL, inL []Step
		fetch := func(c int) {
			off := c * C
			ln := min(C, p.Bytes-off)
			slot, v := c%K, uint64(c+1)
			g := gpuCut(ln, p.GPUShare)
			lo, hi := alignedCut(g, n, r), alignedCut(g, n, r+1)
			var wait []Cond
			if cpu {
				wait = allRanks(n, roleB, v)
			}
			for q := range n {
				if q != r {
					wait = append(wait, Cond{FlagOf(q, roleD), v})
				}
			}
			spans := nonEmpty([2]int{0, lo}, [2]int{hi, ln})
			for i, sp := range spans {
				st := Step{Lane: LaneIn, Kind: CopyIn, Buf: Recv, Off: off + sp[0], Len: sp[1] - sp[0],
					Host: Span{stagedOut(p, slot) + sp[0], sp[1] - sp[0]}}
				if i == 0 {
					st.Wait = wait
				}
				if i == len(spans)-1 {
					st.Set = []Cond{{FlagOf(r, roleC), v}}
				}
				inL = append(inL, st)
			}
		}
		for c := range nc {
			off := c * C
			ln := min(C, p.Bytes-off)
			slot, v := c%K, uint64(c+1)
			g := gpuCut(ln, p.GPUShare)
			lo, hi := alignedCut(g, n, r), alignedCut(g, n, r+1)
			in := stagedIn(p, r, slot)
			// Stage everything but this rank's device part.
			spans := nonEmpty([2]int{0, lo}, [2]int{hi, ln})
			for i, sp := range spans {
				st := Step{Lane: LaneOut, Kind: CopyOut, Buf: Send, Off: off + sp[0], Len: sp[1] - sp[0],
					Host: Span{in + sp[0], sp[1] - sp[0]}}
				if i == 0 && c >= K {
					st.Wait = allRanks(n, roleC, uint64(c-K+1))
				}
				if i == len(spans)-1 {
					st.Set = []Cond{{FlagOf(r, roleA), v}}
				}
				outL = append(outL, st)
			}
			if cpu {
				a, b := g+alignedCut(ln-g, n, r), g+alignedCut(ln-g, n, r+1)
				red := Step{Lane: LaneReduce, Kind: HostReduce, Host: Span{stagedOut(p, slot) + a, b - a},
					Final: p.Avg, Wait: allRanks(n, roleA, v), Set: []Cond{{FlagOf(r, roleB), v}}}
				for q := range n {
					red.Hosts = append(red.Hosts, Span{stagedIn(p, q, slot) + a, b - a})
				}
				redL = append(redL, red)
			}
			dev := Step{Lane: LaneIn, Kind: ReduceIn, Buf: Recv, Off: off + lo, Len: hi - lo, Src: Send, SrcOff: off + lo,
				Final: p.Avg}
			for q := range n {
				if q != r {
					dev.Hosts = append(dev.Hosts, Span{stagedIn(p, q, slot) + lo, hi - lo})
					dev.Wait = append(dev.Wait, Cond{FlagOf(q, roleA), v})
				}
			}
			inL = append(inL, dev, Step{Lane: LaneIn, Kind: CopyOut, Buf: Recv, Off: off + lo, Len: hi - lo,
				Host: Span{stagedOut(p, slot) + lo, hi - lo}, Set: []Cond{{FlagOf(r, roleD), v}}})
			if c-lag >= 0 {
				fetch(c - lag)
			}
		}
		for c := max(0, nc-lag); c < nc; c++ {
			fetch(c)
		}
		s.Steps[r] = append(append(outL, redL...), inL...)
	}
}

// nonEmpty keeps the non-empty [lo, hi) spans, or one empty span at 0 when
// none is, so that a step still waits and sets its flags.
func nonEmpty(spans ...[2]int) [][2]int {
	var out [][2]int
	for _, sp := range spans {
		if sp[1] > sp[0] {
			out = append(out, sp)
		}
	}
	if len(out) == 0 {
		out = [][2]int{{0, 0}}
	}
	return out
}
