package benchrank

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/allreduce"
	"github.com/migctl/migctl/comm"
)

func TestSweepSizes(t *testing.T) {
	tests := []struct {
		desc  string
		cfg   Config
		len   int
		first int64
		last  int64
	}{
		{"8 B to 256 MiB by 2", Config{Coll: "allreduce", MinBytes: 8, MaxBytes: 256 << 20, Factor: 2}, 26, 8, 256 << 20},
		{"one size", Config{Coll: "allreduce", MinBytes: 1 << 20, MaxBytes: 1 << 20, Factor: 1}, 1, 1 << 20, 1 << 20},
		{"last size not reached by the factor", Config{Coll: "allgather", MinBytes: 8, MaxBytes: 100, Factor: 4}, 2, 8, 32},
		{"zero bytes is one row", Config{Coll: "broadcast", MinBytes: 0, MaxBytes: 1 << 10, Factor: 2}, 1, 0, 0},
		{"barrier: one row of 0 whatever the sizes", Config{Coll: "barrier", MinBytes: 8, MaxBytes: 1 << 20, Factor: 2}, 1, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			s := sweepSizes(tc.cfg)
			require.Len(t, s, tc.len)
			require.Equal(t, tc.first, s[0])
			require.Equal(t, tc.last, s[len(s)-1])
		})
	}
}

func TestGeometry(t *testing.T) {
	tests := []struct {
		desc           string
		coll           allreduce.Coll
		size           int64
		es, n          int
		perCall, total int64
	}{
		{"all-reduce: every rank the whole message", allreduce.AllReduce, 1 << 10, 4, 3, 256, 256},
		{"broadcast: every rank the whole message", allreduce.Broadcast, 96, 8, 4, 12, 12},
		{"reduce-scatter: np blocks", allreduce.ReduceScatter, 48, 4, 3, 4, 12},
		{"reduce-scatter rounds down to np blocks", allreduce.ReduceScatter, 1 << 10, 4, 3, 85, 255},
		{"all-gather: np blocks", allreduce.AllGather, 28, 4, 7, 1, 7},
		{"all-gather of less than an element per rank", allreduce.AllGather, 8, 4, 3, 0, 0},
		{"barrier moves nothing", allreduce.Barrier, 1 << 10, 4, 3, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			per, total := geometry(tc.coll, tc.size, tc.es, tc.n)
			require.Equal(t, tc.perCall, per)
			require.Equal(t, tc.total, total)
		})
	}
}

// TestParseDType: every alias parses, the canonical name parses back to
// the same type, and a bad name is an error naming the flag.
func TestParseDType(t *testing.T) {
	tests := []struct {
		name  string
		want  comm.DType
		canon string
	}{
		{"float", comm.Float32, "float"},
		{"FP32", comm.Float32, "float"},
		{"f16", comm.Float16, "half"},
		{"bf16", comm.BFloat16, "bfloat16"},
		{"float64", comm.Float64, "double"},
		{"int", comm.Int32, "int32"},
		{"int64", comm.Int64, "int64"},
		{"byte", comm.Uint8, "uint8"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, err := ParseDType(tc.name)
			require.NoError(t, err)
			require.Equal(t, tc.want, d)
			require.Equal(t, tc.canon, DTypeName(d))
			back, err := ParseDType(DTypeName(d))
			require.NoError(t, err)
			require.Equal(t, d, back)
		})
	}
	_, err := ParseDType("complex")
	require.EqualError(t, err, `--dtype "complex": want float, half, bfloat16, double, int32, int64 or uint8`)
}

func TestParseOp(t *testing.T) {
	tests := []struct {
		name string
		want comm.Op
	}{
		{"sum", comm.Sum}, {"AVG", comm.Avg}, {"min", comm.Min}, {"max", comm.Max},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			op, err := ParseOp(tc.name)
			require.NoError(t, err)
			require.Equal(t, tc.want, op)
		})
	}
	_, err := ParseOp("prod")
	require.EqualError(t, err, `--op "prod": want sum, avg, min or max`)
}

func TestSmallBytes(t *testing.T) {
	tests := []struct {
		desc        string
		small, want int
	}{
		{"0 is never", 0, -1},
		{"negative is never", -5, -1},
		{"a size is kept", 64 << 10, 64 << 10},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			require.Equal(t, tc.want, smallBytes(tc.small))
		})
	}
}
