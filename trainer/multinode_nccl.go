package trainer

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/migctl/migctl/comm"
	"github.com/migctl/migctl/internal/cuda"
	"github.com/migctl/migctl/internal/nccl"
)

// ncclConfig is how a group finds NCCL (tests: the fake, or an Open that
// fails).
type ncclConfig struct {
	fake bool
	open func() (nccl.Interface, error)
}

// withFakeNCCL runs the inter-node stage on internal/nccl's fake (host
// backend), as EnvNCCLFake=1 does.
func withFakeNCCL() Option {
	return func(c *config) error { c.nccl.fake = true; return nil }
}

// withNCCLOpen replaces nccl.Open (tests).
func withNCCLOpen(open func() (nccl.Interface, error)) Option {
	return func(c *config) error { c.nccl.open = open; return nil }
}

// asyncPoll is how often a rank waiting for NCCL asks whether the
// communicator met an error (a peer gone).
const asyncPoll = 10 * time.Millisecond

// interComm is this rank's NCCL communicator: local rank `shard` of every
// node, NCCL rank = node index.
type interComm struct {
	lib          nccl.Interface
	comm         nccl.Comm
	node, nodes  int
	shard        int
	mem          *nccl.HostMemory // host backend (the fake)
	gpu          *gpuBinding      // gpu backend
	mu           sync.Mutex
	aborted      bool
	closed       bool
	abortedCause error
}

// gpuBinding is what NCCL needs on the gpu backend: the device's primary
// context (current on the calling thread for every NCCL call) and a stream
// of its own, waited for through the device.
type gpuBinding struct {
	api    cuda.Interface
	dev    cuda.Device
	ctx    cuda.Context
	stream cuda.Stream
	ext    comm.ExternalDevice
}

// do runs f on a locked OS thread with the context current.
func (b *gpuBinding) do(f func() error) error {
	if b == nil {
		return f()
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := b.api.CtxSetCurrent(b.ctx); err != nil {
		return fmt.Errorf("making the CUDA context current for NCCL: %w", err)
	}
	return f()
}

func (ic *interComm) bound(f func() error) error { return ic.gpu.do(f) }

func newInterComm(ctx context.Context, g *Group, s *nodeStage) (_ *interComm, err error) {
	ic := &interComm{lib: s.lib, node: s.node, nodes: s.plan.nodes(), shard: s.local, mem: s.mem}
	if s.mem == nil {
		if ic.gpu, err = bindGPU(g); err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				ic.gpu.release()
			}
		}()
	}
	v, err := ic.lib.GetVersion()
	if err != nil {
		return nil, fmt.Errorf("ncclGetVersion: %w", err)
	}
	if major, _, _ := nccl.Version(v); major != 2 {
		return nil, fmt.Errorf("NCCL %s: want 2.x: %w", nccl.VersionString(v), ErrUnsupported)
	}
	key := fmt.Sprintf("trainer/nccl/shard/%d/id", s.local)
	var id nccl.UniqueID
	if s.node == 0 {
		if err := ic.bound(func() (err error) { id, err = ic.lib.GetUniqueID(); return err }); err != nil {
			return nil, fmt.Errorf("ncclGetUniqueId: %w", err)
		}
		if err := g.kv.Put(ctx, key, id[:]); err != nil {
			return nil, fmt.Errorf("publishing the NCCL unique id: %w", err)
		}
	} else {
		b, err := g.kv.Get(ctx, key)
		if err != nil {
			return nil, fmt.Errorf("waiting for node 0's NCCL unique id: %w", err)
		}
		if len(b) != len(id) {
			return nil, fmt.Errorf("NCCL unique id of %d bytes, want %d: %w", len(b), len(id), comm.ErrInvalid)
		}
		copy(id[:], b)
	}
	type result struct {
		c   nccl.Comm
		err error
	}
	res := make(chan result, 1)
	go func() {
		var r result
		r.err = ic.bound(func() error { r.c, r.err = ic.lib.CommInitRank(ic.nodes, id, ic.node); return r.err })
		res <- r
	}()
	select {
	case r := <-res:
		if r.err != nil {
			return nil, fmt.Errorf("ncclCommInitRank (rank %d of %d): %w", ic.node, ic.nodes, r.err)
		}
		ic.comm = r.c
	case <-ctx.Done():
		go func() { // NCCL's init cannot be cancelled: drop what it makes
			if r := <-res; r.err == nil {
				_ = ic.bound(func() error { return ic.lib.CommAbort(r.c) })
			}
		}()
		return nil, fmt.Errorf("ncclCommInitRank (rank %d of %d): %w", ic.node, ic.nodes, ctx.Err())
	}
	return ic, nil
}

