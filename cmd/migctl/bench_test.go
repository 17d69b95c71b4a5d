package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseBytes(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		bad  bool
	}{
		{"8", 8, false}, {"8K", 8 << 10, false}, {"256M", 256 << 20, false}, {"1G", 1 << 30, false},
		{"64MiB", 64 << 20, false}, {"4kb", 4 << 10, false}, {"", 0, true}, {"-1", 0, true}, {"1T", 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := parseBytes(tc.in)
			if tc.bad {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestBenchSizesAndBusFactor(t *testing.T) {
	s := benchSpec{Coll: "allreduce", MinBytes: 8, MaxBytes: 256 << 20, Factor: 2}
	sizes := benchSizes(s)
	require.Len(t, sizes, 26)
	require.Equal(t, int64(8), sizes[0])
	require.Equal(t, int64(256<<20), sizes[25])
	require.Equal(t, []int64{0}, benchSizes(benchSpec{Coll: "barrier"}))
	require.InDelta(t, 2*6.0/7, busFactor("allreduce", 7), 1e-12)
	require.InDelta(t, 6.0/7, busFactor("allgather", 7), 1e-12)
	require.InDelta(t, 1, busFactor("broadcast", 7), 1e-12)
}

func TestBenchFlagsValidated(t *testing.T) {
	tests := []struct {
		desc string
		args []string
	}{
		{"unknown backend", []string{"bench", "allreduce", "--backend", "tpu"}},
		{"ipc on the host backend", []string{"bench", "allreduce", "--transport", "ipc"}},
		{"sizes reversed", []string{"bench", "allreduce", "-b", "1M", "-e", "1K"}},
		{"bad dtype", []string{"bench", "allreduce", "--dtype", "complex"}},
		{"bad op", []string{"bench", "allreduce", "--op", "prod"}},
		{"root outside", []string{"bench", "broadcast", "--np", "2", "--root", "2"}},
		{"joining without a token", []string{"bench", "allreduce", "--rendezvous", "127.0.0.1:1"}},
		{"chunk too small", []string{"bench", "allreduce", "--chunk", "1K"}},
		{"small-bytes not a size", []string{"bench", "allreduce", "--small-bytes", "lots"}},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			var out, errOut bytes.Buffer
			cmd := newRootCmd(streams{In: &bytes.Buffer{}, Out: &out, ErrOut: &errOut})
			cmd.SetArgs(tc.args)
			require.Error(t, cmd.Execute())
			require.Empty(t, out.String(), "nothing runs")
		})
	}
}
