package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/internal/launcher"
	"github.com/migctl/migctl/internal/limits"
	"github.com/migctl/migctl/internal/testutil"
	"github.com/migctl/migctl/trainer"
)

// runCLI runs the migctl binary (bench's launcher tests' builder) with the
// workers' scratch directory and a private TMPDIR in its environment.
type runCLI struct {
	bin string
	dir string // workers write here ($T_DIR)
	tmp string // the run's TMPDIR: must be empty afterwards
	env []string
	// cache is the workers' XDG_CACHE_HOME (where bench limits' figures live).
	cache string
	sim   []string // --sim h200x8 --sim-state <fresh file>
	base  string
}

func newRunCLI(t *testing.T, bin string) *runCLI {
	t.Helper()
	// A short TMPDIR: the sockets made in it must fit in sun_path.
	tmp, err := os.MkdirTemp("", "mr")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(tmp) })
	r := &runCLI{bin: bin, dir: t.TempDir(), tmp: tmp}
	r.sim = []string{"--sim", "h200x8", "--sim-state", filepath.Join(t.TempDir(), "sim.json")}
	r.cache = t.TempDir() // no `migctl bench limits` figures unless a test writes them
	r.env = append(os.Environ(), "T_DIR="+r.dir, "TMPDIR="+r.tmp, "MIGCTL_SOCKET=", "MIGCTL_JOB_TOKEN=",
		testutil.EnvCacheHome+"="+r.cache)
	return r
}

func (r *runCLI) cmd(ctx context.Context, extraEnv []string, args ...string) *exec.Cmd {
	c := exec.CommandContext(ctx, r.bin, append([]string{"run"}, args...)...)
	c.Env = append(append([]string{}, r.env...), extraEnv...)
	return c
}

// run runs `migctl run ARGS` to the end.
func (r *runCLI) run(t *testing.T, extraEnv []string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := r.cmd(ctx, extraEnv, args...)
	var out, errOut bytes.Buffer
	c.Stdout, c.Stderr = &out, &errOut
	err = c.Run()
	return out.String(), errOut.String(), err
}

// summary reads the -o json summary at the end of stdout.
func summary(t *testing.T, stdout string) launcher.Result {
	t.Helper()
	i := strings.Index(stdout, "{\n")
	require.GreaterOrEqual(t, i, 0, "no JSON summary in:\n%s", stdout)
	var res launcher.Result
	require.NoError(t, json.Unmarshal([]byte(stdout[i:]), &res), stdout)
	return res
}

// requireClean: the run's TMPDIR is empty (rendezvous sockets, the
// embedded daemon's sockets, error files all gone).
func (r *runCLI) requireClean(t *testing.T) {
	t.Helper()
	ents, err := os.ReadDir(r.tmp)
	require.NoError(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	require.Empty(t, names, "left in TMPDIR")
}

// requireDead: no process with these pids is alive (zombies aside).
func requireDead(t *testing.T, pids []int) {
	t.Helper()
	require.NotEmpty(t, pids)
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
		require.Contains(t, []string{"Z", "X"}, f[0], "pid %d still alive", pid)
	}
}

func readPids(t *testing.T, dir, prefix string) []int {
	t.Helper()
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	var pids []int
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) {
			b, err := os.ReadFile(filepath.Join(dir, e.Name()))
			require.NoError(t, err)
			if !bytes.HasSuffix(b, []byte("\n")) {
				continue // the shell has created the file but not written it yet
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			require.NoError(t, err)
			pids = append(pids, pid)
		}
	}
	return pids
}

func readEnvFile(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	m := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			m[k] = v
		}
	}
	return m
}

// envScript writes the worker's environment and command line to $T_DIR.
const envScript = `env > "$T_DIR/env-$RANK"; tr '\0' ' ' < /proc/$$/cmdline > "$T_DIR/cmdline-$RANK"`