func bindGPU(g *Group) (*gpuBinding, error) {
	ext, ok := g.dev.(comm.ExternalDevice)
	if !ok || g.api == nil {
		return nil, fmt.Errorf("NCCL needs the gpu backend's CUDA device: %w", ErrUnsupported)
	}
	b := &gpuBinding{api: g.api, ext: ext}
	var err error
	if b.dev, err = b.api.DeviceGet(g.cfg.device); err != nil {
		return nil, fmt.Errorf("CUDA device %d: %w", g.cfg.device, err)
	}
	if b.ctx, err = b.api.DevicePrimaryCtxRetain(b.dev); err != nil {
		return nil, fmt.Errorf("retaining the primary context of device %d: %w", g.cfg.device, err)
	}
	const nonBlocking = 1 // CU_STREAM_NON_BLOCKING
	if err := b.do(func() (err error) { b.stream, err = b.api.StreamCreate(nonBlocking); return err }); err != nil {
		_ = b.api.DevicePrimaryCtxRelease(b.dev)
		return nil, fmt.Errorf("creating NCCL's stream: %w", err)
	}
	return b, nil
}

func (b *gpuBinding) release() error {
	if b == nil {
		return nil
	}
	err := b.do(func() error { return b.api.StreamDestroy(b.stream) })
	return errors.Join(err, b.api.DevicePrimaryCtxRelease(b.dev))
}

func (ic *interComm) stream() nccl.Stream {
	if ic.gpu == nil {
		return 0
	}
	return nccl.Stream(ic.gpu.stream)
}

// run executes one inter-node stage in place on dst, and waits for it. On
// ctx's end or an asynchronous NCCL error (a peer gone), it aborts the
// communicator: this and every later collective of the group fail.
func (ic *interComm) run(ctx context.Context, st stage, dst comm.Buffer, dt comm.DType) error {
	ic.mu.Lock()
	cause := ic.abortedCause
	ic.mu.Unlock()
	if cause != nil {
		return fmt.Errorf("NCCL communicator of shard %d was aborted earlier (%v): %w", ic.shard, cause, comm.ErrAborted)
	}
	ndt, err := ncclType(dt)
	if err != nil {
		return err
	}
	op := ncclOp(st.Op)
	es := dt.Size()
	base, release, err := ic.address(dst)
	if err != nil {
		return err
	}
	defer release()
	p := base + uintptr(st.Off*es)
	mine := uintptr(ic.node * st.Count * es) // this node's block in an in-place gather or scatter
	s := ic.stream()
	enqueue := func() error {
		switch st.Kind {
		case stInterAllReduce:
			return ic.lib.AllReduce(p, p, st.Count, ndt, op, ic.comm, s)
		case stInterReduceScatter:
			return ic.lib.ReduceScatter(p, p+mine, st.Count, ndt, op, ic.comm, s)
		case stInterAllGather:
			return ic.lib.AllGather(p+mine, p, st.Count, ndt, ic.comm, s)
		case stInterBroadcast:
			return ic.lib.Broadcast(p, p, st.Count, ndt, st.Root, ic.comm, s)
		}
		return fmt.Errorf("stage %v is not an inter-node one: %w", st.Kind, comm.ErrInvalid)
	}
	return ic.call(ctx, enqueue)
}

