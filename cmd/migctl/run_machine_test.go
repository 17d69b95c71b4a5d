package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/internal/limits"
	"github.com/migctl/migctl/trainer"
)

// machineEnv hands the workers the cached figures of the GPUs of this node
// that the job uses, and nothing when the cache describes none of them.
func TestMachineEnv(t *testing.T) {
	gpu := func(uuid string, link, hostMem float64) limits.GPU {
		return limits.GPU{UUID: uuid, H2DGiBs: link, D2HGiBs: link, DuplexGiBs: 2 * link, RoundTripUS: 11,
			HostMemUnderDMAGiBs: hostMem}
	}
	l := limits.Limits{Host: limits.Host{ReduceThreadGiBs: 8.9, ReduceHostGiBs: 73},
		GPUs: []limits.GPU{gpu("GPU-a", 51.3, 147), gpu("GPU-b", 40, 120), gpu("GPU-elsewhere", 60, 200)}}
	tests := []struct {
		desc         string
		node, chosen []string
		want         []string // key=value pairs the entry must hold; nil: no entry
	}{
		{"a job on GPU a", []string{"GPU-a", "GPU-b"}, []string{"GPU-a"},
			[]string{"allreduce.link_gibs=51.3", "allreduce.host_mem_gibs=147", "allreduce.reduce_thread_gibs=8.9"}},
		// Two GPUs: the slower link; no host-memory cap (each GPU was measured alone).
		{"a job on both", []string{"GPU-a", "GPU-b"}, []string{"GPU-b", "GPU-a"},
			[]string{"allreduce.link_gibs=40", "allreduce.host_mem_gibs=0"}},
		{"leased MIG instances: the node's GPUs", []string{"GPU-b"}, nil,
			[]string{"allreduce.link_gibs=40", "allreduce.host_mem_gibs=120"}},
		{"the cached GPU is not on this node", []string{"GPU-c"}, nil, nil},
		{"no driver (a simulated node, CI)", nil, nil, nil},
		{"a chosen GPU the node does not report", []string{"GPU-a"}, []string{"GPU-elsewhere"}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			got := machineEnv(l, tc.node, tc.chosen)
			if tc.want == nil {
				require.Empty(t, got)
				return
			}
			v, ok := strings.CutPrefix(got, trainer.EnvMachine+"=")
			require.True(t, ok, got)
			for _, kv := range tc.want {
				require.Contains(t, strings.Split(v, ","), kv)
			}
		})
	}
	require.Empty(t, machineEnv(limits.Limits{Host: l.Host}, []string{"GPU-a"}, nil), "the host's figures alone: none")
}
