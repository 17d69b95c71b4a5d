package trainer

import (
	"context"
	"fmt"
	"sync"
)

// localKV is the rendezvous of a group of one: a map, and barriers that
// return at once.
type localKV struct {
	mu  sync.Mutex
	m   map[string][]byte
	set chan struct{} // closed and replaced at every Put
}

func newLocalKV() *localKV { return &localKV{m: map[string][]byte{}, set: make(chan struct{})} }

func (l *localKV) Put(_ context.Context, key string, value []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.m[key]; ok {
		return fmt.Errorf("key %q is already set", key)
	}
	l.m[key] = append([]byte(nil), value...)
	close(l.set)
	l.set = make(chan struct{})
	return nil
}

func (l *localKV) Get(ctx context.Context, key string) ([]byte, error) {
	for {
		l.mu.Lock()
		v, ok := l.m[key]
		ch := l.set
		l.mu.Unlock()
		if ok {
			return v, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for key %q: %w", key, ctx.Err())
		}
	}
}

func (l *localKV) Barrier(context.Context, string) error { return nil }

func (l *localKV) Abort(context.Context, string) error { return nil }