func (ic *interComm) call(ctx context.Context, enqueue func() error) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		err := ic.bound(enqueue)
		if err == nil && ic.gpu != nil {
			var ev comm.Event
			if ev, err = ic.gpu.ext.RecordStream(uintptr(ic.gpu.stream)); err == nil {
				err = ev.Wait(wctx)
			}
		}
		done <- err
	}()
	tick := time.NewTicker(asyncPoll)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			return ic.wrap(err)
		case <-ctx.Done():
			ic.abort(fmt.Errorf("a collective ran past its deadline or was cancelled: %w", ctx.Err()))
			cancel()
			<-done
			return fmt.Errorf("waiting for the other nodes (shard %d): %w", ic.shard, ctx.Err())
		case <-tick.C:
			ic.mu.Lock()
			dead := ic.aborted || ic.closed
			ic.mu.Unlock()
			if dead {
				cancel()
				return ic.wrap(errors.Join(<-done, comm.ErrAborted))
			}
			if err := ic.lib.CommGetAsyncError(ic.comm); err != nil && !errors.Is(err, nccl.ErrFunctionMissing) {
				ic.abort(err)
				cancel()
				<-done
				return ic.wrap(err)
			}
		}
	}
}

func (ic *interComm) wrap(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, nccl.ErrRemote):
		return fmt.Errorf("NCCL across %d nodes (shard %d): %w: %w", ic.nodes, ic.shard, comm.ErrPeerDead, err)
	}
	return fmt.Errorf("NCCL across %d nodes (shard %d): %w", ic.nodes, ic.shard, err)
}

// address is dst's address for NCCL, and what to do once NCCL is done
// with it.
func (ic *interComm) address(dst comm.Buffer) (uintptr, func(), error) {
	switch b := dst.(type) {
	case *comm.HostBuffer:
		if ic.mem == nil {
			return 0, nil, fmt.Errorf("host memory for NCCL: %w", ErrUnsupported)
		}
		mem := b.Bytes()
		return ic.mem.Register(mem), func() { ic.mem.Unregister(mem) }, nil
	case *comm.CUDABuffer:
		if ic.gpu == nil {
			return 0, nil, fmt.Errorf("device memory for the fake NCCL: %w", ErrUnsupported)
		}
		return uintptr(b.Ptr()), func() {}, nil
	}
	return 0, nil, fmt.Errorf("a %T for NCCL: %w", dst, ErrUnsupported)
}

// abort aborts the communicator once (a collective in flight fails).
func (ic *interComm) abort(cause error) {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	if ic.aborted || ic.closed {
		return
	}
	ic.aborted, ic.abortedCause = true, cause
	_ = ic.bound(func() error { return ic.lib.CommAbort(ic.comm) })
}

// close destroys the communicator (or leaves an aborted one) and releases
// the GPU binding.
func (ic *interComm) close() error {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	if ic.closed {
		return nil
	}
	ic.closed = true
	var err error
	if !ic.aborted {
		err = ic.bound(func() error { return ic.lib.CommDestroy(ic.comm) })
	}
	return errors.Join(err, ic.gpu.release())
}

func ncclType(dt comm.DType) (nccl.DataType, error) {
	switch dt {
	case comm.Float32:
		return nccl.Float32, nil
	case comm.Float16:
		return nccl.Float16, nil
	case comm.BFloat16:
		return nccl.BFloat16, nil
	case comm.Float64:
		return nccl.Float64, nil
	case comm.Int32:
		return nccl.Int32, nil
	case comm.Int64:
		return nccl.Int64, nil
	case comm.Uint8:
		return nccl.Uint8, nil
	}
	return 0, fmt.Errorf("dtype %d for NCCL: %w", int(dt), comm.ErrInvalid)
}

func ncclOp(op comm.Op) nccl.RedOp {
	switch op {
	case comm.Min:
		return nccl.Min
	case comm.Max:
		return nccl.Max
	case comm.Avg:
		return nccl.Avg
	}
	return nccl.Sum
}
