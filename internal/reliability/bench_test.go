package reliability

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// benchTimeout is the collective deadline the rank rows run with, and
// benchMargin what the launcher may take beyond it to end everything; a trial
// waits up to observe, so that a slow end is measured, not only flagged.
const (
	observe      = 90 * time.Second
	benchTimeout = 5 * time.Second
	benchMargin  = 5 * time.Second
	benchRanks   = 3
)

// ranksOf returns the rank → pid of the rank processes under pid (descendants
// with RANK in their environment or --rank on their command line).
func ranksOf(pid int) map[int]int {
	children := map[int][]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 {
			continue
		}
		pp, _ := strconv.Atoi(f[1])
		children[pp] = append(children[pp], p)
	}
	ranks := map[int]int{}
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			queue = append(queue, c)
			if r, ok := rankOf(c); ok {
				ranks[r] = c
			}
		}
	}
	return ranks
}

var rankFlag = regexp.MustCompile(`(?:^|\x00)--rank(?:\x00|=)(\d+)`)

func rankOf(pid int) (int, bool) {
	if env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid)); err == nil {
		for _, kv := range bytes.Split(env, []byte{0}) {
			if v, ok := bytes.CutPrefix(kv, []byte("RANK=")); ok {
				if r, err := strconv.Atoi(string(v)); err == nil {
					return r, true
				}
			}
		}
	}
	if cl, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil {
		if m := rankFlag.FindSubmatch(cl); m != nil {
			r, _ := strconv.Atoi(string(m[1]))
			return r, true
		}
	}
	return 0, false
}

func pidAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && !strings.HasPrefix(strings.TrimSpace(s[i+1:]), "Z")
}

