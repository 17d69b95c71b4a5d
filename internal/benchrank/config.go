package benchrank

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/migctl/migctl/allreduce"
	"github.com/migctl/migctl/comm"
	"github.com/migctl/migctl/trainer"
)

// Config is everything a rank needs to run its part of a benchmark; the
// launcher hands it to the workers it starts as JSON. Its names and values
// are those of the `migctl bench` flags.
type Config struct {
	Coll      string        `json:"coll"`
	NP        int           `json:"np"`
	Backend   string        `json:"backend"`
	Transport string        `json:"transport"`
	Algorithm string        `json:"algorithm"`
	DType     string        `json:"dtype"`
	Op        string        `json:"op"`
	MinBytes  int64         `json:"minBytes"`
	MaxBytes  int64         `json:"maxBytes"`
	Factor    int           `json:"factor"`
	Iters     int           `json:"iters"`
	Warmup    int           `json:"warmup"`
	Check     bool          `json:"check"`
	InPlace   bool          `json:"inPlace"`
	Root      int           `json:"root"`
	GPUs      []int         `json:"gpus"`
	Timeout   time.Duration `json:"timeout"`
	Chunk     int           `json:"chunk"`
	Slots     int           `json:"slots"`
	Depth     int           `json:"depth"`
	Workers   int           `json:"workers"`
	Spin      time.Duration `json:"spin"`
	// Small is the largest all-reduce that takes the small-message
	// schedule (0: never); Trace is MIGCTL_TRACE ("": off, "all": every rank,
	// anything else: rank 0).
	Small int `json:"small"`
	// SmallOn is where small all-reduces reduce: "cpu" ("" too) or
	// "device" (trainer.Tuning.SmallOnDevice).
	SmallOn string `json:"smallOn,omitempty"`
	Trace   string `json:"trace,omitempty"`
	ShmRoot string `json:"shmRoot"`
	Job     string `json:"job"`
	Quiet   bool   `json:"quiet"`
	// Limits: measure (once, cached) and print each row's floor.
	Limits bool `json:"limits"`
	// ReduceOn is where host-staged all-reduces reduce (trainer.WithReduceOn).
	ReduceOn string `json:"reduceOn,omitempty"`
	// Split (all-reduce, above 1) makes each timed call Split asynchronous
	// all-reduces of consecutive parts of the message, issued back to back
	// and then waited for, as DDP issues its gradient buckets.
	Split int `json:"split,omitempty"`
	// Chain "off" runs every asynchronous all-reduce to its end before the
	// next starts (trainer.Tuning.NoChain); "" or "on": the default.
	Chain string `json:"chain,omitempty"`
	// Piece "chunk" makes every host-staged all-reduce move whole chunks
	// (trainer.Tuning.WholeChunks); "" or "auto": the default.
	Piece string `json:"piece,omitempty"`
}

// ParseDType parses an element type name (float, half, bfloat16, double,
// int32, int64, uint8 and their aliases); DTypeName gives its canonical
// name. The error names the flag, --dtype.
func ParseDType(s string) (comm.DType, error) {
	switch strings.ToLower(s) {
	case "float", "float32", "fp32", "f32":
		return comm.Float32, nil
	case "half", "float16", "fp16", "f16":
		return comm.Float16, nil
	case "bfloat16", "bf16":
		return comm.BFloat16, nil
	case "double", "float64", "fp64", "f64":
		return comm.Float64, nil
	case "int32", "int":
		return comm.Int32, nil
	case "int64":
		return comm.Int64, nil
	case "uint8", "u8", "byte":
		return comm.Uint8, nil
	}
	return 0, fmt.Errorf("--dtype %q: want float, half, bfloat16, double, int32, int64 or uint8", s)
}

// DTypeName is the canonical name of d, the one Config.DType holds.
func DTypeName(d comm.DType) string {
	return [...]string{"float", "half", "bfloat16", "double", "int32", "int64", "uint8"}[d]
}

