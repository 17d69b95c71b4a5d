package launcher

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/internal/numa"
	"github.com/migctl/migctl/internal/testutil"
)

// Config.Place puts each worker where it says, from the acquired devices
// (recorded in the result's devices) or, without Devices, from NProc
// devices of GPU -1; restarted workers are placed again; the progress line
// groups the ranks.
func TestPlace(t *testing.T) {
	cpus := testutil.CPUs(t, 2) // two, to tell a placement from none
	script := func(dir string) []string {
		return []string{"sh", "-c", `grep Cpus_allowed_list /proc/self/status > "` + dir + `/cpus-$MIGCTL_GENERATION-$RANK"
if [ "$MIGCTL_GENERATION" = 0 ] && [ "$RANK" = 1 ]; then exit 3; fi`}
	}
	read := func(t *testing.T, dir string, gen, rank int) string {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("cpus-%d-%d", gen, rank)))
		require.NoError(t, err)
		f := strings.Fields(string(b))
		require.Len(t, f, 2, string(b))
		return f[1]
	}
	t.Run("with devices", func(t *testing.T) {
		dir := t.TempDir()
		var seen []Device
		var log strings.Builder
		cfg := Config{Command: script(dir), NProc: 3, MaxRestarts: 1, Devices: &fakeDevices{}, Log: &log, Grace: time.Second,
			Place: func(devs []Device) []numa.Placement {
				seen = append([]Device(nil), devs...)
				return []numa.Placement{{Node: -1, CPUs: cpus[:1]}, {Node: -1, CPUs: cpus[1:2]}, numa.None}
			}}
		res, err := Run(context.Background(), cfg)
		require.NoError(t, err, log.String())
		require.Len(t, seen, 3)
		require.Equal(t, "MIG-fake-0", seen[0].Visible)
		for gen := range 2 {
			require.Equal(t, fmt.Sprint(cpus[0]), read(t, dir, gen, 0), "generation %d", gen)
			require.Equal(t, fmt.Sprint(cpus[1]), read(t, dir, gen, 1), "generation %d", gen)
			require.NotEqual(t, fmt.Sprint(cpus[0]), read(t, dir, gen, 2), "rank 2 is not placed")
		}
		require.Equal(t, &numa.Placement{Node: -1, CPUs: cpus[:1]}, res.Devices[0].NUMA)
		require.Nil(t, res.Devices[2].NUMA)
		require.Contains(t, log.String(), fmt.Sprintf("run: placement: ranks 0: CPUs %d; ranks 1: CPUs %d\n", cpus[0], cpus[1]))
	})
	t.Run("without devices", func(t *testing.T) {
		dir := t.TempDir()
		var seen []Device
		cfg := Config{Command: script(dir), NProc: 2, MaxRestarts: 1, Grace: time.Second,
			Place: func(devs []Device) []numa.Placement {
				seen = append([]Device(nil), devs...)
				return []numa.Placement{{Node: -1, CPUs: cpus[1:2]}, {Node: -1, CPUs: cpus[1:2]}}
			}}
		res, err := Run(context.Background(), cfg)
		require.NoError(t, err)
		require.Equal(t, []Device{{GPU: -1}, {GPU: -1}}, seen)
		require.Empty(t, res.Devices)
		require.Equal(t, fmt.Sprint(cpus[1]), read(t, dir, 1, 0))
		require.Equal(t, fmt.Sprint(cpus[1]), read(t, dir, 1, 1))
	})
}
