package comm

import (
	"context"
	"fmt"
)

// PeerBuffers are the previous rank's buffers, opened through IPC.
type PeerBuffers struct {
	dev  IPCDevice
	Bufs []Buffer
}

// Close releases the opened buffers.
func (p *PeerBuffers) Close() error {
	if p.dev == nil {
		p.Bufs = nil
		return nil
	}
	var first error
	for _, b := range p.Bufs {
		if b == nil {
			continue
		}
		if err := p.dev.ClosePeerBuffer(b); err != nil && first == nil {
			first = err
		}
	}
	p.Bufs = nil
	return first
}

// ExchangeIPC exports bufs (whole buffers from dev.Alloc) under tag, and
// opens the same buffers of the previous rank (rank-1 mod world) — what a
// ring over IPC reads. With one rank it returns bufs themselves. Every rank
// must call it with the same tag and number of buffers.
func ExchangeIPC(ctx context.Context, kv KV, dev IPCDevice, rank, world int, tag string, bufs ...Buffer) (*PeerBuffers, error) {
	out := &PeerBuffers{dev: dev}
	if world == 1 {
		out.Bufs = append(out.Bufs, bufs...)
		out.dev = nil
		return out, nil
	}
	for i, b := range bufs {
		h, err := dev.ExportBuffer(b)
		if err != nil {
			return nil, fmt.Errorf("exporting buffer %d: %w", i, err)
		}
		if err := kv.Put(ctx, fmt.Sprintf("comm/ipc/%s/%d/%d", tag, rank, i), h); err != nil {
			return nil, err
		}
	}
	prev := (rank + world - 1) % world
	for i := range bufs {
		h, err := kv.Get(ctx, fmt.Sprintf("comm/ipc/%s/%d/%d", tag, prev, i))
		if err != nil {
			return nil, err
		}
		b, err := dev.OpenPeerBuffer(h)
		if err != nil {
			_ = out.Close()
			return nil, fmt.Errorf("opening rank %d's buffer %d: %w", prev, i, err)
		}
		out.Bufs = append(out.Bufs, b)
	}
	return out, nil
}
