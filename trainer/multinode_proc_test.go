package trainer

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
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/comm/rendezvous"
	"github.com/migctl/migctl/comm/shm"
	"github.com/migctl/migctl/internal/cuda"
	"github.com/migctl/migctl/internal/nccl"
)

// The environment of TestGroupAcrossNodesProcesses (the GPU script sets
// them; CI runs the defaults).
const (
	// envMNChild marks a child process (one rank).
	envMNChild = "MIGCTL_MN_CHILD"
	// envMNHost is the host name a child reports ("node<i>").
	envMNHost = "MIGCTL_MN_HOST"
	// envMNBackend: host (default; the fake NCCL) or gpu (NCCL, one GPU
	// per node: CUDA_VISIBLE_DEVICES=<node>; see envMNOneGPU).
	envMNBackend = "MIGCTL_MN_BACKEND"
	// envMNNodes and envMNPerNode: the layout (default 2 × 2).
	envMNNodes   = "MIGCTL_MN_NODES"
	envMNPerNode = "MIGCTL_MN_PER_NODE"
	// envMNBytes: the size of a timed all-reduce after the checks (0: none).
	envMNBytes = "MIGCTL_MN_BYTES"
	// envMNRequire=1 fails instead of skipping when GPUs or NCCL are missing.
	envMNRequire = "MIGCTL_MN_REQUIRE"
	// envMNOneGPU=1 (gpu backend) puts every node on GPU 0, each with its
	// own NCCL_HOSTID: NCCL then takes the nodes for separate hosts (its
	// duplicate-GPU check is per host) and connects them over its network
	// transport, so the inter-node stage runs on one GPU too.
	envMNOneGPU = "MIGCTL_MN_ONE_GPU"
)

func envInt(key string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(key)); err == nil && v > 0 {
		return v
	}
	return def
}

// A group across "nodes" made of separate processes, as `migctl run
// --nnodes N --node-rank i` starts them (torchrun's variables, one
// rendezvous, a shared-memory root per node): every collective checked
// element by element on every rank. On the host backend (CI) the nodes
// meet over the fake NCCL across processes; with MIGCTL_MN_BACKEND=gpu
// (scripts/h200-session.d/nccl-2node.sh) over the real NCCL, one GPU per
// node (or all on GPU 0 with MIGCTL_MN_ONE_GPU=1), and a timed all-reduce
// of MIGCTL_MN_BYTES is reported.
func TestGroupAcrossNodesProcesses(t *testing.T) {
	if os.Getenv(envMNChild) == "1" {
		mnChild(t)
		return
	}
	backend := os.Getenv(envMNBackend)
	if backend == "" {
		backend = "host"
	}
	nodes, per := envInt(envMNNodes, 2), envInt(envMNPerNode, 2)
	oneGPU := os.Getenv(envMNOneGPU) == "1"
	gpus := nodes // GPUs the layout needs
	if oneGPU {
		gpus = 1
	}
	skip := func(format string, args ...any) {
		if os.Getenv(envMNRequire) == "1" {
			t.Fatalf(format, args...)
		}
		t.Skipf(format, args...)
	}
	if backend == "gpu" {
		api, err := cuda.Open()
		if err != nil {
			skip("SKIP: no CUDA driver: %v", err)
		}
		n := 0
		if api.Init(0) == nil {
			n, _ = api.DeviceGetCount()
		}
		if n < gpus {
			skip("SKIP: %d nodes need %d GPUs (one each; %s=1 puts them all on GPU 0), this machine has %d",
				nodes, gpus, envMNOneGPU, n)
		}
		if _, err := nccl.Open(); err != nil {
			skip("SKIP: %v", err)
		}
	}
	world := nodes * per
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	token := hex.EncodeToString(b)
	srv, err := rendezvous.NewServer(token, world)
	require.NoError(t, err)
	dir := t.TempDir()
	shmBase := dir // the nodes' shared-memory roots
	if backend == "gpu" {
		// The GPU pins the segments' pages, which needs a memory file
		// system (see shmRootHint); the temp dir may be on a disk.
		var err error
		shmBase, err = os.MkdirTemp(shm.DefaultRoot, "migctl-mn-test-")
		require.NoError(t, err)
		t.Cleanup(func() { _ = os.RemoveAll(shmBase) })
	}
	sock := filepath.Join(dir, "rdzv.sock")
	lis, err := net.Listen("unix", sock)
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmds := make([]*exec.Cmd, world)
	outs := make([]*bytes.Buffer, world)
	for r := range world {
		node, local := r/per, r%per
		root := filepath.Join(shmBase, fmt.Sprintf("shm-node%d", node))
		require.NoError(t, os.MkdirAll(root, 0o700))
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestGroupAcrossNodesProcesses$", "-test.count=1", "-test.v")
		env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
			return strings.HasPrefix(kv, "MIGCTL_") && !strings.HasPrefix(kv, "MIGCTL_MN_") && !strings.HasPrefix(kv, nccl.EnvLibrary+"=")
		})
		env = append(env, envMNChild+"=1", envMNHost+"="+fmt.Sprintf("node%d", node), envMNBackend+"="+backend,
			EnvRank+"="+strconv.Itoa(r), EnvWorldSize+"="+strconv.Itoa(world),
			EnvLocalRank+"="+strconv.Itoa(local), EnvLocalWorldSize+"="+strconv.Itoa(per),
			EnvGroupRank+"="+strconv.Itoa(node), EnvGroupWorldSize+"="+strconv.Itoa(nodes),
			EnvRendezvous+"=unix://"+sock, EnvToken+"="+token, EnvJob+"=mn-test", EnvShmRoot+"="+root,
			EnvTimeout+"=60s", EnvBackend+"="+backend)
		switch {
		case backend == "gpu" && oneGPU:
			env = append(env, "CUDA_VISIBLE_DEVICES=0", fmt.Sprintf("NCCL_HOSTID=migctl-mn-node%d", node))
		case backend == "gpu":
			env = append(env, "CUDA_VISIBLE_DEVICES="+strconv.Itoa(node))
		default:
			env = append(env, EnvNCCLFake+"=1")
		}
		cmd.Env = env
		outs[r] = &bytes.Buffer{}
		cmd.Stdout, cmd.Stderr = outs[r], outs[r]
		require.NoError(t, cmd.Start())
		cmds[r] = cmd
	}
	var failed []string
	for r, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			failed = append(failed, fmt.Sprintf("rank %d: %v", r, err))
		}
	}
	for r := range world {
		for _, line := range strings.Split(outs[r].String(), "\n") {
			if strings.HasPrefix(line, "MNRESULT") {
				t.Log(line)
			}
		}
		if len(failed) > 0 {
			t.Logf("rank %d output:\n%s", r, outs[r].String())
		}
	}
	require.Empty(t, failed)
	for r := range world {
		require.Contains(t, outs[r].String(), fmt.Sprintf("MNRESULT rank=%d ok", r))
	}
}

