package comm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/migctl/migctl/internal/cuda"
)

// CUDAConfig configures NewCUDADevice.
type CUDAConfig struct {
	// Ordinal is the device as CUDA numbers the devices visible to this
	// process (after CUDA_VISIBLE_DEVICES).
	Ordinal int
	// PTX is the reduction kernels' module (allreduce/kernels.PTX); required.
	PTX []byte
	// MaxBlocks caps the blocks of one kernel launch; 0 means 8 per SM.
	MaxBlocks int
	// SmallH2D is how host-to-device copies of fewer than SmallH2DBytes
	// bytes are queued (default H2D2DRows). See H2DMode.
	SmallH2D H2DMode
	// StageReduce is which reductions of host memory copy their sources
	// (those of at least StageReduceBytes) into a device scratch buffer
	// with the copy engines and reduce from there, instead of the kernel
	// reading them from mapped host memory: by default the ones queued
	// through ReduceFromHostStaged (the schedules that ask: the ring's).
	StageReduce StageMode
}

// StageMode is CUDAConfig.StageReduce.
type StageMode int

const (
	// StageAsked stages the reductions queued with ReduceFromHostStaged.
	StageAsked StageMode = iota
	// StageAll stages every reduction of host memory.
	StageAll
	// StageNone stages none: the kernels read the sources over the link.
	StageNone
)

// StageReduceBytes is the smallest source CUDAConfig.StageReduce stages:
// below it the kernel's own reads cost less than a copy per source.
const StageReduceBytes = 256 << 10

// H2DMode is how CopyFromHost queues small host-to-device copies.
//
// Measured on an H200 without MIG, 7 processes on the GPU, all-reduce of
// 8 KiB (the small-message path: one copy each way per call): with plain
// cuMemcpyHtoDAsync the host-to-device copy of 8 KiB or less took 0.4-1 ms
// to complete, 32 KiB about 10 µs, so every call below 32 KiB cost about a
// millisecond (956-993 µs); with one-row cuMemcpy2DAsync and with the
// device-to-device and padded variants the same (929-1028 µs: the driver
// takes its slow small-copy path for them too); with 2D copies of 64-byte
// rows 57-173 µs for 128 B to 8 KiB across runs (75.6 µs for 8 KiB over
// 1000 calls). The driver evidently treats small 1D host-to-device copies
// differently (it does not document how), and a copy of two or more rows
// goes the way large copies go.
type H2DMode string

// The modes. MIGCTL_H2D (migctl bench) picks one for experiments.
const (
	// H2D2DRows: cuMemcpy2DAsync with at least two rows (64-byte rows where
	// the size allows, else the widest rows that tile it); the default.
	H2D2DRows H2DMode = "2drows"
	// H2DPlain: cuMemcpyHtoDAsync.
	H2DPlain H2DMode = "plain"
	// H2D2D: cuMemcpy2DAsync with one row.
	H2D2D H2DMode = "2d"
	// H2DFromMapped: cuMemcpyDtoDAsync from the registered source's device
	// address (plain for unregistered sources).
	H2DFromMapped H2DMode = "dtod"
	// H2DPadded: a SmallH2DBytes-long host-to-device copy into a per-stream
	// device scratch buffer, then a device-to-device copy of the bytes asked
	// for (plain when the padded source is not all registered).
	H2DPadded H2DMode = "pad"
	// H2DKernel: a kernel (mig_copy) reads the registered source through its
	// mapped device address, no copy engine (2D rows when the source is not
	// registered). The case: in the 8-KiB all-reduce of 7 ranks on one H200
	// every rank queues its copy in at the same moment, and the copy engine
	// took them one after another (16.7 µs p50 from issue to completion,
	// against 7.1 µs for the copies out, which arrive spread out), where the
	// kernels of MPS clients run side by side.
	H2DKernel H2DMode = "kernel"
)

