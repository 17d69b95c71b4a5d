package ctxmgr

import (
	"sync"
	"time"
)

// EventType says what an Event reports.
type EventType string

// The events Watch streams.
const (
	// EventAcquired: leases were granted (Leases; Created marks instances
	// made for them).
	EventAcquired EventType = "acquired"
	// EventReleased: a job released leases.
	EventReleased EventType = "released"
	// EventExpired: leases ended without a release; Reason says why (the
	// process exited, the client's connection closed, the MIG device is gone).
	EventExpired EventType = "expired"
	// EventSwapStarted: a swap of one process began (Swap: pid, job,
	// direction).
	EventSwapStarted EventType = "swap-started"
	// EventSwapDone: a swap of one process ended (Swap: the result).
	EventSwapDone EventType = "swap-done"
)

// Event is one lease or swap event.
type Event struct {
	Type   EventType `json:"type" yaml:"type"`
	Job    string    `json:"job" yaml:"job"`
	Time   time.Time `json:"time" yaml:"time"`
	Leases []Lease   `json:"leases,omitempty" yaml:"leases,omitempty"`
	Swap   *Result   `json:"swap,omitempty" yaml:"swap,omitempty"`
	Reason string    `json:"reason,omitempty" yaml:"reason,omitempty"`
}

// EventHub fans events out to watchers. Publish never blocks: a watcher
// whose buffer is full is dropped (its channel closed, Lagged true), so a
// stuck client cannot stall leasing or swapping. Safe for concurrent use.
type EventHub struct {
	mu   sync.Mutex
	subs map[*Watcher]struct{}
	buf  int
}

// Watcher is one subscription.
type Watcher struct {
	job    string
	ch     chan Event
	lagged bool
	closed bool
}

// NewEventHub returns a hub whose watchers buffer up to buf events (0: 256).
func NewEventHub(buf int) *EventHub {
	if buf <= 0 {
		buf = 256
	}
	return &EventHub{subs: map[*Watcher]struct{}{}, buf: buf}
}

// Subscribe returns a watcher of job's events ("" for all). Its channel is
// closed by Unsubscribe, or when it falls behind.
func (h *EventHub) Subscribe(job string) *Watcher {
	w := &Watcher{job: job, ch: make(chan Event, h.buf)}
	h.mu.Lock()
	h.subs[w] = struct{}{}
	h.mu.Unlock()
	return w
}

// Events is the watcher's stream.
func (w *Watcher) Events() <-chan Event { return w.ch }

// Unsubscribe ends w and reports whether it had fallen behind (events lost).
func (h *EventHub) Unsubscribe(w *Watcher) (lagged bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.subs, w)
	if !w.closed {
		w.closed = true
		close(w.ch)
	}
	return w.lagged
}

// Publish sends e to every watcher of its job, dropping watchers that are
// full.
func (h *EventHub) Publish(e Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.subs {
		if w.job != "" && w.job != e.Job {
			continue
		}
		select {
		case w.ch <- e:
		default:
			w.lagged, w.closed = true, true
			close(w.ch)
			delete(h.subs, w)
		}
	}
}