// TestRunCLI drives the built migctl binary: the worker environment
// contract, restarts, failures, signals, logs, and bad input.
func TestRunCLI(t *testing.T) {
	bin := testutil.MigctlBin(t)

	t.Run("environment on a simulated node", func(t *testing.T) {
		r := newRunCLI(t, bin)
		lib := filepath.Join(t.TempDir(), "libmigswap.so")
		require.NoError(t, os.WriteFile(lib, nil, 0o644))
		stdout, stderr, err := r.run(t, nil, append(r.sim, "--np", "7", "--profile", "1g.18gb", "--job", "envjob",
			"--timeout", "42s", "--max-restarts", "2", "--swap", "--swap-lib", lib, "--priority", "3", "-o", "json",
			"--", "sh", "-c", envScript)...)
		require.NoError(t, err, stderr)
		res := summary(t, stdout)
		require.Equal(t, "envjob", res.Job)
		require.Len(t, res.Devices, 7)
		uuids := map[string]bool{}
		var token string
		for r0 := range 7 {
			env := readEnvFile(t, filepath.Join(r.dir, fmt.Sprintf("env-%d", r0)))
			rs := strconv.Itoa(r0)
			want := map[string]string{
				"RANK": rs, "LOCAL_RANK": rs, "WORLD_SIZE": "7", "LOCAL_WORLD_SIZE": "7", "GROUP_RANK": "0",
				"GROUP_WORLD_SIZE": "1", "ROLE_RANK": rs, "ROLE_WORLD_SIZE": "7", "MASTER_ADDR": "127.0.0.1",
				"TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "2", "TORCHELASTIC_RUN_ID": "envjob",
				"MIGCTL_RDZV_ADDR": res.Rendezvous, "MIGCTL_JOB": "envjob", "MIGCTL_GENERATION": "0",
				"MIGCTL_BACKEND": "host", "MIGCTL_DEVICE": "0", "MIGCTL_TIMEOUT": "42s",
				"MIGSWAP_JOB": "envjob", "MIGSWAP_PRIORITY": "3", "CUDA_VISIBLE_DEVICES": res.Devices[r0].Visible,
			}
			for k, v := range want {
				require.Equal(t, v, env[k], "rank %d: %s", r0, k)
			}
			require.True(t, strings.HasPrefix(env["CUDA_VISIBLE_DEVICES"], "MIG-"), env["CUDA_VISIBLE_DEVICES"])
			uuids[env["CUDA_VISIBLE_DEVICES"]] = true
			require.True(t, strings.HasPrefix(env["LD_PRELOAD"], lib), env["LD_PRELOAD"])
			for _, k := range []string{"MASTER_PORT", "TORCHELASTIC_ERROR_FILE", "MIGCTL_SOCKET", "MIGSWAP_SOCKET", "MIGCTL_JOB_TOKEN"} {
				require.NotEmpty(t, env[k], "rank %d: %s", r0, k)
			}
			if token == "" {
				token = env["MIGCTL_JOB_TOKEN"]
			}
			require.Equal(t, token, env["MIGCTL_JOB_TOKEN"])
			cmdline, err := os.ReadFile(filepath.Join(r.dir, "cmdline-"+rs))
			require.NoError(t, err)
			require.NotContains(t, string(cmdline), token, "the job token is on a command line")
			require.NotContains(t, env["MIGCTL_JOB"]+env["MIGCTL_RDZV_ADDR"]+env["TORCHELASTIC_ERROR_FILE"], token[:8])
		}
		require.Len(t, uuids, 7, "two ranks got the same MIG device")
		r.requireClean(t)
	})

	t.Run("no figures of another machine reach the workers", func(t *testing.T) {
		// Without a cache, and with one for a GPU this node does not have
		// (here: a simulated node), the workers get no MIGCTL_MACHINE and
		// choose on hw/H200.md's figures (limits' TestNodeMachine covers the
		// GPUs that are here).
		r := newRunCLI(t, bin)
		args := append(r.sim, "--np", "2", "--profile", "1g.18gb", "-o", "json", "--", "sh", "-c", envScript)
		for _, cached := range []bool{false, true} {
			if cached {
				host, _ := os.Hostname()
				require.NoError(t, limits.Save(filepath.Join(r.cache, "migctl", "limits.json"), host, limits.Limits{
					Host: limits.Host{ReduceThreadGiBs: 8.9, ReduceHostGiBs: 73},
					GPUs: []limits.GPU{{UUID: "GPU-not-on-this-node", H2DGiBs: 51.3, D2HGiBs: 51.4, DuplexGiBs: 94.4,
						HostMemUnderDMAGiBs: 147}}}))
			}
			_, stderr, err := r.run(t, nil, args...)
			require.NoError(t, err, stderr)
			require.NotContains(t, stderr, "measured figures")
			require.NotContains(t, readEnvFile(t, filepath.Join(r.dir, "env-0")), trainer.EnvMachine, "cached %v", cached)
		}
		r.requireClean(t)
	})

	t.Run("a corrupt figures cache is reported, the job runs", func(t *testing.T) {
		r := newRunCLI(t, bin)
		path := filepath.Join(r.cache, "migctl", "limits.json")
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		require.NoError(t, os.WriteFile(path, []byte("{not json"), 0o644))
		_, stderr, err := r.run(t, nil, append(r.sim, "--np", "2", "--profile", "1g.18gb", "-q", "--", "sh", "-c", envScript)...)
		require.NoError(t, err, stderr)
		require.Contains(t, stderr, "run: warning: limits cache "+path)
		require.Contains(t, stderr, "delete it to measure again")
		require.NotContains(t, readEnvFile(t, filepath.Join(r.dir, "env-0")), trainer.EnvMachine)
		r.requireClean(t)
	})

	t.Run("gpus round-robin", func(t *testing.T) {
		r := newRunCLI(t, bin)
		stdout, stderr, err := r.run(t, nil, "--np", "5", "--gpus", "0,1", "--backend", "host", "-o", "json", "--", "sh", "-c", envScript)
		require.NoError(t, err, stderr)
		_ = summary(t, stdout)
		for r0 := range 5 {
			env := readEnvFile(t, filepath.Join(r.dir, fmt.Sprintf("env-%d", r0)))
			require.Equal(t, strconv.Itoa(r0%2), env["CUDA_VISIBLE_DEVICES"])
			require.Equal(t, "0", env["MIGCTL_DEVICE"])
		}
		r.requireClean(t)
	})

	t.Run("SIGKILLed worker: all restarted, no orphans", func(t *testing.T) {
		r := newRunCLI(t, bin)
		script := `echo $$ > "$T_DIR/pid-$TORCHELASTIC_RESTART_COUNT-$RANK"
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then exec sleep 60; fi
echo done $RANK`
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		c := r.cmd(ctx, nil, append(r.sim, "--np", "3", "--profile", "1g.18gb", "--max-restarts", "2", "-o", "json", "--", "sh", "-c", script)...)
		var out, errOut testutil.LockedBuffer
		c.Stdout, c.Stderr = &out, &errOut
		require.NoError(t, c.Start())
		victim := filepath.Join(r.dir, "pid-0-1")
		for i := 0; i < 200 && len(readPids(t, r.dir, "pid-0-")) < 3; i++ {
			time.Sleep(50 * time.Millisecond)
		}
		require.Len(t, readPids(t, r.dir, "pid-0-"), 3, "generation 0 did not start: %s", errOut.String())
		b, err := os.ReadFile(victim)
		require.NoError(t, err)
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
		require.NoError(t, c.Wait(), errOut.String())
		res := summary(t, out.String())
		require.Equal(t, 1, res.Restarts)
		require.Len(t, res.Failures, 1)
		require.Equal(t, 1, res.Failures[0].Rank)
		require.Equal(t, "SIGKILL", res.Failures[0].Signal)
		for r0 := range 3 {
			require.Contains(t, out.String(), fmt.Sprintf("[%d]: done %d\n", r0, r0))
		}
		requireDead(t, append(readPids(t, r.dir, "pid-0-"), readPids(t, r.dir, "pid-1-")...))
		r.requireClean(t)
	})

	t.Run("max-restarts 0 names the root cause", func(t *testing.T) {
		r := newRunCLI(t, bin)
		stdout, stderr, err := r.run(t, nil, append(r.sim, "--np", "4", "--profile", "1g.18gb", "--",
			"sh", "-c", `echo $$ > "$T_DIR/pid-$RANK"; if [ "$RANK" = 2 ]; then exit 7; fi; exec sleep 60`)...)
		require.Error(t, err)
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		require.Regexp(t, `^migctl: job run-[0-9a-f]+: worker failed: rank 2 \(pid \d+\) exited with code 7$`, lines[len(lines)-1])
		require.Contains(t, stdout, "failed")
		require.Contains(t, stdout, "rank 2 (pid")
		requireDead(t, readPids(t, r.dir, "pid-"))
		r.requireClean(t)
	})

	t.Run("error file in the summary", func(t *testing.T) {
		r := newRunCLI(t, bin)
		logDir := t.TempDir()
		script := `echo out $RANK; if [ "$RANK" = 1 ]; then
printf '{"message": {"message": "RuntimeError: boom", "extraInfo": {"timestamp": "1"}}}' > "$TORCHELASTIC_ERROR_FILE"; exit 1; fi; exec sleep 60`
		stdout, _, err := r.run(t, nil, "--np", "2", "--backend", "host", "--log-dir", logDir, "--tee", "none", "-o", "json", "--", "sh", "-c", script)
		require.Error(t, err)
		res := summary(t, stdout)
		require.NotContains(t, stdout, "out 0", "--tee none printed worker output")
		require.Equal(t, 1, res.RootCause.Rank)
		require.Equal(t, filepath.Join(logDir, "attempt_0", "1", "error.json"), res.RootCause.ErrorFile)
		require.Equal(t, "RuntimeError: boom", res.RootCause.Error.Message)
		b, err := os.ReadFile(filepath.Join(logDir, "attempt_0", "0", "stdout.log"))
		require.NoError(t, err)
		require.Equal(t, "out 0\n", string(b))
		r.requireClean(t)
	})

	t.Run("Ctrl-C is forwarded and ends the run", func(t *testing.T) {
		r := newRunCLI(t, bin)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c := r.cmd(ctx, nil, "--np", "2", "--backend", "host", "--max-restarts", "3", "-o", "json", "--", "sh", "-c",
			`trap 'echo got-int; exit 5' INT; echo ready; while :; do sleep 0.1; done`)
		stdout, err := c.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, c.Start())
		sc := bufio.NewScanner(stdout)
		var out strings.Builder
		ready := 0
		for ready < 2 && sc.Scan() {
			out.WriteString(sc.Text() + "\n")
			if strings.HasSuffix(sc.Text(), "ready") {
				ready++
			}
		}
		require.Equal(t, 2, ready, out.String())
		require.NoError(t, c.Process.Signal(syscall.SIGINT))
		for sc.Scan() {
			out.WriteString(sc.Text() + "\n")
		}
		err = c.Wait()
		require.Error(t, err)
		require.Contains(t, out.String(), "[0]: got-int")
		require.Contains(t, out.String(), "[1]: got-int")
		res := summary(t, out.String())
		require.Equal(t, "SIGINT", res.Interrupted)
		require.Zero(t, res.Restarts)
		r.requireClean(t)
	})

	t.Run("launcher killed with SIGKILL: no worker survives", func(t *testing.T) {
		r := newRunCLI(t, bin)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c := r.cmd(ctx, nil, append(r.sim, "--np", "3", "--profile", "1g.18gb", "--", "sh", "-c",
			`trap '' TERM INT HUP; echo $$ > "$T_DIR/pid-$RANK"; exec sleep 60`)...)
		require.NoError(t, c.Start())
		for i := 0; i < 200 && len(readPids(t, r.dir, "pid-")) < 3; i++ {
			time.Sleep(50 * time.Millisecond)
		}
		pids := readPids(t, r.dir, "pid-")
		require.Len(t, pids, 3)
		require.NoError(t, c.Process.Kill())
		_ = c.Wait()
		var alive []int
		for range 100 {
			alive = alive[:0]
			for _, pid := range pids {
				if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil && !strings.Contains(string(b), ") Z") {
					alive = append(alive, pid)
				}
			}
			if len(alive) == 0 {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		require.Empty(t, alive, "workers outlived the launcher")
	})

	t.Run("output reader gone (| head): no death by SIGPIPE, nothing left", func(t *testing.T) {
		r := newRunCLI(t, bin)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		pr, pw, err := os.Pipe()
		require.NoError(t, err)
		require.NoError(t, pr.Close()) // the reader has gone: every write to stdout is EPIPE
		var errOut bytes.Buffer
		c := r.cmd(ctx, nil, append(r.sim, "--np", "2", "--profile", "1g.18gb", "--", "sh", "-c",
			`i=0; while [ $i -lt 200 ]; do echo line $i; i=$((i+1)); done; echo "$$" > "$T_DIR/pid-$RANK"`)...)
		c.Stdout, c.Stderr = pw, &errOut
		require.NoError(t, c.Start())
		require.NoError(t, pw.Close())
		err = c.Wait()
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee, errOut.String())
		ws := ee.Sys().(syscall.WaitStatus)
		require.False(t, ws.Signaled(), "migctl was killed by %v: %s", ws.Signal(), errOut.String())
		require.Len(t, readPids(t, r.dir, "pid-"), 2, "the workers did not run to their end: %s", errOut.String())
		require.Contains(t, errOut.String(), "broken pipe")
		r.requireClean(t)
	})

	t.Run("bad input", func(t *testing.T) {
		taken, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		defer taken.Close()
		file := filepath.Join(t.TempDir(), "a-file")
		require.NoError(t, os.WriteFile(file, nil, 0o644))
		for _, tc := range []struct {
			desc string
			args []string
			env  []string
			sim  bool
			want string
		}{
			{desc: "unknown profile", sim: true, args: []string{"--np", "2", "--profile", "9g.999gb", "--", "true"}, want: "unknown profile"},
			{desc: "not a profile name", sim: true, args: []string{"--np", "2", "--profile", "big", "--", "true"}, want: "migctl partition profiles"},
			{desc: "more than ever fits", sim: true, args: []string{"--np", "57", "--profile", "1g.18gb", "--", "true"}, want: "ask for at most 56"},
			{desc: "dead daemon", args: []string{"--np", "2", "--profile", "1g.18gb", "--socket", "/nonexistent/control.sock", "--", "true"}, want: "start it with"},
			{desc: "missing worker", sim: true, args: []string{"--np", "2", "--profile", "1g.18gb", "--", "/no/such/train"}, want: "does not exist"},
			{desc: "worker not in PATH", sim: true, args: []string{"--np", "2", "--profile", "1g.18gb", "--", "no-such-trainer-xyz"}, want: "not in PATH"},
			{desc: "port in use", env: []string{"MIGCTL_JOB_TOKEN=t"}, args: []string{"--np", "1", "--backend", "host", "--nnodes", "2",
				"--rdzv-endpoint", taken.Addr().String(), "--", "true"}, want: "pick another port"},
			{desc: "np 0", args: []string{"--np", "0", "--backend", "host", "--", "true"}, want: "at least 1"},
			{desc: "no program", args: []string{"--np", "2", "--backend", "host"}, want: "after --"},
			{desc: "no devices", args: []string{"--np", "2", "--", "true"}, want: "--profile"},
			{desc: "segments on a disk", args: []string{"--np", "1", "--gpus", "0", "--shm-dir", "/proc", "--", "true"},
				want: "--shm-dir /proc is on proc: GPU workers pin their shared memory"},
			{desc: "no such segments directory", args: []string{"--np", "2", "--backend", "host", "--shm-dir", "/nonexistent/shm", "--", "true"},
				want: "--shm-dir /nonexistent/shm: no such directory"},
			{desc: "segments directory a file", args: []string{"--np", "2", "--backend", "host", "--shm-dir", file, "--", "true"},
				want: "--shm-dir " + file + ": not a directory"},
			{desc: "lease GPU without a profile", args: []string{"--np", "1", "--backend", "host", "--lease-gpu", "3", "--", "true"},
				want: "--lease-gpu 3 picks the GPU of the MIG devices leased with --profile"},
			{desc: "rendezvous endpoint on one node", args: []string{"--np", "1", "--backend", "host", "--rdzv-endpoint", "127.0.0.1:29400", "--", "true"},
				want: "give --nnodes N with it"},
			{desc: "nodes without token", args: []string{"--np", "2", "--backend", "host", "--nnodes", "2", "--rdzv-endpoint", "h:29400", "--", "true"}, want: "export MIGCTL_JOB_TOKEN"},
		} {
			t.Run(tc.desc, func(t *testing.T) {
				r := newRunCLI(t, bin)
				args := tc.args
				var before string
				if tc.sim {
					args = append(append([]string{}, r.sim...), args...)
					before = r.show(t)
				}
				stdout, stderr, err := r.run(t, tc.env, args...)
				require.Error(t, err)
				require.Empty(t, stdout)
				require.Equal(t, 1, strings.Count(stderr, "\n"), "not one line: %q", stderr)
				require.True(t, strings.HasPrefix(stderr, "migctl: "), stderr)
				require.Contains(t, stderr, tc.want)
				if tc.sim {
					require.Equal(t, before, r.show(t), "the simulated node changed")
				}
				r.requireClean(t)
			})
		}
	})
}

// show is the simulated node's layout (JSON).
func (r *runCLI) show(t *testing.T) string {
	t.Helper()
	c := exec.Command(r.bin, append([]string{"partition", "show", "-o", "json"}, r.sim...)...)
	c.Env = r.env
	out, err := c.Output()
	require.NoError(t, err)
	return string(out)
}