// KernelH2DRanks is the fewest processes sharing one CUDA device for which
// SmallH2DFor picks H2DKernel. Measured on one H200 (MIG off, MPS), 8-KiB
// all-reduce, -c 1, six interleaved pairs in one call
// (scripts/h200-session.d/h2d-kernel-ab.sh, 2026-12-01): 7 ranks 2D rows
// 69.8/61.6/59.0/61.2/60.3/63.0 µs, kernel 59.0/54.1/52.5/53.5/51.7/52.0
// (copy in p50 14.2 -> 10.7 µs from issue to completion); 2 ranks 2D rows
// 30.9/30.9/32.5, kernel 33.6/32.9/34.3 (a launch costs more than an idle
// copy engine). 3 to 6 ranks were not measured: the copy engine's queue
// grows with every rank copying in at once, so the threshold sits between
// the two measured counts. MIG instances are CUDA devices of their own,
// with their own copy engines: one rank each.
const KernelH2DRanks = 4

// SmallH2DFor is the small-copy mode for a CUDA device that ranks
// processes of a job share (they copy their results in at the same
// moment), mps saying whether they are clients of an MPS server:
// H2DKernel from KernelH2DRanks on under MPS, else H2D2DRows. Without MPS
// the processes' contexts are time-sliced (a switch took ~150 µs on an
// H200), and a copy kernel would wait for its context's slice: the kernel
// was measured under MPS only.
func SmallH2DFor(ranks int, mps bool) H2DMode {
	if mps && ranks >= KernelH2DRanks {
		return H2DKernel
	}
	return H2D2DRows
}

// SmallH2DBytes is the size below which CUDAConfig.SmallH2D applies.
const SmallH2DBytes = 32 << 10

// ParseH2DMode parses a mode name ("" is the default, H2D2DRows).
func ParseH2DMode(s string) (H2DMode, error) {
	switch m := H2DMode(s); m {
	case "":
		return H2D2DRows, nil
	case H2DPlain, H2D2D, H2D2DRows, H2DFromMapped, H2DPadded, H2DKernel:
		return m, nil
	}
	return "", fmt.Errorf("host-to-device copy mode %q (want 2drows, plain, 2d, dtod, pad or kernel): %w", s, ErrInvalid)
}

// CUDADevice is the GPU Device: buffers in device memory, streams and events
// of the CUDA driver, reductions by the kernels of allreduce/kernels. It also
// implements the optional IPCDevice and TopologyDevice, and its streams
// BufferReducer and EventStream.
//
// All its methods are safe for concurrent use; a Stream is used by one
// goroutine at a time. Every driver call runs with the goroutine locked to
// its OS thread and the device's primary context current on that thread.
type CUDADevice struct {
	api       cuda.Interface
	dev       cuda.Device
	ctx       cuda.Context
	mod       cuda.Module
	reduce    [numDTypes][numReduceOps]cuda.Function
	scale     [numDTypes]cuda.Function
	copy      cuda.Function // mig_copy (H2DKernel)
	maxBlocks uint32
	topo      GPUTopology
	smallH2D  H2DMode
	stage     StageMode // CUDAConfig.StageReduce

	regs atomic.Pointer[[]hostRange] // sorted by start; replaced on change

	wordsOnce sync.Once // StreamWords' probe
	wordsErr  error
	tainted   bool // a stream was destroyed undrained: Close keeps registrations and the module (ErrNotDrained)

	mu      sync.Mutex
	closed  bool
	allocs  map[*CUDABuffer]struct{}
	streams map[*cudaStream]struct{}
	events  map[cuda.Event]struct{} // every event created, for Close
	pool    []cuda.Event            // recycled plain events
}

// SetSmallH2D changes how small host-to-device copies are queued (see
// H2DMode; "" is the default). Call it before queuing copies: streams read
// the mode without a lock.
func (d *CUDADevice) SetSmallH2D(m H2DMode) error {
	m, err := ParseH2DMode(string(m))
	if err != nil {
		return err
	}
	d.smallH2D = m
	return nil
}

// SmallH2D is how small host-to-device copies are queued.
func (d *CUDADevice) SmallH2D() H2DMode { return d.smallH2D }

// hostRange is one registered host range and its device address.
type hostRange struct {
	start, end uintptr
	dev        cuda.DevicePtr
	base       unsafe.Pointer
}

// CUDABuffer is a CUDADevice's buffer: device memory it allocated, or a
// peer's buffer opened through IPC.
type CUDABuffer struct {
	ptr  cuda.DevicePtr
	n    int
	peer bool
}

// Len is the buffer's size in bytes.
func (b *CUDABuffer) Len() int { return b.n }

// Ptr is the buffer's device address.
func (b *CUDABuffer) Ptr() cuda.DevicePtr { return b.ptr }

