package ctxmgr

import (
	"context"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/stretchr/testify/require"
)

// fakeNVML knows devices by UUID and by index, each with its free memory.
func fakeNVML(byUUID map[string]uint64, byIndex map[int]uint64) nvml.Interface {
	dev := func(free uint64) nvml.Device {
		return &mock.Device{GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
			return nvml.Memory{Total: 100, Free: free, Used: 100 - free}, nvml.SUCCESS
		}}
	}
	return &mock.Interface{
		DeviceGetHandleByUUIDFunc: func(s string) (nvml.Device, nvml.Return) {
			if f, ok := byUUID[s]; ok {
				return dev(f), nvml.SUCCESS
			}
			return nil, nvml.ERROR_NOT_FOUND
		},
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			if f, ok := byIndex[i]; ok {
				return dev(f), nvml.SUCCESS
			}
			return nil, nvml.ERROR_INVALID_ARGUMENT
		},
		ErrorStringFunc: func(r nvml.Return) string {
			return map[nvml.Return]string{nvml.ERROR_NOT_FOUND: "Not Found", nvml.ERROR_INVALID_ARGUMENT: "Invalid Argument"}[r]
		},
	}
}

func TestNVMLMemory(t *testing.T) {
	mem := NewNVMLMemory(fakeNVML(map[string]uint64{"GPU-aa": 10, "MIG-bb": 20}, map[int]uint64{0: 30}))
	tests := []struct {
		device  string
		want    int64
		wantErr string
	}{
		{"GPU-aa", 10, ""},
		{"MIG-bb", 20, ""},
		{"GPU-bb", 20, ""}, // CUDA's spelling of a MIG device's UUID
		{"0", 30, ""},
		{"GPU-cc", 0, `finding device "GPU-cc": Not Found`},
		{"7", 0, `finding device "7": Invalid Argument`},
		{"gpu zero", 0, "neither a UUID nor an ordinal"},
	}
	for _, tc := range tests {
		t.Run(tc.device, func(t *testing.T) {
			got, err := mem.Free(context.Background(), tc.device)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}