// ParseOp parses a reduction name (sum, avg, min, max). The error names
// the flag, --op.
func ParseOp(s string) (comm.Op, error) {
	switch strings.ToLower(s) {
	case "sum":
		return comm.Sum, nil
	case "avg":
		return comm.Avg, nil
	case "min":
		return comm.Min, nil
	case "max":
		return comm.Max, nil
	}
	return 0, fmt.Errorf("--op %q: want sum, avg, min or max", s)
}

// sweepSizes lists the message sizes of a sweep.
func sweepSizes(c Config) []int64 {
	if c.Coll == "barrier" {
		return []int64{0}
	}
	var out []int64
	for b := c.MinBytes; b <= c.MaxBytes; b *= int64(c.Factor) {
		out = append(out, b)
		if b == 0 || c.Factor < 2 {
			break
		}
	}
	return out
}

// geometry returns, for a row of size bytes, the count passed to the
// collective (elements per rank for all-reduce and broadcast, the per-rank
// block for reduce-scatter and all-gather) and the total element count.
func geometry(coll allreduce.Coll, size int64, es, n int) (perCall, total int64) {
	c := size / int64(es)
	switch coll {
	case allreduce.ReduceScatter, allreduce.AllGather:
		return c / int64(n), c / int64(n) * int64(n)
	case allreduce.Barrier:
		return 0, 0
	}
	return c, c
}

// groupOptions turns a config into the trainer options of one rank, with
// the trace (Config.Trace) on trace. The settings every rank must share go
// to the rendezvous, which fails the job when a rank joins with others.
func groupOptions(c Config, rank int, trace io.Writer) []trainer.Option {
	opts := []trainer.Option{
		trainer.WithBackend(trainer.Backend(c.Backend)),
		trainer.WithTransport(trainer.Transport(c.Transport)),
		trainer.WithAlgorithm(trainer.Algorithm(c.Algorithm)),
		trainer.WithTuning(trainer.Tuning{Chunk: c.Chunk, Slots: c.Slots, Depth: c.Depth,
			ReduceWorkers: c.Workers, Spin: c.Spin, SmallBytes: smallBytes(c.Small), SmallOnDevice: c.SmallOn == "device",
			NoChain: c.Chain == "off", WholeChunks: c.Piece == "chunk"}),
		trainer.WithTimeout(c.Timeout),
		trainer.WithShmRoot(c.ShmRoot),
		trainer.WithJob(c.Job),
		trainer.WithSettings(map[string]string{
			"bench.coll": c.Coll, "bench.dtype": c.DType, "bench.op": c.Op,
			"bench.minbytes": strconv.FormatInt(c.MinBytes, 10), "bench.maxbytes": strconv.FormatInt(c.MaxBytes, 10),
			"bench.factor": strconv.Itoa(c.Factor), "bench.iters": strconv.Itoa(c.Iters),
			"bench.warmup": strconv.Itoa(c.Warmup), "bench.check": strconv.FormatBool(c.Check),
			"bench.inplace": strconv.FormatBool(c.InPlace), "bench.root": strconv.Itoa(c.Root),
			"bench.backend": c.Backend, "bench.split": strconv.Itoa(max(c.Split, 1)),
		}),
	}
	if c.Backend == "gpu" && len(c.GPUs) > 0 {
		opts = append(opts, trainer.WithDevice(c.GPUs[max(rank, 0)%len(c.GPUs)]))
	}
	if c.ReduceOn != "" {
		opts = append(opts, trainer.WithReduceOn(c.ReduceOn))
	}
	if c.Trace != "" && c.Trace != "0" {
		opts = append(opts, trainer.WithTrace(trace, c.Trace == "all"))
	}
	return opts
}

// smallBytes maps --small-bytes (0: never) to the trainer's (negative: never).
func smallBytes(small int) int {
	if small <= 0 {
		return -1
	}
	return small
}
