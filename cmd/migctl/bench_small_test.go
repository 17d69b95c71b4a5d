package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/internal/testutil"
)

// TestBenchSmallMessages runs all-reduces that cross the small-message
// threshold, across real processes on the host backend, with MIGCTL_TRACE
// on: every result is right, sizes up to --small-bytes take the
// small-message schedule and larger ones the host-staged one (as the trace
// on rank 0 reports), and --small-bytes 0 turns the small path off.
func TestBenchSmallMessages(t *testing.T) {
	shmDir := t.TempDir()
	tests := []struct {
		np        int
		op, dtype string
		small     string
		smallMax  int // largest size expected on the small path (0: none)
		inPlace   bool
		smallOn   string // --small-on (default cpu)
	}{
		{np: 3, op: "sum", dtype: "float", small: "64KiB", smallMax: 64 << 10},
		{np: 7, op: "avg", dtype: "float", small: "4KiB", smallMax: 4 << 10, inPlace: true},
		{np: 2, op: "max", dtype: "bfloat16", small: "0"},
		{np: 1, op: "sum", dtype: "int32", small: "64KiB", smallMax: 64 << 10},
		// On the devices: the host backend's streams cannot wait for the
		// flags, so the CPU does and the host stream reduces.
		{np: 3, op: "avg", dtype: "half", small: "64KiB", smallMax: 64 << 10, smallOn: "device"},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("np%d/%s/%s/small=%s/on=%s", tc.np, tc.op, tc.dtype, tc.small, tc.smallOn), func(t *testing.T) {
			args := []string{"bench", "allreduce", "--np", strconv.Itoa(tc.np), "--backend", "host", "--op", tc.op,
				"--dtype", tc.dtype, "-b", "4", "-e", "256KiB", "-f", "4", "-n", "3", "-w", "1", "-c", "1",
				"--chunk", "64KiB", "--slots", "4", "--small-bytes", tc.small, "--timeout", "60s", "--shm-dir", shmDir, "-q", "-o", "json"}
			if tc.smallOn != "" {
				args = append(args, "--small-on", tc.smallOn)
			}
			if tc.inPlace {
				args = append(args, "--inplace")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, testutil.MigctlBin(t), args...)
			cmd.Env = append(os.Environ(), "MIGCTL_TRACE=1")
			var out, errOut bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errOut
			require.NoError(t, cmd.Run(), "stderr:\n%s", errOut.String())
			var rep benchReport
			require.NoError(t, json.Unmarshal(out.Bytes(), &rep))
			require.Len(t, rep.Results, 9)
			if tc.smallOn == "device" {
				require.Equal(t, "device, flags by the CPU", rep.SmallOn)
			} else {
				require.Empty(t, rep.SmallOn)
			}
			for _, row := range rep.Results {
				require.Zero(t, row.Wrong, "row %+v", row)
			}
			// The trace: one block per size, named after its schedule.
			blocks := regexp.MustCompile(`allreduce (hoststaged(?:-small)?) (\d+) B: (\d+) calls`).FindAllStringSubmatch(errOut.String(), -1)
			require.Len(t, blocks, 9, "trace:\n%s", errOut.String())
			for _, b := range blocks {
				size, _ := strconv.Atoi(b[2])
				want := "hoststaged"
				if size <= tc.smallMax {
					want = "hoststaged-small"
				}
				require.Equal(t, want, b[1], "%d bytes", size)
				require.Equal(t, "5", b[3], "%d bytes: warm-up, 3 timed and the checked call", size)
			}
		})
	}
}