var (
	_ Device         = (*CUDADevice)(nil)
	_ IPCDevice      = (*CUDADevice)(nil)
	_ TopologyDevice = (*CUDADevice)(nil)
	_ Stream         = (*cudaStream)(nil)
	_ BufferReducer  = (*cudaStream)(nil)
	_ EventStream    = (*cudaStream)(nil)
	_ Event          = (*cudaEvent)(nil)
	_ Buffer         = (*CUDABuffer)(nil)
)

// NewCUDADevice initialises the driver, retains the primary context of
// device cfg.Ordinal, loads the reduction kernels from cfg.PTX and returns
// the Device. Close releases everything it holds.
func NewCUDADevice(api cuda.Interface, cfg CUDAConfig) (*CUDADevice, error) {
	if len(cfg.PTX) == 0 {
		return nil, fmt.Errorf("opening CUDA device %d: no kernel PTX: %w", cfg.Ordinal, ErrInvalid)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := api.Init(0); err != nil {
		return nil, fmt.Errorf("initialising the CUDA driver: %w", err)
	}
	dev, err := api.DeviceGet(cfg.Ordinal)
	if err != nil {
		return nil, fmt.Errorf("opening CUDA device %d: %w", cfg.Ordinal, err)
	}
	d := &CUDADevice{
		api: api, dev: dev,
		allocs:  map[*CUDABuffer]struct{}{},
		streams: map[*cudaStream]struct{}{},
		events:  map[cuda.Event]struct{}{},
	}
	d.regs.Store(&[]hostRange{})
	if d.topo, err = readTopology(api, dev, cfg.Ordinal); err != nil {
		return nil, err
	}
	if d.ctx, err = api.DevicePrimaryCtxRetain(dev); err != nil {
		return nil, fmt.Errorf("retaining the primary context of CUDA device %d: %w", cfg.Ordinal, err)
	}
	fail := func(err error) (*CUDADevice, error) {
		if d.mod != 0 {
			_ = api.ModuleUnload(d.mod)
		}
		_ = api.DevicePrimaryCtxRelease(dev)
		return nil, err
	}
	if err := api.CtxSetCurrent(d.ctx); err != nil {
		return fail(fmt.Errorf("making the context of CUDA device %d current: %w", cfg.Ordinal, err))
	}
	if d.mod, err = api.ModuleLoadData(cfg.PTX); err != nil {
		return fail(fmt.Errorf("loading the reduction kernels: %w", err))
	}
	for dt := DType(0); dt < numDTypes; dt++ {
		for op := 0; op < numReduceOps; op++ {
			name := reduceKernel(dt, op)
			if d.reduce[dt][op], err = api.ModuleGetFunction(d.mod, name); err != nil {
				return fail(fmt.Errorf("finding kernel %s: %w", name, err))
			}
		}
		name := scaleKernel(dt)
		if d.scale[dt], err = api.ModuleGetFunction(d.mod, name); err != nil {
			return fail(fmt.Errorf("finding kernel %s: %w", name, err))
		}
	}
	if d.copy, err = api.ModuleGetFunction(d.mod, copyKernel); err != nil {
		return fail(fmt.Errorf("finding kernel %s: %w", copyKernel, err))
	}
	if d.smallH2D, err = ParseH2DMode(string(cfg.SmallH2D)); err != nil {
		return fail(err)
	}
	d.stage = cfg.StageReduce
	d.maxBlocks = uint32(cfg.MaxBlocks)
	if d.maxBlocks == 0 {
		d.maxBlocks = uint32(max(d.topo.SMs, 1) * 8)
	}
	return d, nil
}

// GPUTopology is where a CUDA device sits, as the driver reports it.
type GPUTopology struct {
	// Ordinal is the CUDA ordinal in this process.
	Ordinal int    `json:"ordinal"`
	Name    string `json:"name"`
	// UUID identifies the device: "MIG-..." for a MIG instance, else "GPU-...".
	UUID string `json:"uuid"`
	// ParentUUID is the physical GPU's "GPU-..." UUID (equal to UUID when not
	// MIG, or when the driver does not tell them apart).
	ParentUUID string `json:"parentUUID"`
	// PCIBusID is the physical GPU's PCI address, "dddd:bb:dd.f": ranks with
	// the same PCIBusID share one GPU and its PCIe link.
	PCIBusID string `json:"pciBusID"`
	// MIG reports a MIG instance: the driver's MIG UUID (cuDeviceGetUuid_v2)
	// differs from the GPU's (cuDeviceGetUuid), or CUDA_VISIBLE_DEVICES
	// selected this device by a "MIG-" UUID. No CUDA IPC or P2P then.
	MIG      bool   `json:"mig"`
	SMs      int    `json:"sms"`
	TotalMem uint64 `json:"totalMem"`
}

func readTopology(api cuda.Interface, dev cuda.Device, ordinal int) (GPUTopology, error) {
	t := GPUTopology{Ordinal: ordinal}
	var err error
	if t.Name, err = api.DeviceGetName(dev); err != nil {
		return t, fmt.Errorf("reading the name of CUDA device %d: %w", ordinal, err)
	}
	uuid, err := api.DeviceGetUUID(dev)
	if err != nil {
		return t, fmt.Errorf("reading the UUID of CUDA device %d: %w", ordinal, err)
	}
	parent, err := api.DeviceGetUUIDv1(dev)
	if err != nil {
		parent = uuid // older or newer drivers without the v1 entry point
	}
	t.MIG = parent != uuid || visibleAsMIG(ordinal)
	t.ParentUUID = parent.String("GPU")
	t.UUID = t.ParentUUID
	if t.MIG {
		t.UUID = uuid.String("MIG")
	}
	if t.PCIBusID, err = api.DeviceGetPCIBusID(dev); err != nil {
		return t, fmt.Errorf("reading the PCI bus id of CUDA device %d: %w", ordinal, err)
	}
	if t.SMs, err = api.DeviceGetAttribute(cuda.AttrMultiprocessorCount, dev); err != nil {
		return t, fmt.Errorf("reading the SM count of CUDA device %d: %w", ordinal, err)
	}
	if t.TotalMem, err = api.DeviceTotalMem(dev); err != nil {
		return t, fmt.Errorf("reading the memory size of CUDA device %d: %w", ordinal, err)
	}
	return t, nil
}

// visibleAsMIG reports whether CUDA_VISIBLE_DEVICES names device ordinal by a MIG UUID.
func visibleAsMIG(ordinal int) bool {
	v := os.Getenv("CUDA_VISIBLE_DEVICES")
	if v == "" {
		return false
	}
	list := strings.Split(v, ",")
	return ordinal < len(list) && strings.HasPrefix(strings.TrimSpace(list[ordinal]), "MIG-")
}

// Topology reports where the device sits. It does not block.
func (d *CUDADevice) Topology() GPUTopology { return d.topo }

// bind locks the goroutine to its OS thread and makes the context current
// there; unbind undoes the lock. Every driver call happens between the two.
func (d *CUDADevice) bind() error {
	runtime.LockOSThread()
	if err := d.api.CtxSetCurrent(d.ctx); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("making the CUDA context current: %w", err)
	}
	return nil
}

