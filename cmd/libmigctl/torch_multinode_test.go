package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Two "nodes" on one machine: `migctl run --nnodes 2 --node-rank i
// --rdzv-endpoint 127.0.0.1:PORT --np 2` twice in parallel, host backend.
// migctl_torch forms one migctl group per node (separate shared-memory
// segments: the job name plus the node) and joins the nodes over gloo on
// loopback (python/migctl_torch/multinode.py).

// freePortPair returns a port p with p and p+1 free (the rendezvous and
// MASTER_PORT, which `migctl run` puts after it).
func freePortPair(t *testing.T) int {
	t.Helper()
	for range 50 {
		p := freePort(t)
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+1))
		if err == nil {
			l.Close()
			return p
		}
	}
	t.Fatal("no two consecutive free ports on 127.0.0.1")
	return 0
}

// nodeRun is what one node's `migctl run` printed and how it ended.
type nodeRun struct {
	out  bytes.Buffer
	err  error
	done time.Time
}

// startNodes runs script under `migctl run` on nodes simulated nodes of np
// ranks each (host backend, one shared-memory directory, a fresh job token)
// and returns once every node's run has ended.
func startNodes(t *testing.T, nodes, np int, limit time.Duration, shm, script string, args ...string) []*nodeRun {
	t.Helper()
	lib, bin := artifacts(t)
	needTorch(t)
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	b := make([]byte, 16)
	_, err := rand.Read(b)
	require.NoError(t, err)
	endpoint := fmt.Sprintf("127.0.0.1:%d", freePortPair(t))
	runs := make([]*nodeRun, nodes)
	var wg sync.WaitGroup
	for i := range nodes {
		argv := append([]string{"run", "--backend", "host", "--nnodes", fmt.Sprint(nodes), "--node-rank", fmt.Sprint(i),
			"--rdzv-endpoint", endpoint, "--np", fmt.Sprint(np), "--shm-dir", shm, "-q", "--timeout", "60s", "--",
			python, filepath.Join(repoRoot(t), "python", "tests", script)}, args...)
		cmd := exec.CommandContext(ctx, bin, argv...)
		cmd.Env = append(os.Environ(), "MIGCTL_LIB="+lib, "OMP_NUM_THREADS=1", "MIGCTL_JOB_TOKEN="+hex.EncodeToString(b))
		run := &nodeRun{}
		runs[i] = run
		cmd.Stdout, cmd.Stderr = &run.out, &run.out
		cmd.WaitDelay = 5 * time.Second
		wg.Add(1)
		go func() {
			defer wg.Done()
			run.err = cmd.Run()
			run.done = time.Now()
		}()
	}
	wg.Wait()
	return runs
}

// runNodes runs script as startNodes does and returns every rank's JSON
// line (none with failures, each from the hierarchical path).
func runNodes(t *testing.T, nodes, np int, limit time.Duration, script string, args ...string) map[int]map[string]any {
	t.Helper()
	shm := t.TempDir()
	runs := startNodes(t, nodes, np, limit, shm, script, args...)
	lines := map[int]map[string]any{}
	for i, run := range runs {
		require.NoError(t, run.err, "node %d of %s:\n%s", i, script, run.out.String())
		for r, m := range rankLines(t, run.out.String()) {
			require.Equal(t, i, r/np, "rank %d printed on node %d", r, i)
			lines[r] = m
		}
	}
	require.Len(t, lines, nodes*np, "one JSON line per rank")
	for r, m := range lines {
		f, _ := m["failures"].([]any)
		require.Empty(t, f, "rank %d of %s:\n%v", r, script, m)
		require.Equal(t, float64(nodes), m["nodes"], "rank %d: the hierarchical (multi-node) path", r)
	}
	entries, err := os.ReadDir(shm)
	require.NoError(t, err)
	require.Empty(t, entries, "shared-memory segments left behind")
	return lines
}

// TestTorchTwoNodesOps: every op, dtype and odd size across 2 nodes x 2
// ranks, each node's migctl group of 2 ranks.
func TestTorchTwoNodesOps(t *testing.T) {
	for r, m := range runNodes(t, 2, 2, 3*time.Minute, "ops_check.py", "--sizes", "0,1,7,1001", "--large", "0") {
		require.Greater(t, m["checks"].(float64), 700.0, "rank %d", r)
		require.Equal(t, 2.0, m["local_size"], "rank %d", r)
		require.Equal(t, 4.0, m["world"], "rank %d", r)
	}
}

// TestTorchTwoNodesSubgroups: in a job across nodes, groups of some of the
// ranks on one node run on that node's migctl group, and one across nodes is
// a gloo group; every collective and DDP on the pairs as on one node.
func TestTorchTwoNodesSubgroups(t *testing.T) {
	for r, m := range runNodes(t, 2, 2, 3*time.Minute, "subgroup_check.py") {
		require.Greater(t, m["checks"].(float64), 10.0, "rank %d", r)
	}
}

// TestTorchTwoNodesPointToPoint: in a job across nodes, transfers between
// ranks of one node run on the node's migctl group (a ring within each
// node, order, a two-stage pipeline); one across nodes raises
// NotImplementedError.
func TestTorchTwoNodesPointToPoint(t *testing.T) {
	for r, m := range runNodes(t, 2, 2, 3*time.Minute, "p2p_check.py") {
		require.Equal(t, 2.0, m["nodes"], "rank %d", r)
		require.Greater(t, m["checks"].(float64), 25.0, "rank %d", r)
	}
}

// TestTorchTwoNodesDDPMatchesGloo: DDP over the hierarchical backend (and
// the comm hook) ends with gloo's parameters to fp32 round-off.
func TestTorchTwoNodesDDPMatchesGloo(t *testing.T) {
	for r, m := range runNodes(t, 2, 2, 3*time.Minute, "ddp_check.py") {
		require.LessOrEqual(t, m["max_diff_migctl_gloo"].(float64), 1e-5, "rank %d", r)
		require.LessOrEqual(t, m["max_diff_hook_gloo"].(float64), 1e-5, "rank %d", r)
	}
}

// TestTorchTwoNodesKilledRank: rank 3 (node 1) SIGKILLs itself mid-loop; its
// node's launcher stops node 1, and the ranks of node 0, which reach node 1
// only through gloo, raise soon after (a closed connection, or their node
// peer's exit), not at a deadline.
func TestTorchTwoNodesKilledRank(t *testing.T) {
	shm := t.TempDir()
	runs := startNodes(t, 2, 2, 2*time.Minute, shm, "kill_check.py", "--kill", "3")
	require.Error(t, runs[1].err, "node 1 lost rank 3:\n%s", runs[1].out.String())
	require.NoError(t, runs[0].err, "node 0's ranks must raise and exit cleanly:\n%s", runs[0].out.String())
	lines := rankLines(t, runs[0].out.String())
	for _, r := range []int{0, 1} {
		require.Equal(t, true, lines[r]["raised"], "rank %d:\n%s", r, runs[0].out.String())
	}
	after := runs[0].done.Sub(runs[1].done)
	require.Less(t, after, 30*time.Second, "node 0 ended %v after node 1", after)
	t.Logf("node 0 ended %v after node 1: %v", after.Round(time.Millisecond), lines[0]["error"])
}
