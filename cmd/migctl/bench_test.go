package main

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/allreduce"
	"github.com/migctl/migctl/comm"
	"github.com/migctl/migctl/internal/bytesize"
)

// TestBusFactor: nccl-tests' bus bandwidth factors.
func TestBusFactor(t *testing.T) {
	tests := []struct {
		coll string
		n    int
		want float64
	}{
		{"allreduce", 7, 2 * 6.0 / 7},
		{"allgather", 7, 6.0 / 7},
		{"reducescatter", 7, 6.0 / 7},
		{"broadcast", 7, 1},
		{"broadcast", 1, 1},
		{"allreduce", 1, 0},
		{"barrier", 7, 0},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%s on %d", tc.coll, tc.n), func(t *testing.T) {
			require.InDelta(t, tc.want, busFactor(tc.coll, tc.n), 1e-12)
		})
	}
}

// benchValidate parses args into the options of `migctl bench COLL` and
// runs Complete and Validate only: nothing is launched, whatever Validate
// misses (a missed case fails the test instead of starting ranks).
func benchValidate(t *testing.T, coll allreduce.Coll, args ...string) (*benchOptions, error) {
	t.Helper()
	o := &benchOptions{streams: streams{In: &bytes.Buffer{}, Out: &bytes.Buffer{}, ErrOut: &bytes.Buffer{}}}
	cmd := benchCollCmd(o, coll)
	if err := cmd.ParseFlags(args); err != nil {
		return o, err
	}
	if err := o.Complete(); err != nil {
		return o, err
	}
	return o, o.Validate()
}

// TestBenchValidate: every bad flag combination is refused by Complete or
// Validate, with a message naming the flag; sizes that are not whole
// elements are refused (they used to be measured silently smaller: -b 7 -e 7
// measured 4 bytes of float32, -b 3 -e 3 -d double a row of size 0).
func TestBenchValidate(t *testing.T) {
	tests := []struct {
		desc string
		coll allreduce.Coll
		args []string
		want string // substring of the error
	}{
		{"unknown backend", allreduce.AllReduce, []string{"--backend", "tpu"}, "--backend"},
		{"ipc on the host backend", allreduce.AllReduce, []string{"--transport", "ipc"}, "--transport ipc needs --backend gpu"},
		{"sizes reversed", allreduce.AllReduce, []string{"-b", "1MiB", "-e", "1KiB"}, "want 0 <= b <= e"},
		{"bad dtype", allreduce.AllReduce, []string{"--dtype", "complex"}, "--dtype"},
		{"bad op", allreduce.AllReduce, []string{"--op", "prod"}, "prod"},
		{"root outside", allreduce.Broadcast, []string{"--np", "2", "--root", "2"}, "--root 2"},
		{"joining without a token", allreduce.AllReduce, []string{"--rendezvous", "127.0.0.1:1"}, "--token"},
		{"chunk too small", allreduce.AllReduce, []string{"--chunk", "1KiB"}, "--chunk 1024"},
		{"chunk of SI units is not a multiple of 4KiB", allreduce.AllReduce, []string{"--chunk", "4M"}, "--chunk 4000000: want a multiple of 4096"},
		{"small-bytes not a size", allreduce.AllReduce, []string{"--small-bytes", "lots"}, "--small-bytes"},
		{"small-on neither cpu nor device", allreduce.AllReduce, []string{"--small-on", "gpu"}, "--small-on \"gpu\": want cpu or device"},
		{"no such --shm-dir", allreduce.AllReduce, []string{"--shm-dir", "/nonexistent/shm"}, "--shm-dir /nonexistent/shm: no such directory"},
		{"negative size", allreduce.AllReduce, []string{"-b", "-8"}, "-b: invalid byte size"},
		{"size overflows", allreduce.AllReduce, []string{"-e", "9EiB"}, "-e: invalid byte size"},
		{"size too large", allreduce.AllReduce, []string{"-e", "65GiB"}, "at most 64GiB"},
		{"7 bytes of float32", allreduce.AllReduce, []string{"-b", "7", "-e", "7"}, "multiples of the float element size, 4 bytes (e.g. -b 8 -e 8)"},
		{"3 bytes of double", allreduce.AllReduce, []string{"-b", "3", "-e", "3", "-d", "double"}, "multiples of the double element size, 8 bytes"},
		{"odd -e of half", allreduce.AllReduce, []string{"-b", "2", "-e", "1001", "-d", "half"}, "-e 1001"},
		{"odd -b of int64 in a broadcast", allreduce.Broadcast, []string{"-b", "12", "-e", "96", "-d", "int64"}, "element size, 8 bytes"},
		{"reduce-scatter with less than an element per rank", allreduce.ReduceScatter, []string{"--np", "3", "-b", "8", "-e", "1KiB"}, "at least 12 bytes"},
		{"all-gather with less than an element per rank", allreduce.AllGather, []string{"-b", "4", "-e", "4", "-d", "uint8", "--np", "5"}, "at least 5 bytes"},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			_, err := benchValidate(t, tc.coll, tc.args...)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// TestBenchValidateAccepts: the defaults, the help's examples and whole-element
// sizes pass, and sizes mean what the byte-size rule says.
func TestBenchValidateAccepts(t *testing.T) {
	tests := []struct {
		desc     string
		coll     allreduce.Coll
		args     []string
		min, max int64
	}{
		{"defaults", allreduce.AllReduce, nil, 8, 64 << 20},
		{"IEC units", allreduce.AllReduce, []string{"-b", "8KiB", "-e", "64Mi"}, 8 << 10, 64 << 20},
		{"SI units", allreduce.AllReduce, []string{"-b", "8K", "-e", "64MB"}, 8000, 64_000_000},
		{"one byte of uint8", allreduce.AllReduce, []string{"-b", "1", "-e", "1", "-d", "uint8"}, 1, 1},
		{"whole doubles", allreduce.AllReduce, []string{"-b", "8", "-e", "8", "-d", "double"}, 8, 8},
		{"barrier ignores sizes", allreduce.Barrier, []string{"-b", "7", "-e", "7"}, 7, 7},
		{"reduce-scatter rounds down to np blocks", allreduce.ReduceScatter, []string{"--np", "3", "-b", "12", "-e", "1KiB", "-d", "float"}, 12, 1 << 10},
		{"all-gather's default -b is one element per rank", allreduce.AllGather, []string{"--np", "7"}, 28, 64 << 20},
		{"reduce-scatter's default -b is at least 8", allreduce.ReduceScatter, []string{"--np", "3", "-d", "bf16"}, 8, 64 << 20},
		{"help example", allreduce.Broadcast, []string{"--np", "4", "--root", "2", "-b", "1MiB", "-e", "1MiB", "-c", "1"}, 1 << 20, 1 << 20},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			o, err := benchValidate(t, tc.coll, tc.args...)
			require.NoError(t, err)
			require.Equal(t, tc.min, o.spec.MinBytes)
			require.Equal(t, tc.max, o.spec.MaxBytes)
			// 4 MiB, or less where /dev/shm is small (a container's 64 MiB)
			require.Equal(t, allreduce.FitShm(o.spec.NP, 4<<20, o.spec.Slots, comm.ShmCapacity(o.spec.ShmRoot)), o.spec.Chunk,
				"default --chunk 4MiB")
			require.Equal(t, 64<<10, o.spec.Small, "default --small-bytes 64KiB")
		})
	}
}

