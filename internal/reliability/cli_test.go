package reliability

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// sim is the simulated node the partition rows act on.
const sim = "h200x2"

// partition runs `migctl partition ARGS --sim h200x2 --sim-state state`.
func (s *suite) partition(limit time.Duration, state string, args ...string) result {
	return s.run(limit, nil, nil, append(append([]string{"partition"}, args...), "--sim", sim, "--sim-state", state)...)
}

// badPartition runs a bad partition command and checks it is refused with a
// message containing want, quickly, leaving the node's state file as it was.
func (s *suite) badPartition(state string, want []string, args ...string) (time.Duration, error) {
	before, err := os.ReadFile(state)
	if err != nil {
		return 0, err
	}
	// A virtual-memory cap, so that a command that reads without limit fails
	// here instead of taking the machine's memory.
	r := runCmd(30*time.Second, nil, nil, "/bin/sh", append([]string{"-c", `ulimit -v 4194304 && exec "$0" "$@"`, s.bin, "partition"}, args...)...)
	if err := rejected(r, want...); err != nil {
		return r.took, err
	}
	after, err := os.ReadFile(state)
	if err != nil {
		return r.took, err
	}
	if !bytes.Equal(before, after) {
		return r.took, fmt.Errorf("refused, but the node changed")
	}
	return r.took, nil
}

func (s *suite) cliRows(t *testing.T) {
	s.row(t, "partition", "bad input to `partition apply`", "refused with a message saying what is wrong, within seconds, node unchanged", func(t *testing.T, tr *trials) {
		dir := tempDir(t, 0o700)
		state := filepath.Join(dir, "node.json")
		if r := s.partition(60*time.Second, state, "apply", "--gpus", "all", "--layout", "1g.18gb=7"); r.code != 0 {
			tr.fail("setting up the node", fmt.Errorf("%s", r))
			return
		}
		simArgs := []string{"--sim", sim, "--sim-state", state}
		unknown := filepath.Join(dir, "unknown.yaml")
		if err := os.WriteFile(unknown, []byte("version: v1\nmig-configs:\n  c:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n        \"9g.99gb\": 1\n"), 0o644); err != nil {
			tr.fail("config", err)
			return
		}
		for _, c := range []struct {
			name string
			want []string
			args []string
		}{
			{"--gpus ''", []string{"empty"}, []string{"--gpus", "", "--layout", "2g.35gb=1"}},
			{"--gpus ' , '", nil, []string{"--gpus", " , ", "--layout", "2g.35gb=1"}},
			{"--gpus 9 (no such GPU)", nil, []string{"--gpus", "9", "--layout", "2g.35gb=1"}},
			{"unknown profile in --layout", []string{"9g.99gb"}, []string{"--layout", "9g.99gb=1"}},
			{"unknown profile in a config file", []string{"9g.99gb"}, []string{"-f", unknown}},
			{"-f /dev/zero", nil, []string{"-f", "/dev/zero"}},
			{"-f a directory", nil, []string{"-f", dir}},
			{"-f a missing file", nil, []string{"-f", filepath.Join(dir, "absent.yaml")}},
			{"count over the GPU's room", nil, []string{"--layout", "1g.18gb=8"}},
		} {
			tr.try(c.name, func() (time.Duration, error) {
				return s.badPartition(state, c.want, append(append([]string{"apply"}, c.args...), simArgs...)...)
			})
		}
	})

	s.row(t, "bench", "message sizes that are not a multiple of the element size", "refused with a message, or rounded with a note; never a silent row of another size", func(t *testing.T, tr *trials) {
		for _, c := range []struct{ name, size, dtype string }{
			{"-b 7 -e 7 (float)", "7", "float"}, {"-b 3 -e 3 -d double", "3", "double"},
			{"-b 6 -e 6 -d int64", "6", "int64"}, {"-b 1 -e 1 -d bf16", "1", "bf16"},
		} {
			tr.try(c.name, func() (time.Duration, error) {
				r := s.run(60*time.Second, nil, nil, "bench", "allreduce", "--np", "2", "--backend", "host",
					"-b", c.size, "-e", c.size, "-d", c.dtype, "-n", "1", "-w", "0", "-c", "1", "-q")
				if r.code == 0 && !r.timedOut {
					if regexp.MustCompile(`(?i)round`).MatchString(r.stdout + r.stderr) {
						return r.took, nil
					}
					return r.took, fmt.Errorf("exit 0 without a note: %s", firstLines(r.stdout, 3))
				}
				return r.took, rejected(r)
			})
		}
	})

	s.row(t, "swap", "`swap` against a dead daemon", "refused within 3 s: says the daemon is not running and how to start it", func(t *testing.T, tr *trials) {
		dir := tempDir(t, 0o700)
		none := filepath.Join(dir, "none.sock")
		stale := filepath.Join(dir, "stale.sock")
		ln, err := net.Listen("unix", stale)
		if err != nil {
			tr.fail("stale socket", err)
			return
		}
		ln.(*net.UnixListener).SetUnlinkOnClose(false)
		ln.Close()
		file := filepath.Join(dir, "file.sock")
		if err := os.WriteFile(file, nil, 0o600); err != nil {
			tr.fail("file", err)
			return
		}
		for _, c := range []struct {
			name string
			want []string
			args []string
		}{
			{"status, no socket", []string{"not running", "migctl daemon"}, []string{"status", "--socket", none}},
			{"status, stale socket", []string{"not running", "migctl daemon"}, []string{"status", "--socket", stale}},
			{"out --job, no socket", []string{"not running"}, []string{"out", "--job", "x", "--socket", none}},
			{"in --pid, stale socket", []string{"not running"}, []string{"in", "--pid", "1", "--socket", stale}},
			{"reserve, no socket", []string{"not running"}, []string{"reserve", "--device", "0", "--bytes", "1GiB", "--socket", none}},
			{"status, a regular file as the socket", nil, []string{"status", "--socket", file}},
		} {
			tr.try(c.name, func() (time.Duration, error) {
				r := s.run(10*time.Second, nil, nil, append([]string{"swap"}, c.args...)...)
				if err := rejected(r, c.want...); err != nil {
					return r.took, err
				}
				if r.took > 3*time.Second {
					return r.took, fmt.Errorf("took %s", r.took.Round(time.Millisecond))
				}
				return r.took, nil
			})
		}
	})
}

func firstLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	if len(l) > n {
		l = l[:n]
	}
	return strings.Join(l, " / ")
}
