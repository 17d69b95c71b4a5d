package trainer

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/migctl/migctl/comm"
	"github.com/migctl/migctl/internal/bytesize"
)

// EnvTuning sets the executor's knobs of a group made from the environment
// (Init without WithTuning: the C ABI, so PyTorch's migctl backend), as
// comma-separated key=value pairs: chunk, small (sizes: 2MiB, 64KiB),
// slots, depth, workers (integers), spin (a Go duration), smallon (cpu or
// device: Tuning.SmallOnDevice), bcast (device or cpu: Tuning.BroadcastOnCPU), recv (staged or direct: Tuning.RecvDirect), chain (on or off:
// Tuning.NoChain), piece (auto or chunk: Tuning.WholeChunks), complete
// (cpu, device: Tuning.CompleteOnDevice, or queued: that and
// Tuning.QueueCopiesBack), e.g. MIGCTL_TUNING=chunk=4MiB,slots=8,workers=2. Every rank of a job must see
// the same chunk, slots, small and piece (migctl run hands its environment to all).
const EnvTuning = "MIGCTL_TUNING"

// ParseTuning reads EnvTuning's syntax; "" is the defaults.
func ParseTuning(s string) (Tuning, error) {
	var t Tuning
	if strings.TrimSpace(s) == "" {
		return t, nil
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok || v == "" {
			return Tuning{}, fmt.Errorf("tuning %q: want key=value, e.g. chunk=4MiB: %w", kv, comm.ErrInvalid)
		}
		var err error
		switch k {
		case "chunk", "small":
			var n int64
			if n, err = bytesize.Parse(v); err == nil && n > 1<<30 {
				err = fmt.Errorf("at most 1GiB")
			} else if err == nil && k == "chunk" && n%64 != 0 {
				err = fmt.Errorf("want a multiple of 64 bytes") // the executor refuses every all-reduce otherwise
			}
			if k == "chunk" {
				t.Chunk = int(n)
			} else {
				t.SmallBytes = int(n)
			}
		case "slots", "depth", "workers":
			var n int
			if n, err = strconv.Atoi(v); err == nil && n < 1 {
				err = fmt.Errorf("want 1 or more")
			}
			switch k {
			case "slots":
				t.Slots = n
			case "depth":
				t.Depth = n
			default:
				t.ReduceWorkers = n
			}
		case "smallon":
			t.SmallOnDevice, err = either(v, "cpu", "device")
		case "bcast":
			t.BroadcastOnCPU, err = either(v, "device", "cpu")
		case "recv":
			t.RecvDirect, err = either(v, "staged", "direct")
		case "chain":
			t.NoChain, err = either(v, "on", "off")
		case "piece":
			t.WholeChunks, err = either(v, "auto", "chunk")
		case "complete":
			switch v {
			case "queued":
				t.CompleteOnDevice, t.QueueCopiesBack = true, true
			default:
				t.CompleteOnDevice, err = either(v, "cpu", "device")
				if err != nil {
					err = fmt.Errorf("want cpu, device or queued")
				}
			}
		case "spin":
			if t.Spin, err = time.ParseDuration(v); err == nil && t.Spin <= 0 {
				err = fmt.Errorf("want a positive duration")
			}
		default:
			return Tuning{}, fmt.Errorf("tuning key %q: want chunk, small, smallon, bcast, recv, chain, piece, complete, slots, depth, workers or spin: %w", k, comm.ErrInvalid)
		}
		if err != nil {
			return Tuning{}, fmt.Errorf("tuning %s=%q: %v: %w", k, v, err, comm.ErrInvalid)
		}
	}
	return t, nil
}

// either reads a two-valued key: false for off, true for on.
func either(v, off, on string) (bool, error) {
	switch v {
	case off:
		return false, nil
	case on:
		return true, nil
	}
	return false, fmt.Errorf("want %s or %s", off, on)
}