// TestSizeFlagsStateTheRule: the help of every command that takes a byte
// size says which units are powers of 1024 and which of 1000.
func TestSizeFlagsStateTheRule(t *testing.T) {
	for _, args := range [][]string{
		{"bench", "allreduce"}, {"daemon"}, {"swap", "reserve"}, {"partition", "sim", "attach"},
	} {
		var out bytes.Buffer
		cmd := newRootCmd(streams{In: &bytes.Buffer{}, Out: &out, ErrOut: &out})
		cmd.SetArgs(append(args, "--help"))
		require.NoError(t, cmd.Execute())
		require.Contains(t, out.String(), bytesize.Units, "migctl %v --help", args)
	}
}

// --chunk auto and --mps: the device geometry follows allreduce.Staged for
// the ranks, the host backend keeps 4 MiB where the shared memory has room
// (allreduce.FitShm), and the MPS request sees every
// local rank's GPU (and refuses CUDA IPC).
func TestBenchChunkAutoAndMPS(t *testing.T) {
	o, err := benchValidate(t, allreduce.AllReduce, "--backend", "gpu", "--np", "7", "--gpu", "0", "--shm-dir", t.TempDir())
	require.NoError(t, err)
	want, _ := allreduce.Staged(7, comm.ShmCapacity(t.TempDir()))
	require.Equal(t, want, o.spec.Chunk)
	r := o.mpsRequest()
	require.Equal(t, []int{0, 0, 0, 0, 0, 0, 0}, r.gpus)
	require.Equal(t, "auto", r.mode)
	o, err = benchValidate(t, allreduce.AllReduce, "--backend", "gpu", "--np", "2", "--gpu", "0,1", "--transport", "ipc", "--mps", "on")
	require.NoError(t, err)
	_, _, err = o.mpsRequest().decide()
	require.ErrorContains(t, err, "CUDA IPC")
	require.Equal(t, []int{0, 1}, o.mpsRequest().gpus)
	o, err = benchValidate(t, allreduce.AllReduce, "--backend", "host", "--np", "3")
	require.NoError(t, err)
	require.Equal(t, allreduce.FitShm(3, 4<<20, 8, comm.ShmCapacity(o.spec.ShmRoot)), o.spec.Chunk)
	if comm.ShmCapacity(o.spec.ShmRoot) >= 1<<30 {
		require.Equal(t, 4<<20, o.spec.Chunk)
	}
	_, err = benchValidate(t, allreduce.AllReduce, "--mps", "maybe")
	require.ErrorContains(t, err, `--mps "maybe"`)
}
