package trainer

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/migctl/migctl/comm"
	"github.com/migctl/migctl/internal/cuda"
	"github.com/migctl/migctl/internal/numa"
	"github.com/migctl/migctl/internal/testutil"
)

// On a 64-MiB shared-memory file system (Docker's and Kubernetes' default
// /dev/shm) a job of 4 ranks on the gpu backend forms its group, all
// twelve point-to-point links between them and a group of some of the
// ranks, and every transfer and collective is right: the segments are
// sized by what the file system has left, not each against all of it.
func TestSmallShmFitsEveryLink(t *testing.T) {
	const n, count = 4, 300_000 // 1.2 MB messages: several chunks of a small arena
	root := testutil.MountTmpfs(t, 64<<20)
	err := world(t, n, func(r int) []Option {
		f := cuda.NewFake()
		comm.InstallFakeCUDAKernels(f)
		return []Option{withCUDA(f), WithBackend(BackendGPU), WithShmRoot(root), WithTimeout(20 * time.Second)}
	}, func(g *Group) error {
		ctx := context.Background()
		r := g.Rank()
		works := make([]*Work, 0, n)
		for p := 0; p < n; p++ {
			if p != r {
				works = append(works, g.SendAsync(ctx, HostSlice(message(r, p, count)), p))
			}
		}
		for p := 0; p < n; p++ {
			if p == r {
				continue
			}
			got := make([]float32, count)
			if err := g.Recv(ctx, HostSlice(got), p); err != nil {
				return fmt.Errorf("rank %d from %d: %w", r, p, err)
			}
			if err := sameFloats(got, message(p, r, count)); err != nil {
				return fmt.Errorf("rank %d from %d: %w", r, p, err)
			}
		}
		for _, w := range works {
			if err := w.Wait(ctx); err != nil {
				return fmt.Errorf("rank %d: %w", r, err)
			}
		}
		sum := make([]float32, count)
		for i := range sum {
			sum[i] = input(r, i)
		}
		if err := g.AllReduce(ctx, HostSlice(sum), HostSlice(sum), Sum); err != nil {
			return fmt.Errorf("rank %d all-reduce: %w", r, err)
		}
		for i := range sum {
			var want float32
			for q := 0; q < n; q++ {
				want += input(q, i)
			}
			if sum[i] != want {
				return fmt.Errorf("rank %d all-reduce element %d = %v, want %v", r, i, sum[i], want)
			}
		}
		return nil
	})
	requireAll(t, err)
	// Every segment is unnamed and gone with its last mapping.
	left, err := os.ReadDir(root)
	require.NoError(t, err)
	require.Empty(t, left, "files left in %s", filepath.Base(root))
}

func TestShmBudget(t *testing.T) {
	for _, tc := range []struct {
		name           string
		capacity, free int64
		job            bool
		want           int64
	}{
		{"unknown", 0, 0, true, 0},
		{"job group, empty file system", 64 << 20, 64 << 20, true, 32 << 20},
		{"link, empty file system", 64 << 20, 64 << 20, false, 8 << 20},
		{"link after the job's group", 64 << 20, 32 << 20, false, 8 << 20},
		{"link on an almost full one", 64 << 20, 3 << 20, false, 3 << 19},
		{"job group on a shared node", 64 << 30, 1 << 30, true, 512 << 20},
		{"roomy", 256 << 30, 200 << 30, false, 32 << 30},
		{"full: as small as it goes", 64 << 20, 0, true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, shmBudget(tc.capacity, tc.free, tc.job))
		})
	}
}

