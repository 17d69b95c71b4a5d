package migsim

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// state is everything a node remembers; it is what the state file holds.
type state struct {
	Model string     `json:"model"`
	Seq   uint64     `json:"seq"` // creation counter: UUIDs and handle serials
	GPUs  []gpuState `json:"gpus"`
}

type gpuState struct {
	UUID       string      `json:"uuid"`
	BusID      string      `json:"busId"`
	MIGCurrent int         `json:"migCurrent"`
	MIGPending int         `json:"migPending"`
	GIs        []giState   `json:"gpuInstances,omitempty"`
	Procs      []procState `json:"processes,omitempty"` // whole-GPU processes (MIG off)
}

type giState struct {
	ID     int       `json:"id"`
	Serial uint64    `json:"serial"`
	Enum   int       `json:"profileEnum"`
	Start  int       `json:"start"`
	Size   int       `json:"size"`
	CIs    []ciState `json:"computeInstances,omitempty"`
}

type ciState struct {
	ID     int         `json:"id"`
	Serial uint64      `json:"serial"`
	Enum   int         `json:"profileEnum"`
	Start  int         `json:"start"`
	Size   int         `json:"size"`
	UUID   string      `json:"uuid"`
	Procs  []procState `json:"processes,omitempty"`
}

type procState struct {
	PID  uint32 `json:"pid"`
	Used uint64 `json:"usedBytes"`
}

// dgxBusIDs are the PCI buses of the eight GPUs of an HGX/DGX board.
var dgxBusIDs = []int{0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb}

func freshState(m Model, n int) state {
	st := state{Model: m.Key}
	for i := 0; i < n; i++ {
		bus := 0x18 + 0x10*i
		if n <= len(dgxBusIDs) {
			bus = dgxBusIDs[i]
		}
		st.GPUs = append(st.GPUs, gpuState{
			UUID:  "GPU-" + uuidFrom(fmt.Sprintf("%s/%d", m.Key, i)),
			BusID: fmt.Sprintf("00000000:%02X:00.0", bus),
		})
	}
	return st
}

// uuidFrom formats a hash of seed as 8-4-4-4-12 hex digits.
func uuidFrom(seed string) string {
	h := sha256.Sum256([]byte(seed))
	x := fmt.Sprintf("%x", h[:16])
	return x[0:8] + "-" + x[8:12] + "-" + x[12:16] + "-" + x[16:20] + "-" + x[20:32]
}

// load reads a state file; ok is false when there is none.
func load(path string) (state, bool, error) {
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return state{}, false, nil
	}
	if err != nil {
		return state{}, false, fmt.Errorf("reading simulator state: %w", err)
	}
	var st state
	if err := json.Unmarshal(b, &st); err != nil {
		return state{}, false, fmt.Errorf("parsing simulator state %s: %w", path, err)
	}
	return st, true, nil
}

// save writes the state atomically: temp file, fsync, rename, fsync dir.
func save(path string, st *state) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding simulator state: %w", err)
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("writing simulator state: %w", err)
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("writing simulator state: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("syncing simulator state: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing simulator state: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("replacing simulator state: %w", err)
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
