package reliability

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
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