// rankFault runs a bench of benchRanks ranks, sends sig to one rank while
// the collectives run, and returns the time from the signal until the
// launcher and every rank have ended; it checks that the bench failed within
// limit and named the rank.
func (s *suite) rankFault(t *testing.T, sig syscall.Signal, victim int, limit time.Duration) (time.Duration, error) {
	cmd := exec.Command(s.bin, "bench", "allreduce", "--np", strconv.Itoa(benchRanks), "--backend", "host",
		"-b", "1M", "-e", "1M", "-n", "100000000", "-w", "1", "--timeout", benchTimeout.String(), "-q")
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	seen := map[int]int{}
	defer func() { // nothing outlives the trial
		_ = cmd.Process.Kill()
		for _, p := range seen {
			_ = syscall.Kill(p, syscall.SIGCONT)
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
	}()
	// Wait for every rank, then let the collectives run.
	deadline := time.Now().Add(30 * time.Second)
	for len(seen) < benchRanks {
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("only ranks %v started: %s", seen, stderr.String())
		}
		select {
		case err := <-exited:
			return 0, fmt.Errorf("the bench ended before the fault: %v: %s", err, stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		seen = ranksOf(cmd.Process.Pid)
	}
	time.Sleep(1500 * time.Millisecond)
	pid := seen[victim]
	if err := syscall.Kill(pid, sig); err != nil {
		return 0, err
	}
	start := time.Now()
	var err error
	select {
	case err = <-exited:
	case <-time.After(observe):
		return time.Since(start), fmt.Errorf("the bench did not end %s after the fault (limit %s)", observe, limit)
	}
	took := time.Since(start)
	for p := range seen { // every rank gone too
		for pidAlive(seen[p]) && time.Since(start) < observe {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if d := time.Since(start); d > took {
		took = d
	}
	var left []int
	for r, p := range seen {
		if pidAlive(p) {
			left = append(left, r)
		}
	}
	switch {
	case err == nil:
		return took, fmt.Errorf("the bench exited 0 after rank %d got %s", victim, sig)
	case len(left) > 0:
		return took, fmt.Errorf("ranks %v still alive after the bench ended", left)
	case took > limit:
		return took, fmt.Errorf("took %s (limit %s)", took.Round(time.Millisecond), limit)
	case !regexp.MustCompile(fmt.Sprintf(`rank\W{0,3}%d\b`, victim)).MatchString(stderr.String()):
		return took, fmt.Errorf("the error does not name rank %d: %s", victim, firstLines(stderr.String(), 4))
	}
	return took, nil
}

func (s *suite) benchRows(t *testing.T) {
	s.row(t, "bench", fmt.Sprintf("a rank killed (SIGKILL) during `bench allreduce --backend host --np %d`", benchRanks),
		"every rank fails, the bench exits non-zero naming the killed rank, within "+benchTimeout.String(), func(t *testing.T, tr *trials) {
			for i := range 4 {
				victim := i % benchRanks
				tr.try(fmt.Sprintf("kill rank %d", victim), func() (time.Duration, error) {
					return s.rankFault(t, syscall.SIGKILL, victim, benchTimeout)
				})
			}
			tr.note = "worst = from the kill until the launcher and every rank had exited"
		})
	s.row(t, "bench", fmt.Sprintf("a rank stopped (SIGSTOP) during `bench allreduce --backend host --np %d --timeout %s`", benchRanks, benchTimeout),
		fmt.Sprintf("every rank fails at the deadline, the bench exits non-zero naming the stopped rank, within the deadline + %s", benchMargin), func(t *testing.T, tr *trials) {
			for i := range 2 {
				victim := 1 + i%(benchRanks-1)
				tr.try(fmt.Sprintf("stop rank %d", victim), func() (time.Duration, error) {
					return s.rankFault(t, syscall.SIGSTOP, victim, benchTimeout+benchMargin)
				})
			}
			tr.note = "worst = from the stop until the launcher and every rank had exited"
		})
}

// joinRows: ranks started by hand against a rendezvous (the --rendezvous /
// --listen path), with bad input.
func (s *suite) joinRows(t *testing.T) {
	const deadline = 5 * time.Second
	limit := deadline + benchMargin
	common := []string{"-q", "-b", "1K", "-e", "1K", "-n", "2", "-w", "0", "--timeout", deadline.String()}
	s.row(t, "bench", "joining a rendezvous that is not there, or with the wrong token", "the joiner exits non-zero within the deadline ("+deadline.String()+") + "+benchMargin.String()+", naming the address (or the token)", func(t *testing.T, tr *trials) {
		dir := tempDir(t, 0o700)
		for _, c := range []struct{ name, addr, want string }{
			{"TCP port with no listener", "127.0.0.1:1", "127.0.0.1:1"},
			{"absent Unix socket", "unix://" + dir + "/absent.sock", "absent.sock"},
		} {
			tr.try(c.name, func() (time.Duration, error) {
				r := s.run(observe, nil, nil, append([]string{"bench", "allreduce", "--np", "2", "--rendezvous", c.addr, "--token", "t0ken", "--rank", "0"}, common...)...)
				if err := rejected(r, c.want); err != nil {
					return r.took, err
				}
				if r.took > limit {
					return r.took, fmt.Errorf("took %s (limit %s)", r.took.Round(time.Millisecond), limit)
				}
				return r.took, nil
			})
		}
		tr.try("wrong token (the joiner)", func() (time.Duration, error) {
			sock := "unix://" + dir + "/r.sock"
			host := exec.Command(s.bin, append([]string{"bench", "allreduce", "--np", "1", "--listen", sock, "--token", "right", "--local", "0"}, common...)...)
			if err := host.Start(); err != nil {
				return 0, err
			}
			defer func() { _ = host.Process.Kill(); _ = host.Wait() }()
			time.Sleep(300 * time.Millisecond)
			r := s.run(observe, nil, nil, append([]string{"bench", "allreduce", "--np", "1", "--rendezvous", sock, "--token", "wrong", "--rank", "0"}, common...)...)
			if err := rejected(r, "token"); err != nil {
				return r.took, err
			}
			if r.took > limit {
				return r.took, fmt.Errorf("took %s (limit %s)", r.took.Round(time.Millisecond), limit)
			}
			return r.took, nil
		})
	})
	s.row(t, "bench", "ranks joining with different settings (dtype/op, world size)", "every process exits non-zero within the deadline + "+benchMargin.String()+"; the ranks' message names the rank and the difference", func(t *testing.T, tr *trials) {
		dir := tempDir(t, 0o700)
		for i, c := range []struct {
			name  string
			extra []string
			want  string
		}{
			{"-d int32 --op max against float/sum", []string{"-d", "int32", "--op", "max"}, "dtype"},
			{"--np 3 against --np 2", []string{"--np", "3"}, "rank 1"},
			{"-n 5 against -n 2", []string{"-n", "5"}, "rank 1"},
		} {
			tr.try(c.name, func() (time.Duration, error) {
				sock := fmt.Sprintf("unix://%s/r%d.sock", dir, i)
				rs := s.group(observe,
					append([]string{"bench", "allreduce", "--np", "2", "--listen", sock, "--token", "tok", "--local", "0"}, common...),
					append([]string{"bench", "allreduce", "--np", "2", "--rendezvous", sock, "--token", "tok", "--rank", "0"}, common...),
					append(append([]string{"bench", "allreduce", "--np", "2", "--rendezvous", sock, "--token", "tok", "--rank", "1"}, common...), c.extra...))
				if err := allRejected(rs, limit); err != nil {
					return worst(rs), err
				}
				if !strings.Contains(rs[1].stderr+rs[2].stderr, c.want) {
					return worst(rs), fmt.Errorf("the ranks' errors do not say %q: %s", c.want, firstLines(rs[2].stderr, 2))
				}
				return worst(rs), nil
			})
		}
	})
}

// group runs the commands at once (the first 300 ms ahead: it hosts the
// rendezvous) and returns how each ended.
func (s *suite) group(limit time.Duration, cmds ...[]string) []result {
	rs := make([]result, len(cmds))
	var wg sync.WaitGroup
	for i, args := range cmds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rs[i] = s.run(limit, nil, nil, args...)
		}()
		if i == 0 {
			time.Sleep(300 * time.Millisecond)
		}
	}
	wg.Wait()
	return rs
}

func worst(rs []result) time.Duration {
	var w time.Duration
	for _, r := range rs {
		w = max(w, r.took)
	}
	return w
}

func allRejected(rs []result, limit time.Duration) error {
	for i, r := range rs {
		if err := rejected(r); err != nil {
			return fmt.Errorf("process %d: %w", i, err)
		}
		if r.took > limit {
			return fmt.Errorf("process %d took %s (limit %s)", i, r.took.Round(time.Millisecond), limit)
		}
	}
	return nil
}
