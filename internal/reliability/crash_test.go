package reliability

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// envCrashAfterStep is migctl's test hook: SIGKILL itself right after step N
// of an apply (cmd/migctl/partition.go).
const envCrashAfterStep = "MIGCTL_TEST_CRASH_AFTER_STEP"

const oldLayout, newLayout = "4g.71gb=1,3g.71gb=1", "2g.35gb=2,1g.18gb=3"

// shmDir is a temporary directory on tmpfs when there is one: the simulator
// state and the journal are fsynced at every step.
func shmDir(t *testing.T) string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		if d, err := os.MkdirTemp("/dev/shm", "migctl-rel-"); err == nil {
			t.Cleanup(func() { os.RemoveAll(d) })
			return d
		}
	}
	return tempDir(t, 0o700)
}

// converge brings a crashed node to the new layout: recover first when
// withRecover, then apply, then assert; the journal must be gone.
func (s *suite) converge(state string, withRecover bool) (time.Duration, error) {
	start := time.Now()
	if withRecover {
		if r := s.partition(60*time.Second, state, "recover", "-o", "json"); r.code != 0 {
			return time.Since(start), fmt.Errorf("recover: %s", r)
		}
	}
	if r := s.partition(60*time.Second, state, "apply", "--gpus", "all", "--layout", newLayout); r.code != 0 {
		return time.Since(start), fmt.Errorf("apply after the crash: %s", r)
	}
	if r := s.partition(60*time.Second, state, "assert", "--gpus", "all", "--layout", newLayout); r.code != 0 {
		return time.Since(start), fmt.Errorf("assert after the crash: %s", r)
	}
	took := time.Since(start)
	if _, err := os.Stat(state + ".journal"); !errors.Is(err, os.ErrNotExist) {
		return took, errors.New("journal left behind")
	}
	return took, nil
}

func (s *suite) crashRows(t *testing.T) {
	s.row(t, "partition", "crash (SIGKILL) in the middle of `partition apply --sim`", "`partition recover` (odd trials) or a plain re-apply (even) converges to the new layout, journal gone", func(t *testing.T, tr *trials) {
		dir := shmDir(t)
		template := filepath.Join(dir, "template.json")
		if r := s.partition(60*time.Second, template, "apply", "--gpus", "all", "--layout", oldLayout); r.code != 0 {
			tr.fail("old layout", fmt.Errorf("%s", r))
			return
		}
		var plan struct {
			GPUs []struct{ Steps []json.RawMessage }
		}
		r := s.partition(60*time.Second, template, "plan", "--gpus", "all", "--layout", newLayout, "-o", "json")
		if err := json.Unmarshal([]byte(r.stdout), &plan); err != nil {
			tr.fail("plan", fmt.Errorf("%v: %s", err, r))
			return
		}
		steps := 0
		for _, g := range plan.GPUs {
			steps += len(g.Steps)
		}
		tmpl, err := os.ReadFile(template)
		if err != nil {
			tr.fail("template", err)
			return
		}
		fresh := func(i int) (string, error) {
			state := filepath.Join(dir, fmt.Sprintf("node-%d.json", i))
			return state, os.WriteFile(state, tmpl, 0o644)
		}

		// Forced: killed right after step k, for every k.
		for k := 1; k <= steps; k++ {
			tr.try(fmt.Sprintf("killed after step %d of %d", k, steps), func() (time.Duration, error) {
				state, err := fresh(k)
				if err != nil {
					return 0, err
				}
				r := s.run(60*time.Second, []string{envCrashAfterStep + "=" + strconv.Itoa(k)}, nil,
					"partition", "apply", "--gpus", "all", "--layout", newLayout, "--sim", sim, "--sim-state", state)
				if r.signal != syscall.SIGKILL {
					return 0, fmt.Errorf("the crash hook did not fire: %s", r)
				}
				return s.converge(state, k%2 == 1)
			})
		}
		// Random: SIGKILL from outside at a random moment of the apply (some
		// land after it finished: convergence must hold all the same).
		midApply := 0
		const random = 20
		for i := range random {
			tr.try(fmt.Sprintf("random kill %d", i+1), func() (time.Duration, error) {
				state, err := fresh(1000 + i)
				if err != nil {
					return 0, err
				}
				cmd := exec.Command(s.bin, "partition", "apply", "--gpus", "all", "--layout", newLayout, "--sim", sim, "--sim-state", state)
				if err := cmd.Start(); err != nil {
					return 0, err
				}
				// Kill at a random moment once the apply has started its
				// journal (the window is a few milliseconds on tmpfs).
				done := make(chan struct{})
				go func() { _ = cmd.Wait(); close(done) }()
			poll:
				for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
					select {
					case <-done:
						break poll
					default:
					}
					if _, err := os.Stat(state + ".journal"); err == nil {
						break
					}
					time.Sleep(50 * time.Microsecond)
				}
				time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
				_ = cmd.Process.Kill()
				<-done
				if _, err := os.Stat(state + ".journal"); err == nil {
					midApply++
				}
				return s.converge(state, i%2 == 0)
			})
		}
		tr.note = fmt.Sprintf("%d forced crashes, one after each step; %d random kills, %d of them mid-apply; worst = recover + apply + assert", steps, random, midApply)
	})
}