func (d *CUDADevice) unbind() { runtime.UnlockOSThread() }

// enter locks the device for driver calls: it fails with ErrClosed once the
// device is closed, else holds d.mu and binds the context until leave.
func (d *CUDADevice) enter() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return fmt.Errorf("cuda device: %w", ErrClosed)
	}
	if err := d.bind(); err != nil {
		d.mu.Unlock()
		return err
	}
	return nil
}

// leave undoes enter.
func (d *CUDADevice) leave() {
	d.unbind()
	d.mu.Unlock()
}

func hostAddr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// Register page-locks mem (portable, mapped into the device's address space)
// so that copies from and to it are asynchronous DMA and the reduction
// kernels read it directly. mem must stay mapped until Unregister; it must
// not overlap a range registered before.
func (d *CUDADevice) Register(mem []byte) error {
	if len(mem) == 0 {
		return fmt.Errorf("registering an empty range: %w", ErrInvalid)
	}
	if err := d.enter(); err != nil {
		return err
	}
	defer d.leave()
	p := unsafe.Pointer(unsafe.SliceData(mem))
	if err := d.api.MemHostRegister(p, uint64(len(mem)), cuda.HostRegisterPortable|cuda.HostRegisterDeviceMap); err != nil {
		return fmt.Errorf("registering %d bytes of host memory: %w", len(mem), err)
	}
	dp, err := d.api.MemHostGetDevicePointer(p, 0)
	if err != nil {
		_ = d.api.MemHostUnregister(p)
		return fmt.Errorf("mapping registered host memory: %w", err)
	}
	regs := append([]hostRange(nil), *d.regs.Load()...)
	regs = append(regs, hostRange{start: hostAddr(mem), end: hostAddr(mem) + uintptr(len(mem)), dev: dp, base: p})
	sort.Slice(regs, func(i, j int) bool { return regs[i].start < regs[j].start })
	d.regs.Store(&regs)
	return nil
}

