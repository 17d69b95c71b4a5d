package trainer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/internal/testutil"
)

// freePorts returns a loopback port p with p+1 free too (the launcher
// serves the rendezvous on p and hands MASTER_PORT p+1 to its workers).
func freePorts(t *testing.T) int {
	t.Helper()
	for range 50 {
		a, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		p := a.Addr().(*net.TCPAddr).Port
		b, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+1))
		_ = a.Close()
		if err == nil {
			_ = b.Close()
			return p
		}
	}
	t.Fatal("no two free consecutive ports")
	return 0
}

// Two `migctl run --nnodes 2 --node-rank i --rdzv-endpoint` launchers on
// this machine, 2 workers each (the workers are this test binary as
// TestGroupAcrossNodesProcesses's child, reporting hosts node0 and node1,
// the fake NCCL between them): the launcher's layout (RANK = node·np +
// local, GROUP_RANK, one rendezvous on node 0) forms one group across the
// two nodes, and every collective is exact on every rank. Needs $MIGCTL_BIN
// (make test sets it).
func TestGroupAcrossNodesUnderLauncher(t *testing.T) {
	if os.Getenv(envMNChild) == "1" {
		t.Skip("child of another test")
	}
	bin := os.Getenv(testutil.EnvMigctlBin)
	if bin == "" {
		t.Skipf("needs $%s (make test sets it)", testutil.EnvMigctlBin)
	}
	var all string
	for attempt := 0; ; attempt++ {
		out, err := launchTwoNodes(t, bin)
		all = out
		if err != nil && attempt < 2 && strings.Contains(out, "already taken") {
			continue // another process took the port between freePorts and the launcher
		}
		if err != nil {
			t.Logf("launcher output:\n%s", out)
		}
		require.NoError(t, err)
		break
	}
	for r := range 4 {
		require.Contains(t, all, fmt.Sprintf("MNRESULT rank=%d ok nodes=2 per_node=2 local=%d", r, r%2))
	}
	for _, line := range strings.Split(all, "\n") {
		if i := strings.Index(line, "MNRESULT"); i >= 0 {
			t.Log(line[i:])
		}
	}
}

// launchTwoNodes runs the two launchers and returns their output.
func launchTwoNodes(t *testing.T, bin string) (string, error) {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	token := hex.EncodeToString(b)
	endpoint := "127.0.0.1:" + strconv.Itoa(freePorts(t))
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmds := make([]*exec.Cmd, 2)
	outs := make([]*testutil.LockedBuffer, 2)
	for node := range 2 {
		root := filepath.Join(dir, fmt.Sprintf("shm-node%d", node))
		if err := os.MkdirAll(root, 0o700); err != nil {
			return "", err
		}
		cmd := exec.CommandContext(ctx, bin, "run", "-q", "--nnodes", "2", "--node-rank", strconv.Itoa(node),
			"--rdzv-endpoint", endpoint, "--np", "2", "--backend", "host", "--timeout", "2m", "--",
			os.Args[0], "-test.run=^TestGroupAcrossNodesProcesses$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), "MIGCTL_JOB_TOKEN="+token, envMNChild+"=1", envMNHost+"="+fmt.Sprintf("node%d", node),
			envMNPerNode+"=2", EnvNCCLFake+"=1", EnvShmRoot+"="+root)
		outs[node] = &testutil.LockedBuffer{}
		cmd.Stdout, cmd.Stderr = outs[node], outs[node]
		if err := cmd.Start(); err != nil {
			return "", err
		}
		cmds[node] = cmd
	}
	var errs []error
	for node, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			errs = append(errs, fmt.Errorf("node %d: %w", node, err))
		}
	}
	return outs[0].String() + outs[1].String(), errors.Join(errs...)
}
