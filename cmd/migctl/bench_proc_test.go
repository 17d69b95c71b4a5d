package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/internal/testutil"
)

// runBench runs `migctl bench ARGS -o json` and returns the report, stderr
// and the error.
func runBench(t *testing.T, timeout time.Duration, args ...string) (*benchReport, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, testutil.MigctlBin(t), append(append([]string{"bench"}, args...), "-o", "json")...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if err != nil {
		return nil, errOut.String(), err
	}
	var rep benchReport
	require.NoError(t, json.Unmarshal(out.Bytes(), &rep), "stdout: %s", out.String())
	return &rep, errOut.String(), nil
}

// TestBenchProcesses runs every collective, dtype and op across real OS
// processes on the host backend, with random rank counts and odd sizes, and
// requires every element of every result to be right.
func TestBenchProcesses(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	dtypes := []string{"float", "half", "bfloat16", "double", "int32", "int64", "uint8"}
	ops := []string{"sum", "avg", "min", "max"}
	type tc struct {
		coll, dtype, op string
	}
	elem := map[string]int{"float": 4, "half": 2, "bfloat16": 2, "double": 8, "int32": 4, "int64": 8, "uint8": 1}
	var cases []tc
	for _, d := range dtypes {
		for _, op := range ops {
			cases = append(cases, tc{"allreduce", d, op})
		}
		cases = append(cases, tc{"reducescatter", d, ops[rng.IntN(len(ops))]},
			tc{"allgather", d, "sum"}, tc{"broadcast", d, "sum"})
	}
	cases = append(cases, tc{"barrier", "float", "sum"})
	if testing.Short() {
		cases = cases[:6]
	}
	shmDir := t.TempDir()
	for _, c := range cases {
		np := 1 + rng.IntN(4)
		// odd sizes, but whole elements, and for reduce-scatter and
		// all-gather at least one per rank (Validate refuses less)
		es := elem[c.dtype]
		b := es * (1 + rng.IntN(3000/es))
		if c.coll == "reducescatter" || c.coll == "allgather" {
			b = max(b, es*np)
		}
		name := fmt.Sprintf("%s/%s/%s/np%d/b%d", c.coll, c.dtype, c.op, np, b)
		t.Run(name, func(t *testing.T) {
			args := []string{c.coll, "--np", strconv.Itoa(np), "--backend", "host", "--dtype", c.dtype, "--op", c.op,
				"-b", strconv.Itoa(b), "-e", strconv.Itoa(b * 400), "-f", "20", "-n", "2", "-w", "1", "-c", "1",
				"--chunk", "64KiB", "--slots", "3", "--timeout", "60s", "--shm-dir", shmDir, "-q"}
			if rng.IntN(2) == 0 {
				args = append(args, "--inplace")
			}
			if c.coll == "broadcast" {
				args = append(args, "--root", strconv.Itoa(np-1))
			}
			if c.coll == "allreduce" && np > 1 && rng.IntN(2) == 0 {
				args = append(args, "--algo", "ring")
			}
			rep, stderr, err := runBench(t, 3*time.Minute, args...)
			require.NoError(t, err, "migctl bench %v\nstderr:\n%s", args, stderr)
			require.Equal(t, np, rep.NP)
			require.NotEmpty(t, rep.Results)
			for _, row := range rep.Results {
				require.Zero(t, row.Wrong, "row %+v", row)
				require.Positive(t, row.TimeUS)
			}
		})
	}
	ents, err := os.ReadDir(shmDir)
	require.NoError(t, err)
	require.Empty(t, ents, "shared-memory segments left behind")
}

// TestBenchRankKilled: a rank SIGKILLed mid-collective makes the whole bench
// fail well within the collective deadline, with no segment left behind.
func TestBenchRankKilled(t *testing.T) {
	bin := testutil.MigctlBin(t)
	shmDir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const deadline = 20 * time.Second
	cmd := exec.CommandContext(ctx, bin, "bench", "allreduce", "--np", "3", "--backend", "host",
		"-b", "4MiB", "-e", "4MiB", "-n", "1000000", "-w", "0", "--timeout", deadline.String(), "--shm-dir", shmDir)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	cmd.Stdout = &bytes.Buffer{}
	require.NoError(t, cmd.Start())
	started := regexp.MustCompile(`started rank 1 \(pid (\d+)\)`)
	var victim int
	var log bytes.Buffer
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		log.WriteString(sc.Text() + "\n")
		if m := started.FindStringSubmatch(sc.Text()); m != nil {
			victim, _ = strconv.Atoi(m[1])
			break
		}
	}
	require.NotZero(t, victim, "no rank 1 pid in stderr:\n%s", log.String())
	go func() {
		for sc.Scan() {
			log.WriteString(sc.Text() + "\n")
		}
	}()
	// Let the ranks get into their collectives, then kill one.
	time.Sleep(3 * time.Second)
	killed := time.Now()
	require.NoError(t, syscall.Kill(victim, syscall.SIGKILL))
	err = cmd.Wait()
	took := time.Since(killed)
	require.Error(t, err, "bench succeeded although rank 1 was killed")
	require.Less(t, took, deadline+10*time.Second, "the other ranks did not fail within the deadline")
	ents, err := os.ReadDir(shmDir)
	require.NoError(t, err)
	require.Empty(t, ents, "shared-memory segments left behind")
	t.Logf("failed %v after the kill", took.Round(time.Millisecond))
}

// TestBenchJoinRendezvous: one migctl hosts the rendezvous and starts no
// ranks; two others join it as ranks 0 and 1; rank 0 prints the report.
func TestBenchJoinRendezvous(t *testing.T) {
	bin := testutil.MigctlBin(t)
	sock := "unix://" + filepath.Join(t.TempDir(), "rdv.sock")
	common := []string{"--np", "2", "--backend", "host", "-b", "64KiB", "-e", "1MiB", "-f", "16", "-c", "1", "--token", "t0k", "--timeout", "60s"}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	host := exec.CommandContext(ctx, bin, append([]string{"bench", "allreduce", "--listen", sock, "--local", "0"}, common...)...)
	var hostErr bytes.Buffer
	host.Stderr = &hostErr
	require.NoError(t, host.Start())
	rank1 := exec.CommandContext(ctx, bin, append([]string{"bench", "allreduce", "--rendezvous", sock, "--rank", "1"}, common...)...)
	require.NoError(t, rank1.Start())
	rep, stderr, err := runBench(t, 2*time.Minute, append([]string{"allreduce", "--rendezvous", sock, "--rank", "0"}, common...)...)
	require.NoError(t, err, stderr)
	require.NoError(t, rank1.Wait())
	require.NoError(t, host.Wait(), hostErr.String())
	require.Equal(t, 2, rep.NP)
	require.Len(t, rep.Results, 2)
	for _, row := range rep.Results {
		require.Zero(t, row.Wrong)
	}
}