// Unregister undoes Register for the range that starts at mem's first byte.
// No queued work may still use it.
func (d *CUDADevice) Unregister(mem []byte) error {
	if len(mem) == 0 {
		return fmt.Errorf("unregistering an empty range: %w", ErrInvalid)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("cuda device: %w", ErrClosed)
	}
	return d.unregisterLocked(hostAddr(mem))
}

func (d *CUDADevice) unregisterLocked(start uintptr) error {
	old := *d.regs.Load()
	for i, r := range old {
		if r.start != start {
			continue
		}
		if err := d.bind(); err != nil {
			return err
		}
		err := d.api.MemHostUnregister(r.base)
		d.unbind()
		if err != nil {
			return fmt.Errorf("unregistering host memory: %w", err)
		}
		regs := append(append([]hostRange(nil), old[:i]...), old[i+1:]...)
		d.regs.Store(&regs)
		return nil
	}
	return fmt.Errorf("unregistering host memory at %#x: not registered: %w", start, ErrInvalid)
}

// mapped is the device address of registered host memory b.
func (d *CUDADevice) mapped(b []byte) (cuda.DevicePtr, error) {
	return d.mappedRange(hostAddr(b), len(b))
}

// mappedRange is mapped for the n bytes at host address addr.
func (d *CUDADevice) mappedRange(addr uintptr, n int) (cuda.DevicePtr, error) {
	regs := *d.regs.Load()
	lo, hi := 0, len(regs)
	for lo < hi { // first range starting after addr
		m := (lo + hi) / 2
		if regs[m].start > addr {
			hi = m
		} else {
			lo = m + 1
		}
	}
	if lo == 0 || addr+uintptr(n) > regs[lo-1].end {
		return 0, fmt.Errorf("host range %#x+%d is not registered with the device: %w", addr, n, ErrInvalid)
	}
	r := regs[lo-1]
	return r.dev + cuda.DevicePtr(addr-r.start), nil
}

// Alloc returns n bytes of device memory (not zeroed). Free or Close
// releases it.
func (d *CUDADevice) Alloc(n int) (Buffer, error) {
	if n <= 0 {
		return nil, fmt.Errorf("allocating %d bytes: %w", n, ErrInvalid)
	}
	if err := d.enter(); err != nil {
		return nil, err
	}
	defer d.leave()
	p, err := d.api.MemAlloc(uint64(n))
	if err != nil {
		return nil, fmt.Errorf("allocating %d bytes of device memory: %w", n, err)
	}
	b := &CUDABuffer{ptr: p, n: n}
	d.allocs[b] = struct{}{}
	return b, nil
}

// Free releases a buffer from Alloc or OpenPeerBuffer. No queued work may
// still use it.
func (d *CUDADevice) Free(buf Buffer) error {
	b, err := d.buffer(buf)
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.allocs[b]; !ok {
		return fmt.Errorf("freeing a buffer this device does not hold: %w", ErrInvalid)
	}
	if err := d.bind(); err != nil {
		return err
	}
	defer d.unbind()
	delete(d.allocs, b)
	return d.freeLocked(b)
}

func (d *CUDADevice) freeLocked(b *CUDABuffer) error {
	if b.peer {
		if err := d.api.IPCCloseMemHandle(b.ptr); err != nil {
			return fmt.Errorf("closing a peer's buffer: %w", err)
		}
		return nil
	}
	if err := d.api.MemFree(b.ptr); err != nil {
		return fmt.Errorf("freeing device memory: %w", err)
	}
	return nil
}

func (d *CUDADevice) buffer(buf Buffer) (*CUDABuffer, error) {
	b, ok := buf.(*CUDABuffer)
	if !ok || b == nil {
		return nil, fmt.Errorf("buffer %T is not a CUDA buffer: %w", buf, ErrInvalid)
	}
	return b, nil
}

