package numa

import (
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/migctl/migctl/internal/testutil"
)

func TestParseAndFormatList(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []int
		out  string
	}{
		{"", nil, ""},
		{"0", []int{0}, "0"},
		{"0-3", []int{0, 1, 2, 3}, "0-3"},
		{"0-3,8-11\n", []int{0, 1, 2, 3, 8, 9, 10, 11}, "0-3,8-11"},
		{"5,1,2,3,5", []int{1, 2, 3, 5}, "1-3,5"},
		{"0-1,1-2", []int{0, 1, 2}, "0-2"},
	} {
		got, err := ParseList(tc.in)
		require.NoError(t, err, tc.in)
		require.Equal(t, tc.want, got, tc.in)
		require.Equal(t, tc.out, FormatList(got), tc.in)
	}
	for _, bad := range []string{"a", "3-1", "-1", "1-", "0-99999999"} {
		_, err := ParseList(bad)
		require.Error(t, err, bad)
	}
}

func TestBusID(t *testing.T) {
	require.Equal(t, "0000:17:00.0", BusID("00000000:17:00.0"))
	require.Equal(t, "0000:9a:00.0", BusID("00000000:9A:00.0 "))
	require.Equal(t, "0000:17:00.0", BusID("0000:17:00.0"))
}

// fakeSysfs writes a sysfs tree of two nodes with a GPU on each, one
// device that does not know its node, and one without a CPU list.
func fakeSysfs(t *testing.T) Sysfs {
	t.Helper()
	return Sysfs(testutil.WriteTree(t, map[string]string{
		"devices/system/node/online":                 "0-1",
		"bus/pci/devices/0000:17:00.0/numa_node":     "0",
		"bus/pci/devices/0000:17:00.0/local_cpulist": "0-15,32-47",
		"bus/pci/devices/0000:9a:00.0/numa_node":     "1",
		"bus/pci/devices/0000:9a:00.0/local_cpulist": "16-31,48-63",
		"bus/pci/devices/0000:01:00.0/numa_node":     "-1",
		"bus/pci/devices/0000:02:00.0/numa_node":     "1",
	}))
}

func list(t *testing.T, s string) []int {
	t.Helper()
	l, err := ParseList(s)
	require.NoError(t, err)
	require.Equal(t, s, FormatList(l))
	return l
}

func TestSysfs(t *testing.T) {
	s := fakeSysfs(t)
	nodes, err := s.Nodes()
	require.NoError(t, err)
	require.Equal(t, []int{0, 1}, nodes)
	for _, tc := range []struct {
		bus  string
		want Placement
		err  string
	}{
		{"0000:17:00.0", Placement{Node: 0, CPUs: list(t, "0-15,32-47")}, ""},
		{"0000:9a:00.0", Placement{Node: 1, CPUs: list(t, "16-31,48-63")}, ""},
		{"0000:01:00.0", None, ""},                        // the platform does not say
		{"0000:02:00.0", Placement{Node: 1}, ""},          // no CPU list
		{"0000:ff:00.0", None, "NUMA node of PCI device"}, // no such device
		{"", None, "no PCI address"},
	} {
		got, err := s.Device(tc.bus)
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err, tc.bus)
			continue
		}
		require.NoError(t, err, tc.bus)
		require.Equal(t, tc.want, got, tc.bus)
	}
	one, err := Sysfs(t.TempDir()).Nodes()
	require.NoError(t, err)
	require.Equal(t, []int{0}, one, "a kernel without NUMA: one node")
}

// A process started with a placement runs on its CPUs with its memory
// preferred on its node, and outlives the call; the caller's threads keep
// what they had.
func TestStartPlacesTheChild(t *testing.T) {
	var mine unix.CPUSet
	require.NoError(t, unix.SchedGetaffinity(0, &mine))
	first := testutil.CPUs(t, 1)[0]
	var out strings.Builder
	// Started as the supervisor starts workers: killed if the thread that
	// forked it exits, so that thread must live on.
	cmd := exec.Command("sh", "-c", "sleep 0.3; grep Cpus_allowed_list /proc/self/status; head -1 /proc/self/numa_maps")
	cmd.Stdout = &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	placeErr, err := Start(Placement{Node: 0, CPUs: []int{first}}, cmd.Start)
	require.NoError(t, err)
	require.NoError(t, cmd.Wait())
	if placeErr != nil {
		t.Skipf("this kernel or container refuses placement: %v", placeErr)
	}
	require.Contains(t, out.String(), "Cpus_allowed_list:\t"+FormatList([]int{first})+"\n")
	require.Contains(t, out.String(), " prefer:0 ", "the child's memory policy")

	// Every thread of this process still has the CPUs it had.
	var wg sync.WaitGroup
	bad := make(chan string, 64)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var now unix.CPUSet
			if err := unix.SchedGetaffinity(0, &now); err == nil && now != mine {
				bad <- "a thread of the caller kept the child's CPUs"
			}
		}()
	}
	wg.Wait()
	close(bad)
	require.Empty(t, <-bad)
}

func TestStartWithoutPlacementAndRefusals(t *testing.T) {
	ran := 0
	placeErr, err := Start(None, func() error { ran++; return nil })
	require.NoError(t, placeErr)
	require.NoError(t, err)
	require.Equal(t, 1, ran)
	// CPUs that are not ours: refused, and the process still starts.
	placeErr, err = Start(Placement{Node: -1, CPUs: []int{1000}}, func() error { ran++; return nil })
	require.NoError(t, err)
	require.ErrorContains(t, placeErr, "none of CPUs 1000 is ours to use")
	require.Equal(t, 2, ran)
}
