package comm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/comm/rendezvous"
	"github.com/migctl/migctl/comm/shm"
)

// The test binary runs as a helper process when envJoinChild is set (see
// TestMain): "rank1 <addr> <root>" joins as rank 1 through a rendezvous;
// "kill <step> <root>" runs rank 0 alone and SIGKILLs itself at step.
const envJoinChild = "MIGCTL_TEST_JOIN_CHILD"

func TestMain(m *testing.M) {
	if v := os.Getenv(envJoinChild); v != "" {
		if err := joinChild(strings.Fields(v)); err != nil {
			fmt.Fprintln(os.Stderr, "join child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// memKV is a KV for one process: Get of a key not Put fails; Put fails once
// its context has ended, as the rendezvous client's does; Barrier returns at
// once (a one-rank job).
type memKV struct {
	mu sync.Mutex
	m  map[string][]byte
}

func (k *memKV) Put(ctx context.Context, key string, v []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = map[string][]byte{}
	}
	k.m[key] = v
	return nil
}

func (k *memKV) Get(_ context.Context, key string) ([]byte, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	v, ok := k.m[key]
	if !ok {
		return nil, errors.New("no such key")
	}
	return v, nil
}

func (k *memKV) Barrier(context.Context, string) error { return nil }

var testLayout = shm.Layout{World: 2, Flags: 4, DataBytes: 1 << 16}

func joinChild(args []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	switch args[0] {
	case "kill":
		step, root := args[1], args[2]
		joinStep = func(s string) {
			if s == step {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				time.Sleep(time.Minute)
			}
		}
		_, err := JoinShm(ctx, &memKV{}, 0, "job", root, shm.Layout{World: 1, Flags: 4, DataBytes: 1 << 16})
		return err
	case "rank1":
		c, err := rendezvous.Dial(args[1], "tok")
		if err != nil {
			return err
		}
		defer c.Close()
		if _, err := c.Register(ctx, 1, rendezvous.Peer{}); err != nil {
			return err
		}
		j, err := JoinShm(ctx, c, 1, "job", args[2], shm.Layout{})
		if err != nil {
			return err
		}
		defer j.Close()
		j.Control.Data()[100] = 42
		return c.Barrier(ctx, "written")
	}
	return fmt.Errorf("unknown child %q", args)
}

func child(t *testing.T, args string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), envJoinChild+"="+args)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// shmRoot is a private directory on /dev/shm (the tmpfs segments live on),
// removed at the end.
func shmRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp(shm.DefaultRoot, "comm-test-")
	if err != nil {
		dir = t.TempDir()
	} else {
		t.Cleanup(func() { _ = os.RemoveAll(dir) })
	}
	return dir
}

func requireEmpty(t *testing.T, dir string, msg string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	require.Empty(t, names, msg)
}

// TestJoinShmAcrossProcesses: rank 1, another process, maps rank 0's
// segment through the rendezvous; no name appears anywhere, and nothing of
// the job's name (which bench derived from the token) is published.
func TestJoinShmAcrossProcesses(t *testing.T) {
	root := shmRoot(t)
	srv, err := rendezvous.NewServer("tok", 2)
	require.NoError(t, err)
	sock := filepath.Join(t.TempDir(), "rdv.sock")
	lis, err := net.Listen("unix", sock)
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	cmd := child(t, "rank1 unix://"+sock+" "+root)
	require.NoError(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := rendezvous.Dial("unix://"+sock, "tok")
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Register(ctx, 0, rendezvous.Peer{})
	require.NoError(t, err)
	j, err := JoinShm(ctx, c, 0, "SECRETTOKEN", root, testLayout)
	require.NoError(t, err)
	defer j.Close()
	requireEmpty(t, root, "the segment never has a name")
	rec, err := c.Get(ctx, shmKey)
	require.NoError(t, err)
	require.NotContains(t, string(rec), "SECRET")
	require.NoError(t, c.Barrier(ctx, "written"))
	require.Equal(t, byte(42), j.Control.Data()[100], "rank 1 wrote into rank 0's segment")
	require.NoError(t, cmd.Wait())
	require.Empty(t, j.Segment.Path(), "rank 0 closed its file once every rank mapped the segment")
}

// TestJoinShmKilledAtEveryStep: rank 0 SIGKILLed at any step of JoinShm
// leaves nothing in the shm directory (nor anything named after its pid in
// /dev/shm).
func TestJoinShmKilledAtEveryStep(t *testing.T) {
	for _, step := range []string{"swept", "created", "initialised", "published", "mapped", "done"} {
		t.Run(step, func(t *testing.T) {
			root := shmRoot(t)
			cmd := child(t, "kill "+step+" "+root)
			require.NoError(t, cmd.Start())
			err := cmd.Wait()
			var ee *exec.ExitError
			require.ErrorAs(t, err, &ee)
			ws := ee.Sys().(syscall.WaitStatus)
			require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "the child died at %s: %v", step, err)
			requireEmpty(t, root, "nothing leaks when rank 0 dies at "+step)
			ents, err := os.ReadDir(shm.DefaultRoot)
			require.NoError(t, err)
			pid := strconv.Itoa(cmd.Process.Pid)
			for _, e := range ents {
				require.NotContains(t, e.Name(), shm.Prefix+pid+"-", "a segment named after the dead rank 0")
			}
		})
	}
}

func TestShmCapacity(t *testing.T) {
	require.Positive(t, ShmCapacity(t.TempDir()))
	require.Zero(t, ShmCapacity("/no/such/dir"))
}

// When rank 0 cannot create the segment, the others learn why at once
// instead of waiting for a record that never comes.
func TestJoinShmCreatorFailureReachesTheOthers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv := &memKV{}
	missing := filepath.Join(t.TempDir(), "gone")
	_, err0 := JoinShm(ctx, kv, 0, "job", missing, testLayout)
	require.Error(t, err0)
	_, err1 := JoinShm(ctx, kv, 1, "job", missing, shm.Layout{})
	require.ErrorIs(t, err1, ErrAborted)
	require.ErrorContains(t, err1, "rank 0 could not create the shm segment")
	require.ErrorContains(t, err1, err0.Error())
}

// A creator that cannot take the file system's creation lock before its
// deadline (another process holds it) fails saying so, and so do the others.
func TestJoinShmGivesUpOnAHeldLock(t *testing.T) {
	dir := t.TempDir()
	unlock, err := shm.LockRoot(context.Background(), dir)
	require.NoError(t, err)
	defer unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	kv := &memKV{}
	_, err0 := JoinShm(ctx, kv, 0, "job", dir, testLayout)
	require.ErrorIs(t, err0, context.DeadlineExceeded)
	require.ErrorContains(t, err0, "waiting for the creation lock of "+dir)
	_, err1 := JoinShm(context.Background(), kv, 1, "job", dir, shm.Layout{})
	require.ErrorIs(t, err1, ErrAborted)
	require.ErrorContains(t, err1, "creation lock")
}

func TestShmSpace(t *testing.T) {
	c, f := ShmSpace(t.TempDir())
	require.Positive(t, c)
	require.Positive(t, f)
	require.LessOrEqual(t, f, c)
	c, f = ShmSpace("/no/such/dir")
	require.Zero(t, c)
	require.Zero(t, f)
}
