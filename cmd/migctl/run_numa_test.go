package main

import (
	"fmt"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/migctl/migctl/internal/numa"
	"github.com/migctl/migctl/internal/testutil"
)

// twoSocketSysfs writes a sysfs tree of a host of two NUMA nodes whose
// GPUs at the given buses (sysfs form) sit on node bus→node with the CPUs
// cpus[node], and returns its root.
func twoSocketSysfs(t *testing.T, nodes map[string]int, cpus [2]string) string {
	t.Helper()
	files := map[string]string{"devices/system/node/online": "0-1"}
	for bus, n := range nodes {
		files["bus/pci/devices/"+bus+"/numa_node"] = fmt.Sprint(n)
		files["bus/pci/devices/"+bus+"/local_cpulist"] = cpus[n]
	}
	return testutil.WriteTree(t, files)
}

// migctl run --numa on binds each worker to the CPUs local to its GPU and
// prefers its memory on the GPU's node (here a fake sysfs of two nodes,
// the simulated node's GPU 0 on node 0 with this machine's first CPU), says
// so in the summary, and warns, still running the worker, where the kernel
// refuses (GPU 4 on a node 1 this machine does not have); --numa off places
// nothing and tells the workers' SDK so.
func TestRunNUMAPlacement(t *testing.T) {
	first := testutil.CPUs(t, 1)[0]
	if err := unix.SetMemPolicy(unix.MPOL_DEFAULT, nil); err != nil {
		t.Skipf("no NUMA memory policies here: %v", err)
	}
	root := twoSocketSysfs(t, map[string]int{"0000:18:00.0": 0, "0000:9a:00.0": 1}, [2]string{fmt.Sprint(first), fmt.Sprint(first)})
	r := newRunCLI(t, testutil.MigctlBin(t))
	env := []string{numa.EnvSysfs + "=" + root}
	probe := `grep Cpus_allowed_list /proc/self/status; head -1 /proc/self/numa_maps; echo MIGCTL_NUMA=$MIGCTL_NUMA`
	allowed := regexp.MustCompile(`Cpus_allowed_list:\s+(\S+)`)

	stdout, stderr, err := r.run(t, env, append(r.sim, "--np", "2", "--profile", "1g.18gb", "--lease-gpu", "0",
		"--backend", "gpu", "--numa", "on", "-o", "json", "--", "sh", "-c", probe)...)
	require.NoError(t, err, stderr)
	res := summary(t, stdout)
	require.Len(t, res.Devices, 2)
	for _, d := range res.Devices {
		require.Equal(t, &numa.Placement{Node: 0, CPUs: []int{first}}, d.NUMA)
	}
	for rank := range 2 {
		m := regexp.MustCompile(fmt.Sprintf(`\[%d\]: Cpus_allowed_list:\s+(\S+)`, rank)).FindStringSubmatch(stdout)
		require.NotNil(t, m, stdout)
		require.Equal(t, fmt.Sprint(first), m[1], "rank %d's CPUs", rank)
		require.Regexp(t, fmt.Sprintf(`\[%d\]: \S+ prefer:0 `, rank), stdout, "rank %d's memory policy", rank)
	}
	require.Contains(t, stderr, fmt.Sprintf("run: placement: ranks 0-1: node 0, CPUs %d", first))

	// Node 1 does not exist here: the worker starts, bound to its CPUs, and
	// the run warns.
	stdout, stderr, err = r.run(t, env, append(r.sim, "--np", "1", "--profile", "1g.18gb", "--lease-gpu", "4",
		"--backend", "gpu", "--numa", "on", "--", "sh", "-c", probe)...)
	require.NoError(t, err, stderr)
	require.Contains(t, stderr, "run: warning: rank 0 runs where the kernel put it: preferring memory on node 1")
	m := allowed.FindStringSubmatch(stdout)
	require.NotNil(t, m, stdout)
	require.Equal(t, fmt.Sprint(first), m[1])

	// --numa off: nothing placed.
	stdout, stderr, err = r.run(t, env, append(r.sim, "--np", "1", "--profile", "1g.18gb", "--lease-gpu", "0",
		"--backend", "gpu", "--numa", "off", "--", "sh", "-c", probe)...)
	require.NoError(t, err, stderr)
	require.NotContains(t, stderr, "placement")
	require.NotContains(t, stdout, "prefer:")
	require.Contains(t, stdout, "[0]: MIGCTL_NUMA=off", "the SDK is told to leave its arena alone too")
	r.requireClean(t)
}
