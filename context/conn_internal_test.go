package ctxmgr

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestInnermostNSpid(t *testing.T) {
	tests := []struct {
		desc   string
		status string
		want   int
		ok     bool
	}{
		{"host process", "Name:\tx\nPid:\t4242\nNSpid:\t4242\n", 4242, true},
		{"in a container", "Pid:\t4242\nNSpid:\t4242\t17\n", 17, true},
		{"nested", "NSpid:\t4242\t300\t1\n", 1, true},
		{"old kernel", "Name:\tx\nPid:\t4242\n", 0, false},
		{"empty line", "NSpid:\n", 0, false},
		{"garbage", "NSpid:\tabc\n", 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			got, ok := innermostNSpid(tc.status)
			require.Equal(t, tc.ok, ok)
			if ok {
				require.Equal(t, tc.want, got)
			}
		})
	}
}

func TestShimPID(t *testing.T) {
	const self = 100
	tests := []struct {
		desc         string
		claim        int
		peer         peerProc
		pid, peerPID int
		wantErr      string
	}{
		{"own pid", 4242, peerProc{pid: 4242, nspid: 4242}, 4242, 0, ""},
		{"no claim", 0, peerProc{pid: 4242, nspid: 4242}, 4242, 0, ""},
		{"no claim in a container", 0, peerProc{pid: 4242, nspid: 7}, 4242, 0, ""},
		{"namespace pid", 7, peerProc{pid: 4242, nspid: 7}, 7, 4242, ""},
		{"host pid from a container", 4242, peerProc{pid: 4242, nspid: 7}, 4242, 0, ""},
		{"foreign pid", 1, peerProc{pid: 4242, nspid: 4242}, 0, 0, "hello claims pid 1, but the connecting process is pid 4242"},
		{"foreign pid from a container", 8, peerProc{pid: 4242, nspid: 7}, 0, 0, "is pid 4242 (pid 7 in its own namespace)"},
		{"in-process fake", 555, peerProc{pid: self, nspid: self}, 555, self, ""},
		{"peer outside the daemon's namespace", 0, peerProc{}, 0, 0, "not in the daemon's pid namespace"},
		{"claim from outside the daemon's namespace", 9, peerProc{}, 0, 0, "not in the daemon's pid namespace"},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			pid, peerPID, err := shimPID(tc.claim, tc.peer, self)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.pid, pid)
			require.Equal(t, tc.peerPID, peerPID)
		})
	}
}

func TestDeviceLimit(t *testing.T) {
	ctx := context.Background()
	m := NewManager(Options{GPUMemory: 80 << 30})
	got, err := m.deviceLimit(ctx, "GPU-any")
	require.NoError(t, err)
	require.Equal(t, int64(80<<30), got, "declared memory: the capacity")

	m = NewManager(Options{})
	got, err = m.deviceLimit(ctx, "0")
	require.NoError(t, err)
	require.Equal(t, int64(1)<<44, got, "nothing declared: the protocol's bound")

	nv := NewManager(Options{Memory: NewNVMLMemory(fakeNVML(map[string]uint64{"GPU-aa": 10}, nil))})
	got, err = nv.deviceLimit(ctx, "GPU-aa")
	require.NoError(t, err)
	require.Equal(t, int64(100), got, "NVML: the device's total memory")
	_, err = nv.deviceLimit(ctx, "GPU-zz")
	require.ErrorContains(t, err, `unknown device "GPU-zz"`)
}