// NewStream returns a non-blocking CUDA stream (it does not synchronise with
// the legacy default stream).
func (d *CUDADevice) NewStream() (Stream, error) {
	if err := d.enter(); err != nil {
		return nil, err
	}
	defer d.leave()
	s, err := d.api.StreamCreate(cuda.StreamNonBlocking)
	if err != nil {
		return nil, fmt.Errorf("creating a CUDA stream: %w", err)
	}
	st := &cudaStream{d: d, s: s}
	d.streams[st] = struct{}{}
	return st, nil
}

// event returns a plain event (disable-timing) from the pool or a new one.
func (d *CUDADevice) event() (cuda.Event, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, fmt.Errorf("cuda device: %w", ErrClosed)
	}
	if n := len(d.pool); n > 0 {
		e := d.pool[n-1]
		d.pool = d.pool[:n-1]
		return e, nil
	}
	e, err := d.api.EventCreate(cuda.EventDisableTiming)
	if err != nil {
		return 0, fmt.Errorf("creating a CUDA event: %w", err)
	}
	d.events[e] = struct{}{}
	return e, nil
}

// recycle returns an unreachable event's handle to the pool.
func (d *CUDADevice) recycle(e cuda.Event) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.closed {
		d.pool = append(d.pool, e)
	}
}

// Close destroys the device's streams and events, frees its buffers,
// unregisters host memory, unloads the kernels and releases the context.
// Nothing may be queued or running. Close is idempotent.
func (d *CUDADevice) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	if err := d.bind(); err != nil {
		return err
	}
	defer d.unbind()
	var errs []error
	for s := range d.streams {
		errs = append(errs, s.destroy())
	}
	for e := range d.events {
		if err := d.api.EventDestroy(e); err != nil {
			errs = append(errs, fmt.Errorf("destroying a CUDA event: %w", err))
		}
	}
	for b := range d.allocs {
		errs = append(errs, d.freeLocked(b))
	}
	// A stream destroyed undrained may still run: leave it the host memory
	// it was given and the kernels it launched.
	for _, r := range *d.regs.Load() {
		if d.tainted {
			break
		}
		if err := d.api.MemHostUnregister(r.base); err != nil {
			errs = append(errs, fmt.Errorf("unregistering host memory: %w", err))
		}
	}
	if !d.tainted {
		if err := d.api.ModuleUnload(d.mod); err != nil {
			errs = append(errs, fmt.Errorf("unloading the reduction kernels: %w", err))
		}
	}
	if err := d.api.DevicePrimaryCtxRelease(d.dev); err != nil {
		errs = append(errs, fmt.Errorf("releasing the primary context: %w", err))
	}
	d.closed = true
	d.streams, d.events, d.allocs, d.pool = nil, nil, nil, nil
	d.regs.Store(&[]hostRange{})
	return errors.Join(errs...)
}

// poll calls query (with the context current) until it reports completion,
// an error, or ctx ends: busy for the first ~50µs (short collectives finish
// there), then napping with backoff up to 100µs. Naps are nanosleep calls:
// time.Sleep in an otherwise idle Go process can round up to a millisecond.
// The goroutine is locked to its thread only around each query: a Gosched
// of a locked goroutine hands the thread's P to another thread and back
// (two futex wakes, ~30µs measured, instead of ~0.1µs).
func (d *CUDADevice) poll(ctx context.Context, what string, query func() error) error {
	var start time.Time
	nap := 5 * time.Microsecond
	for i := 0; ; i++ {
		if err := d.bind(); err != nil {
			return err
		}
		err := query()
		d.unbind()
		if err == nil {
			return nil
		}
		if err != cuda.ErrNotReady && !errors.Is(err, cuda.ErrNotReady) {
			return fmt.Errorf("%s: %w", what, err)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w", what, ctx.Err())
		}
		if i == 0 {
			start = time.Now()
		}
		if time.Since(start) < 50*time.Microsecond {
			SpinPause(i)
			continue
		}
		ts := syscall.NsecToTimespec(nap.Nanoseconds())
		_ = syscall.Nanosleep(&ts, nil)
		nap = min(2*nap, 100*time.Microsecond)
	}
}
