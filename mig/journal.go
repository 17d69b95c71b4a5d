package mig

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// DefaultJournalPath is where the journal of a real node lives.
const DefaultJournalPath = "/var/lib/migctl/journal"

// Tx is one GPU's transaction as the journal records it before any step runs.
type Tx struct {
	ID             string    `json:"id"`
	GPU            int       `json:"gpu"`
	UUID           string    `json:"uuid"`
	Started        time.Time `json:"started"`
	PrevMIGEnabled bool      `json:"prevMigEnabled"`
	Previous       Layout    `json:"previous"`
	MIGEnabled     bool      `json:"migEnabled"`
	Target         Layout    `json:"target"`
	Steps          []Step    `json:"steps"`
	// Done counts the steps recorded as completed (filled in by Open).
	Done int `json:"-"`
}

type record struct {
	Kind    string `json:"kind"` // begin, step, end
	Tx      *Tx    `json:"tx,omitempty"`
	N       int    `json:"n,omitempty"`
	Outcome string `json:"outcome,omitempty"`
}

// Journal is an append-only, fsynced record of the transaction in progress,
// in a file of JSON lines: "begin" (the whole intent: previous and target
// layouts and the steps), one "step" per completed step, then the file is
// removed when the transaction ends. A file left behind means a transaction
// was interrupted; [Journal.Pending] returns it. A Journal also holds an
// exclusive flock on "<path>.lock" between Lock and Unlock, so two migctl
// processes never change a node at once. Not safe for concurrent use.
type Journal struct {
	path string
	f    *os.File
	lock *os.File
}

// NewJournal returns a journal at path (its directory is created on use).
func NewJournal(path string) *Journal { return &Journal{path: path} }

// Path is the journal file.
func (j *Journal) Path() string { return j.path }

// Lock takes the node-wide lock, blocking until it is free.
func (j *Journal) Lock() error {
	if j.lock != nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(j.path), 0o755); err != nil {
		return fmt.Errorf("creating journal directory: %w", err)
	}
	f, err := os.OpenFile(j.path+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return fmt.Errorf("opening journal lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return fmt.Errorf("locking journal: %w", err)
	}
	j.lock = f
	return nil
}

// Unlock releases the node-wide lock.
func (j *Journal) Unlock() {
	if j.lock != nil {
		j.lock.Close()
		j.lock = nil
	}
}

// Pending returns the interrupted transaction, or nil when there is none. A
// torn last line (a crash while writing it) is ignored: the step it would
// have recorded is re-checked against the GPU anyway.
func (j *Journal) Pending() (*Tx, error) {
	b, err := os.ReadFile(j.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading journal: %w", err)
	}
	var tx *Tx
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<16), 1<<24)
	for sc.Scan() {
		var r record
		if json.Unmarshal(sc.Bytes(), &r) != nil {
			break // torn tail
		}
		switch r.Kind {
		case "begin":
			tx = r.Tx
		case "step":
			if tx != nil && r.N > tx.Done {
				tx.Done = r.N
			}
		case "end":
			tx = nil
		}
	}
	return tx, nil
}

// Begin records tx durably (file and directory fsynced) before any step runs.
func (j *Journal) Begin(tx *Tx) error {
	if err := os.MkdirAll(filepath.Dir(j.path), 0o755); err != nil {
		return fmt.Errorf("creating journal directory: %w", err)
	}
	f, err := os.OpenFile(j.path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("opening journal: %w", err)
	}
	j.f = f
	if err := j.append(record{Kind: "begin", Tx: tx}); err != nil {
		return err
	}
	return syncDir(filepath.Dir(j.path))
}

// Step records that step n (1-based) completed.
func (j *Journal) Step(n int) error { return j.append(record{Kind: "step", N: n}) }

// End closes the transaction: the journal file is removed.
func (j *Journal) End(outcome string) error {
	if j.f != nil {
		_ = j.append(record{Kind: "end", Outcome: outcome})
		j.f.Close()
		j.f = nil
	}
	if err := os.Remove(j.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing journal: %w", err)
	}
	return syncDir(filepath.Dir(j.path))
}

func (j *Journal) append(r record) error {
	if j.f == nil {
		f, err := os.OpenFile(j.path, os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return fmt.Errorf("opening journal: %w", err)
		}
		j.f = f
	}
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encoding journal record: %w", err)
	}
	if _, err := j.f.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("writing journal: %w", err)
	}
	if err := j.f.Sync(); err != nil {
		return fmt.Errorf("syncing journal: %w", err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("opening journal directory: %w", err)
	}
	defer d.Close()
	_ = d.Sync()
	return nil
}
