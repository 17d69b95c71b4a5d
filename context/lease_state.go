package ctxmgr

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// leaseState is the state file: every lease with its process's start time.
type leaseState struct {
	Version int         `json:"version"`
	Leases  []*leaseRec `json:"leases"`
}

const leaseStateVersion = 1

// persistLocked writes the leases to the state file, atomically (a temporary
// file in the same directory, synced, renamed over it, directory synced).
// Callers hold mu.
func (l *Leases) persistLocked() error {
	if l.opts.StatePath == "" {
		return nil
	}
	st := leaseState{Version: leaseStateVersion, Leases: []*leaseRec{}}
	for _, r := range l.byUUID {
		st.Leases = append(st.Leases, r)
	}
	sort.Slice(st.Leases, func(i, j int) bool { return leaseLess(st.Leases[i].Lease, st.Leases[j].Lease) })
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(l.opts.StatePath, append(data, '\n'))
}

// writeFileAtomic replaces path with data so that a crash leaves either the
// old or the new content, never a mix.
func writeFileAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // after the rename: nothing to remove
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// Restore re-adopts the leases of the state file (a daemon restart): a
// lease is kept when its MIG device still exists (same UUID, GPU and
// instance ids) and, for a lease tied to a process, that process still runs
// (same start time). A lease tied only to a client connection is dropped:
// that connection died with the old daemon. Returns what it kept and what
// it dropped; a missing file is an empty registry. Call it before serving.
func (l *Leases) Restore(ctx context.Context) (kept, dropped []Lease, err error) {
	if l.opts.StatePath == "" {
		return nil, nil, nil
	}
	data, err := os.ReadFile(l.opts.StatePath)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("reading the lease state: %w", err)
	}
	var st leaseState
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, nil, fmt.Errorf("reading the lease state %s: %w (move it away to start with no leases)", l.opts.StatePath, err)
	}
	if st.Version != leaseStateVersion {
		return nil, nil, fmt.Errorf("lease state %s has version %d, this daemon reads %d (move it away to start with no leases)", l.opts.StatePath, st.Version, leaseStateVersion)
	}
	l.op.Lock()
	defer l.op.Unlock()
	node, err := l.src.Discover(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("re-adopting leases: %w", err)
	}
	devs := map[string]bool{}
	for _, d := range node.MIGDevices() {
		devs[fmt.Sprintf("%s/%d/%d/%d", d.UUID, d.GPU, d.GIID, d.CIID)] = true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	why := map[string][]Lease{}
	for _, r := range st.Leases {
		if r == nil {
			continue
		}
		reason := ""
		switch {
		case !devs[fmt.Sprintf("%s/%d/%d/%d", r.UUID, r.GPU, r.GIID, r.CIID)]:
			reason = "its MIG device no longer exists"
		case r.PID != 0 && !l.alive(r):
			reason = fmt.Sprintf("pid %d exited while the daemon was down", r.PID)
		case r.PID == 0 && r.BoundToConnection:
			reason = "the client connection it was bound to ended with the old daemon"
		}
		if reason != "" {
			dropped = append(dropped, r.Lease)
			why[reason] = append(why[reason], r.Lease)
			continue
		}
		r.BoundToConnection = false // no connection outlives a restart; the pid keeps it
		l.byUUID[r.UUID] = r
		kept = append(kept, r.Lease)
	}
	sortLeases(kept)
	sortLeases(dropped)
	for reason, ls := range why {
		l.emitLocked(EventExpired, ls, reason)
		for _, le := range ls {
			l.log.Info("lease dropped at restart", "job", le.Job, "uuid", le.UUID, "pid", le.PID, "why", reason)
		}
	}
	if err := l.persistLocked(); err != nil {
		return kept, dropped, err
	}
	return kept, dropped, nil
}

// procStart returns a process's start time in clock ticks since boot
// (/proc/<pid>/stat field 22): with the pid it names one process for good.
func procStart(pid int) (uint64, error) {
	if pid <= 0 {
		return 0, fmt.Errorf("pid %d: %w", pid, os.ErrNotExist)
	}
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')') // the command name may hold spaces and parentheses
	if i < 0 {
		return 0, fmt.Errorf("pid %d: malformed /proc stat", pid)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); field 22 (starttime) is f[19]
	if len(f) < 20 {
		return 0, fmt.Errorf("pid %d: malformed /proc stat", pid)
	}
	if f[0] == "Z" || f[0] == "X" { // exited, not yet reaped: gone for a lease
		return 0, fmt.Errorf("pid %d has exited: %w", pid, os.ErrNotExist)
	}
	return strconv.ParseUint(f[19], 10, 64)
}