// mnChild is one rank of TestGroupAcrossNodesProcesses.
func mnChild(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g, err := Init(ctx, withHost(os.Getenv(envMNHost)))
	require.NoError(t, err)
	defer func() { require.NoError(t, g.Close()) }()
	r, n := g.Rank(), g.Size()
	require.Equal(t, envInt(envMNPerNode, 2), g.LocalSize())
	counts := []int{1, 5, 1003, 70001}
	if g.Backend() == BackendGPU {
		counts = append(counts, 1<<22)
	}
	wrong := 0
	check := func(what string, got []float32, want func(i int) float32) {
		bad := 0
		for i := range got {
			if got[i] != want(i) {
				if bad == 0 {
					t.Errorf("rank %d: %s element %d = %v, want %v", r, what, i, got[i], want(i))
				}
				bad++
			}
		}
		wrong += bad
	}
	sum := func(i int) float32 { // exact: small integers
		var s float32
		for q := range n {
			s += input(q, i)
		}
		return s
	}
	in := func(count int) []float32 {
		v := make([]float32, count)
		for i := range v {
			v[i] = input(r, i)
		}
		return v
	}
	for _, count := range counts {
		buf := in(count)
		require.NoError(t, g.AllReduce(ctx, HostSlice(buf), HostSlice(buf), Sum))
		check(fmt.Sprintf("allreduce sum of %d", count), buf, sum)
		out := make([]float32, count)
		require.NoError(t, g.AllReduce(ctx, HostSlice(in(count)), HostSlice(out), Max))
		check(fmt.Sprintf("allreduce max of %d", count), out, func(i int) float32 { return input(n-1, i) })
		if count > 1<<20 {
			continue
		}
		rs := make([]float32, count)
		require.NoError(t, g.ReduceScatter(ctx, HostSlice(in(count*n)), HostSlice(rs), Sum))
		check(fmt.Sprintf("reducescatter of %d", count), rs, func(i int) float32 { return sum(r*count + i) })
		ag := make([]float32, count*n)
		require.NoError(t, g.AllGather(ctx, HostSlice(in(count)), HostSlice(ag)))
		check(fmt.Sprintf("allgather of %d", count), ag, func(i int) float32 { return input(i/count, i%count) })
		bc := in(count)
		require.NoError(t, g.Broadcast(ctx, HostSlice(bc), HostSlice(bc), n-1))
		check(fmt.Sprintf("broadcast of %d", count), bc, func(i int) float32 { return input(n-1, i) })
		require.NoError(t, g.Barrier(ctx))
	}
	var ms float64
	if bytes := envInt(envMNBytes, 0); bytes > 0 {
		count := bytes / 4
		buf := Buffer{}
		host := in(count)
		if g.Backend() == BackendGPU {
			if buf, err = g.Alloc(count, Float32); err == nil {
				err = g.Write(ctx, buf, HostSlice(host).Host())
			}
			require.NoError(t, err)
		} else {
			buf = HostSlice(host)
		}
		var times []float64
		for it := range 13 {
			require.NoError(t, g.Barrier(ctx))
			start := time.Now()
			require.NoError(t, g.AllReduce(ctx, buf, buf, Avg))
			if it >= 3 {
				times = append(times, float64(time.Since(start).Microseconds())/1000)
			}
		}
		slices.Sort(times)
		ms = times[len(times)/2]
		if g.Backend() == BackendGPU {
			require.NoError(t, g.Free(buf))
		}
	}
	fmt.Printf("MNRESULT rank=%d ok nodes=%d per_node=%d local=%d backend=%s algo=%s wrong=%d bytes=%d median_ms=%.3f\n",
		r, g.NumNodes(), g.LocalSize(), g.LocalRank(), g.Backend(), g.Algorithm(), wrong, envInt(envMNBytes, 0), ms)
	require.Zero(t, wrong)
}