// The arena geometry by kind of group: the job's group on the gpu backend
// takes allreduce.Staged's, a point-to-point link 4 slots of 2 MiB, both
// shrunk on a small file system, and the tuning wins over either.
func TestArenaGeometry(t *testing.T) {
	const roomy = int64(128 << 30)
	for _, tc := range []struct {
		name           string
		link, host     bool
		tuning         Tuning
		capacity, free int64
		chunk, slots   int
	}{
		{name: "job group, gpu backend", capacity: roomy, free: roomy, chunk: 8 << 20, slots: 8},
		{name: "link, gpu backend", link: true, capacity: roomy, free: roomy, chunk: 2 << 20, slots: 4},
		{name: "link, host backend", link: true, host: true, capacity: roomy, free: roomy, chunk: 2 << 20, slots: 4},
		{name: "job group, host backend", host: true, capacity: roomy, free: roomy, chunk: 2 << 20, slots: 4},
		{name: "link on a 64-MiB file system", link: true, capacity: 64 << 20, free: 32 << 20, chunk: 512 << 10, slots: 4},
		{name: "link, tuned", link: true, tuning: Tuning{Chunk: 8 << 20, Slots: 8}, capacity: roomy, free: roomy, chunk: 8 << 20, slots: 8},
		{name: "link, chunk tuned", link: true, tuning: Tuning{Chunk: 1 << 20}, capacity: roomy, free: roomy, chunk: 1 << 20, slots: 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &Group{link: tc.link, cfg: config{backend: BackendGPU, tuning: tc.tuning}}
			if tc.host {
				g.cfg.backend = BackendHost
			}
			if tc.link {
				g.parent = &Group{} // formed from the job's group
			}
			chunk, slots := g.arenaGeometry(2, tc.capacity, tc.free)
			require.Equal(t, tc.chunk, chunk, "chunk")
			require.Equal(t, tc.slots, slots, "slots")
		})
	}
}

// On a host of two NUMA nodes the rank that creates the shared arena
// allocates it preferring its GPU's node (here a fake sysfs puts the fake
// GPU, bus 19, on node 0); MIGCTL_NUMA=off, a host of one node, or a node
// the kernel refuses leave it to the kernel.
func TestArenaOnTheGPUsNode(t *testing.T) {
	if err := unix.SetMemPolicy(unix.MPOL_DEFAULT, nil); err != nil {
		t.Skipf("no NUMA memory policies here: %v", err)
	}
	sysfs := func(t *testing.T, online string, node int) string {
		root := t.TempDir()
		for rel, v := range map[string]string{
			"devices/system/node/online":             online,
			"bus/pci/devices/0000:19:00.0/numa_node": fmt.Sprint(node),
		} {
			p := filepath.Join(root, rel)
			require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
			require.NoError(t, os.WriteFile(p, []byte(v+"\n"), 0o644))
		}
		return root
	}
	for _, tc := range []struct {
		desc   string
		online string
		node   int
		off    bool
		want   int // rank 0's ShmJob.Node
	}{
		{"two nodes, the GPU on 0", "0-1", 0, false, 0},
		{"MIGCTL_NUMA=off", "0-1", 0, true, -1},
		{"one node", "0", 0, false, -1},
		{"a node this machine lacks", "0-1", 1, false, -1},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			t.Setenv(numa.EnvSysfs, sysfs(t, tc.online, tc.node))
			if tc.off {
				t.Setenv(numa.EnvPlace, "off")
			}
			nodes := make([]int, 2)
			err := world(t, 2, func(int) []Option {
				f := cuda.NewFake()
				comm.InstallFakeCUDAKernels(f)
				return []Option{withCUDA(f), WithBackend(BackendGPU)}
			}, func(g *Group) error {
				nodes[g.Rank()] = g.job.Node
				buf := []float32{float32(g.Rank() + 1)}
				if err := g.AllReduce(context.Background(), HostSlice(buf), HostSlice(buf), Sum); err != nil {
					return err
				}
				if buf[0] != 3 {
					return fmt.Errorf("rank %d: sum %v, want 3", g.Rank(), buf[0])
				}
				return nil
			})
			requireAll(t, err)
			require.Equal(t, []int{tc.want, -1}, nodes, "only rank 0 creates the arena")
		})
	}
}
