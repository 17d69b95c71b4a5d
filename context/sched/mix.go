package sched

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"time"
)

// Mix is a recorded job mix: the jobs that arrive at one device.
type Mix struct {
	// Description says where the mix's shape comes from.
	Description string `json:"description"`
	// Device is what the jobs share.
	Device MixDevice `json:"device"`
	Jobs   []MixJob  `json:"jobs"`
}

// MixDevice is a GPU or a MIG instance.
type MixDevice struct {
	Name      string  `json:"name"`
	MemoryGiB float64 `json:"memory_gib"`
}

// MixJob is one job of a mix.
type MixJob struct {
	ID   int    `json:"id"`
	Name string `json:"name"`
	// Kind is "inference" or "training" (for the reports only).
	Kind string `json:"kind"`
	// ArrivalS is when it arrives, in seconds from the start.
	ArrivalS float64 `json:"arrival_s"`
	// DurationS is its run time alone on the device, in seconds.
	DurationS float64 `json:"duration_s"`
	MemoryGiB float64 `json:"memory_gib"`
	Priority  int     `json:"priority"`
	// Compute is the share of the device's compute the job uses when alone,
	// in (0, 1].
	Compute float64 `json:"compute"`
	// Declares: the job declares its duration to the scheduler (srf).
	Declares bool `json:"declares"`
}

// Bytes is the job's memory in bytes.
func (j MixJob) Bytes() int64 { return int64(j.MemoryGiB * (1 << 30)) }

// Capacity is the device's memory in bytes.
func (d MixDevice) Capacity() int64 { return int64(d.MemoryGiB * (1 << 30)) }

// ErrBadMix: a mix breaks a rule of Validate.
var ErrBadMix = errors.New("bad job mix")

// Validate checks the mix: a device with memory, at least one job, unique
// ids, non-negative arrivals, positive durations, memory that fits the device
// alone and compute shares in (0, 1].
func (m Mix) Validate() error {
	if m.Device.MemoryGiB <= 0 {
		return fmt.Errorf("%w: device memory must be positive", ErrBadMix)
	}
	if len(m.Jobs) == 0 {
		return fmt.Errorf("%w: no jobs", ErrBadMix)
	}
	seen := map[int]bool{}
	for _, j := range m.Jobs {
		switch {
		case seen[j.ID]:
			return fmt.Errorf("%w: job id %d twice", ErrBadMix, j.ID)
		case j.ArrivalS < 0:
			return fmt.Errorf("%w: job %d arrives before 0", ErrBadMix, j.ID)
		case j.DurationS <= 0:
			return fmt.Errorf("%w: job %d has duration %g s", ErrBadMix, j.ID, j.DurationS)
		case j.MemoryGiB <= 0 || j.Bytes() > m.Device.Capacity():
			return fmt.Errorf("%w: job %d needs %g GiB on a %g-GiB device", ErrBadMix, j.ID, j.MemoryGiB, m.Device.MemoryGiB)
		case j.Compute <= 0 || j.Compute > 1:
			return fmt.Errorf("%w: job %d has compute share %g (want (0, 1])", ErrBadMix, j.ID, j.Compute)
		}
		seen[j.ID] = true
	}
	return nil
}

// LoadMix reads and validates a mix from a JSON file.
func LoadMix(path string) (Mix, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Mix{}, fmt.Errorf("reading job mix: %w", err)
	}
	var m Mix
	if err := json.Unmarshal(b, &m); err != nil {
		return Mix{}, fmt.Errorf("parsing job mix %s: %w", path, err)
	}
	if err := m.Validate(); err != nil {
		return Mix{}, fmt.Errorf("job mix %s: %w", path, err)
	}
	return m, nil
}

func seconds(s float64) time.Duration { return time.Duration(math.Round(s * float64(time.Second))) }
