package cuda

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// FakeKernel is a kernel of the Fake: a Go function run on the stream's
// worker when the launch reaches the head of the stream. mem resolves device
// pointers (allocations, registered host memory, opened IPC buffers) to bytes.
type FakeKernel func(mem FakeMemory, grid, block Dim3, args *Args) error

// FakeMemory resolves a device address range to the bytes behind it.
type FakeMemory interface {
	Memory(p DevicePtr, n uint64) ([]byte, error)
}

// FakeDevice describes one device of a Fake.
type FakeDevice struct {
	Name string
	// UUID is what DeviceGetUUID (cuDeviceGetUuid_v2) reports: the MIG UUID on a MIG device.
	UUID UUID
	// ParentUUID is what DeviceGetUUIDv1 reports: the physical GPU's UUID.
	ParentUUID UUID
	PCIBusID   string
	SMs        int
	TotalMem   uint64
}

// Fake is a host-memory implementation of Interface for tests. It behaves
// like the driver where migctl depends on it: Init first; contexts are
// current per OS thread (calls that need one fail with ErrInvalidContext on a
// thread without it); device memory is Go memory at addresses no host
// pointer can have; registered host memory maps to device pointers; every
// stream runs its work asynchronously on its own goroutine, in order; events
// complete when the work queued before them has; StreamWaitEvent orders
// streams; a failing kernel makes the error sticky, as on a GPU; IPC handles
// work between two Fakes of one process (two "processes") and not within one.
//
// Hold stops every stream before its next operation until Release, so tests
// can observe work that is queued but not done. Kernels are registered with
// AddKernel by name; ModuleLoadData accepts any non-empty image.
type Fake struct {
	id      uint64
	devices []FakeDevice

	mu        sync.Mutex
	cond      *sync.Cond
	inited    bool
	held      bool
	sticky    error
	next      uint64
	ctxRefs   map[Context]int
	current   map[int]Context // OS thread id -> context
	allocs    map[DevicePtr][]byte
	aliases   map[DevicePtr][]byte // opened IPC buffers
	hostRegs  []fakeHostReg
	streams   map[Stream]*fakeStream
	events    map[Event]*fakeEvent
	modules   map[Module]bool
	functions map[Function]string
	kernels   map[string]FakeKernel
	peerEvs   map[Event]fakePeerEvent // opened IPC events
	calls     map[string]int
	toDevice  atomic.Int64 // how long an asynchronous copy to the device takes, ns (SetCopyToDeviceTime)
}

type fakeHostReg struct {
	base  unsafe.Pointer
	addr  uintptr
	n     uint64
	flags uint32
}

type fakeStream struct {
	queue []func()
	busy  bool
	gone  bool
}

type fakePeerEvent struct {
	owner *Fake
	ev    *fakeEvent
}

type fakeEvent struct {
	flags    uint32
	recorded uint64 // generation of the last record
	done     uint64 // highest completed generation
	shared   bool
}

const fakeDeviceBase = 0x8000_0000_0000 // above every user-space host address

var (
	fakeIDs      atomic.Uint64
	fakeRegistry sync.Map // id -> *Fake
)

// NewFake returns a Fake with the given devices (one H200-like device if none).
func NewFake(devices ...FakeDevice) *Fake {
	if len(devices) == 0 {
		devices = []FakeDevice{{
			Name: "NVIDIA H200 (fake)", UUID: UUID{0xfa, 0x4e, 1}, ParentUUID: UUID{0xfa, 0x4e, 1},
			PCIBusID: "00000000:19:00.0", SMs: 132, TotalMem: 143771 << 20,
		}}
	}
	f := &Fake{
		id:        fakeIDs.Add(1),
		devices:   devices,
		next:      fakeDeviceBase,
		ctxRefs:   map[Context]int{},
		current:   map[int]Context{},
		allocs:    map[DevicePtr][]byte{},
		aliases:   map[DevicePtr][]byte{},
		streams:   map[Stream]*fakeStream{},
		events:    map[Event]*fakeEvent{},
		modules:   map[Module]bool{},
		functions: map[Function]string{},
		kernels:   map[string]FakeKernel{},
		peerEvs:   map[Event]fakePeerEvent{},
		calls:     map[string]int{},
	}
	f.cond = sync.NewCond(&f.mu)
	fakeRegistry.Store(f.id, f)
	return f
}

var _ Interface = (*Fake)(nil)

// AddKernel registers a kernel that ModuleGetFunction finds by name.
func (f *Fake) AddKernel(name string, k FakeKernel) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.kernels[name] = k
}

// Hold stops all streams before their next operation until Release.
func (f *Fake) Hold() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.held = true
}

// Release lets held streams run again.
func (f *Fake) Release() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.held = false
	f.cond.Broadcast()
}

// SetCopyToDeviceTime makes every asynchronous copy from host to device
// memory take d on its stream, as over a slow link, so that tests can see
// copies queued and not done; 0 (the default): at once.
func (f *Fake) SetCopyToDeviceTime(d time.Duration) { f.toDevice.Store(int64(d)) }

// linkTime is the time an asynchronous copy to the device takes.
func (f *Fake) linkTime() {
	if d := time.Duration(f.toDevice.Load()); d > 0 {
		time.Sleep(d)
	}
}

// Calls is how many times the named method (e.g. "MemAlloc") was called.
func (f *Fake) Calls(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

// Live counts what is currently allocated or created: device allocations,
// registered host ranges, streams and events.
func (f *Fake) Live() (allocs, hostRegs, streams, events int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.allocs), len(f.hostRegs), len(f.streams), len(f.events)
}

// Current is the context current on the calling OS thread (0 if none).
func (f *Fake) Current() Context {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.current[syscall.Gettid()]
}

// Memory resolves [p, p+n) to the bytes behind it: a device allocation, an
// opened IPC buffer, or registered host memory (through its device pointer).
func (f *Fake) Memory(p DevicePtr, n uint64) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.memory(p, n)
}

func (f *Fake) memory(p DevicePtr, n uint64) ([]byte, error) {
	for _, m := range []map[DevicePtr][]byte{f.allocs, f.aliases} {
		for base, b := range m {
			if p >= base && uint64(p-base)+n <= uint64(len(b)) {
				off := uint64(p - base)
				return b[off : off+n : off+n], nil
			}
		}
	}
	for _, r := range f.hostRegs {
		if r.flags&HostRegisterDeviceMap != 0 && uintptr(p) >= r.addr && uint64(uintptr(p)-r.addr)+n <= r.n {
			return unsafe.Slice((*byte)(unsafe.Add(r.base, uintptr(p)-r.addr)), n), nil
		}
	}
	return nil, fmt.Errorf("fake device address %#x+%d: %w", uint64(p), n, ErrIllegalAddress)
}

// host resolves [p, p+n) of host memory; copies from unregistered memory are
// allowed (the driver stages them), so this only guards nil.
func host(p unsafe.Pointer, n uint64) ([]byte, error) {
	if p == nil && n > 0 {
		return nil, ErrInvalidValue
	}
	return unsafe.Slice((*byte)(p), n), nil
}

// enter counts the call and checks Init and, if needCtx, a current context.
// It returns with f.mu held.
func (f *Fake) enter(method string, needCtx bool) error {
	f.mu.Lock()
	f.calls[method]++
	if !f.inited {
		return ErrNotInitialized
	}
	if needCtx {
		c := f.current[syscall.Gettid()]
		if c == 0 || f.ctxRefs[c] == 0 {
			return ErrInvalidContext
		}
	}
	return nil
}

func (f *Fake) handle() uint64 {
	f.next += 0x1000
	return f.next
}

func (f *Fake) Init(flags uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls["Init"]++
	if flags != 0 {
		return ErrInvalidValue
	}
	f.inited = true
	return nil
}

func (f *Fake) DriverGetVersion() (int, error) { return 13000, nil }

func (f *Fake) DeviceGetCount() (int, error) {
	defer f.mu.Unlock()
	if err := f.enter("DeviceGetCount", false); err != nil {
		return 0, err
	}
	return len(f.devices), nil
}

func (f *Fake) device(d Device) (*FakeDevice, error) {
	if d < 0 || int(d) >= len(f.devices) {
		return nil, ErrInvalidDevice
	}
	return &f.devices[d], nil
}

// fakeDeviceInfo is a device query: it counts the call, needs Init and a
// valid d, and reports what get reads from d's description.
func fakeDeviceInfo[T any](f *Fake, method string, d Device, get func(*FakeDevice) T) (T, error) {
	defer f.mu.Unlock()
	var zero T
	if err := f.enter(method, false); err != nil {
		return zero, err
	}
	dev, err := f.device(d)
	if err != nil {
		return zero, err
	}
	return get(dev), nil
}

func (f *Fake) DeviceGet(ordinal int) (Device, error) {
	defer f.mu.Unlock()
	if err := f.enter("DeviceGet", false); err != nil {
		return 0, err
	}
	if _, err := f.device(Device(ordinal)); err != nil {
		return 0, err
	}
	return Device(ordinal), nil
}

func (f *Fake) DeviceGetName(d Device) (string, error) {
	return fakeDeviceInfo(f, "DeviceGetName", d, func(dev *FakeDevice) string { return dev.Name })
}

func (f *Fake) DeviceGetUUID(d Device) (UUID, error) {
	return fakeDeviceInfo(f, "DeviceGetUUID", d, func(dev *FakeDevice) UUID { return dev.UUID })
}

func (f *Fake) DeviceGetUUIDv1(d Device) (UUID, error) {
	return fakeDeviceInfo(f, "DeviceGetUUIDv1", d, func(dev *FakeDevice) UUID { return dev.ParentUUID })
}

func (f *Fake) DeviceGetPCIBusID(d Device) (string, error) {
	return fakeDeviceInfo(f, "DeviceGetPCIBusID", d, func(dev *FakeDevice) string { return dev.PCIBusID })
}

func (f *Fake) DeviceGetAttribute(attr DeviceAttribute, d Device) (int, error) {
	defer f.mu.Unlock()
	if err := f.enter("DeviceGetAttribute", false); err != nil {
		return 0, err
	}
	dev, err := f.device(d)
	if err != nil {
		return 0, err
	}
	switch attr {
	case AttrMultiprocessorCount:
		return dev.SMs, nil
	case AttrMaxThreadsPerBlock:
		return 1024, nil
	case AttrUnifiedAddressing, AttrCanUseHostPointerForRegistered:
		return 1, nil
	case AttrComputeCapabilityMajor:
		return 9, nil
	case AttrComputeCapabilityMinor:
		return 0, nil
	}
	return 0, ErrInvalidValue
}

func (f *Fake) DeviceTotalMem(d Device) (uint64, error) {
	return fakeDeviceInfo(f, "DeviceTotalMem", d, func(dev *FakeDevice) uint64 { return dev.TotalMem })
}

func (f *Fake) DeviceCanAccessPeer(d, peer Device) (bool, error) {
	defer f.mu.Unlock()
	if err := f.enter("DeviceCanAccessPeer", false); err != nil {
		return false, err
	}
	if _, err := f.device(d); err != nil {
		return false, err
	}
	if _, err := f.device(peer); err != nil {
		return false, err
	}
	return d != peer, nil
}

func (f *Fake) DevicePrimaryCtxRetain(d Device) (Context, error) {
	defer f.mu.Unlock()
	if err := f.enter("DevicePrimaryCtxRetain", false); err != nil {
		return 0, err
	}
	if _, err := f.device(d); err != nil {
		return 0, err
	}
	c := Context(0xc0000 + uintptr(d))
	f.ctxRefs[c]++
	return c, nil
}

func (f *Fake) DevicePrimaryCtxRelease(d Device) error {
	defer f.mu.Unlock()
	if err := f.enter("DevicePrimaryCtxRelease", false); err != nil {
		return err
	}
	c := Context(0xc0000 + uintptr(d))
	if f.ctxRefs[c] == 0 {
		return ErrInvalidContext
	}
	f.ctxRefs[c]--
	return nil
}

func (f *Fake) CtxSetCurrent(c Context) error {
	defer f.mu.Unlock()
	if err := f.enter("CtxSetCurrent", false); err != nil {
		return err
	}
	if c != 0 && f.ctxRefs[c] == 0 {
		return ErrInvalidContext
	}
	f.current[syscall.Gettid()] = c
	return nil
}

func (f *Fake) CtxGetCurrent() (Context, error) {
	defer f.mu.Unlock()
	if err := f.enter("CtxGetCurrent", false); err != nil {
		return 0, err
	}
	return f.current[syscall.Gettid()], nil
}

func (f *Fake) CtxSynchronize() error {
	if err := f.enter("CtxSynchronize", true); err != nil {
		f.mu.Unlock()
		return err
	}
	defer f.mu.Unlock()
	for {
		idle := true
		for _, s := range f.streams {
			if len(s.queue) > 0 || s.busy {
				idle = false
			}
		}
		if idle || f.sticky != nil {
			return f.sticky
		}
		f.cond.Wait()
	}
}

func (f *Fake) MemAlloc(n uint64) (DevicePtr, error) {
	defer f.mu.Unlock()
	if err := f.enter("MemAlloc", true); err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, ErrInvalidValue
	}
	if n > f.devices[0].TotalMem {
		return 0, ErrOutOfMemory
	}
	p := DevicePtr(f.next + 0x1000)
	f.next += (n + 0x1fff) &^ 0xfff
	f.allocs[p] = make([]byte, n)
	return p, nil
}

func (f *Fake) MemFree(p DevicePtr) error {
	defer f.mu.Unlock()
	if err := f.enter("MemFree", true); err != nil {
		return err
	}
	if _, ok := f.allocs[p]; !ok {
		return ErrInvalidValue
	}
	delete(f.allocs, p)
	return nil
}

func (f *Fake) MemGetInfo() (uint64, uint64, error) {
	defer f.mu.Unlock()
	if err := f.enter("MemGetInfo", true); err != nil {
		return 0, 0, err
	}
	var used uint64
	for _, b := range f.allocs {
		used += uint64(len(b))
	}
	return f.devices[0].TotalMem - used, f.devices[0].TotalMem, nil
}

func (f *Fake) MemsetD8(p DevicePtr, v uint8, n uint64) error {
	defer f.mu.Unlock()
	if err := f.enter("MemsetD8", true); err != nil {
		return err
	}
	b, err := f.memory(p, n)
	if err != nil {
		return ErrInvalidValue
	}
	for i := range b {
		b[i] = v
	}
	return nil
}

func (f *Fake) MemsetD8Async(p DevicePtr, v uint8, n uint64, s Stream) error {
	return f.enqueue("MemsetD8Async", s, func() error {
		b, err := f.Memory(p, n)
		if err != nil {
			return err
		}
		for i := range b {
			b[i] = v
		}
		return nil
	})
}

func (f *Fake) MemHostRegister(p unsafe.Pointer, n uint64, flags uint32) error {
	defer f.mu.Unlock()
	if err := f.enter("MemHostRegister", true); err != nil {
		return err
	}
	if p == nil || n == 0 || flags&^0xf != 0 {
		return ErrInvalidValue
	}
	addr := uintptr(p)
	for _, r := range f.hostRegs {
		if addr < r.addr+uintptr(r.n) && r.addr < addr+uintptr(n) {
			return ErrHostMemoryAlreadyRegistered
		}
	}
	f.hostRegs = append(f.hostRegs, fakeHostReg{base: p, addr: addr, n: n, flags: flags})
	sort.Slice(f.hostRegs, func(i, j int) bool { return f.hostRegs[i].addr < f.hostRegs[j].addr })
	return nil
}

func (f *Fake) MemHostUnregister(p unsafe.Pointer) error {
	defer f.mu.Unlock()
	if err := f.enter("MemHostUnregister", true); err != nil {
		return err
	}
	for i, r := range f.hostRegs {
		if r.addr == uintptr(p) {
			f.hostRegs = append(f.hostRegs[:i], f.hostRegs[i+1:]...)
			return nil
		}
	}
	return ErrHostMemoryNotRegistered
}

func (f *Fake) MemHostGetDevicePointer(p unsafe.Pointer, flags uint32) (DevicePtr, error) {
	defer f.mu.Unlock()
	if err := f.enter("MemHostGetDevicePointer", true); err != nil {
		return 0, err
	}
	if flags != 0 {
		return 0, ErrInvalidValue
	}
	for _, r := range f.hostRegs {
		if uintptr(p) >= r.addr && uintptr(p) < r.addr+uintptr(r.n) {
			if r.flags&HostRegisterDeviceMap == 0 {
				return 0, ErrInvalidValue
			}
			return DevicePtr(uintptr(p)), nil // unified addressing: same address
		}
	}
	return 0, ErrInvalidValue
}

func (f *Fake) copyNow(dst, src []byte) { copy(dst, src) }

func (f *Fake) MemcpyHtoD(dst DevicePtr, src unsafe.Pointer, n uint64) error {
	defer f.mu.Unlock()
	if err := f.enter("MemcpyHtoD", true); err != nil {
		return err
	}
	d, err := f.memory(dst, n)
	if err != nil {
		return ErrInvalidValue
	}
	s, err := host(src, n)
	if err != nil {
		return err
	}
	f.copyNow(d, s)
	return nil
}

func (f *Fake) MemcpyDtoH(dst unsafe.Pointer, src DevicePtr, n uint64) error {
	defer f.mu.Unlock()
	if err := f.enter("MemcpyDtoH", true); err != nil {
		return err
	}
	s, err := f.memory(src, n)
	if err != nil {
		return ErrInvalidValue
	}
	d, err := host(dst, n)
	if err != nil {
		return err
	}
	f.copyNow(d, s)
	return nil
}

func (f *Fake) MemcpyHtoDAsync(dst DevicePtr, src unsafe.Pointer, n uint64, s Stream) error {
	h, err := host(src, n)
	if err != nil {
		return err
	}
	return f.enqueue("MemcpyHtoDAsync", s, func() error {
		f.linkTime()
		d, err := f.Memory(dst, n)
		if err != nil {
			return err
		}
		copy(d, h)
		return nil
	})
}

func (f *Fake) MemcpyDtoHAsync(dst unsafe.Pointer, src DevicePtr, n uint64, s Stream) error {
	h, err := host(dst, n)
	if err != nil {
		return err
	}
	return f.enqueue("MemcpyDtoHAsync", s, func() error {
		d, err := f.Memory(src, n)
		if err != nil {
			return err
		}
		copy(h, d)
		return nil
	})
}

func (f *Fake) Memcpy2DHtoDAsync(dst DevicePtr, dpitch uint64, src unsafe.Pointer, spitch, width, height uint64, s Stream) error {
	if width > dpitch || width > spitch || height == 0 {
		return ErrInvalidValue
	}
	h, err := host(src, spitch*(height-1)+width)
	if err != nil {
		return err
	}
	return f.enqueue("Memcpy2DHtoDAsync", s, func() error {
		f.linkTime()
		d, err := f.Memory(dst, dpitch*(height-1)+width)
		if err != nil {
			return err
		}
		for y := range height {
			copy(d[y*dpitch:y*dpitch+width], h[y*spitch:y*spitch+width])
		}
		return nil
	})
}

func (f *Fake) MemcpyDtoDAsync(dst, src DevicePtr, n uint64, s Stream) error {
	return f.enqueue("MemcpyDtoDAsync", s, func() error {
		d, err := f.Memory(dst, n)
		if err != nil {
			return err
		}
		v, err := f.Memory(src, n)
		if err != nil {
			return err
		}
		copy(d, v)
		return nil
	})
}

// enqueue appends op to stream s (validated under the lock) and wakes its worker.
func (f *Fake) enqueue(method string, s Stream, op func() error) error {
	defer f.mu.Unlock()
	if err := f.enter(method, true); err != nil {
		return err
	}
	if f.sticky != nil {
		return f.sticky
	}
	st, ok := f.streamLocked(s)
	if !ok {
		return ErrInvalidHandle
	}
	st.queue = append(st.queue, func() {
		if err := op(); err != nil {
			f.mu.Lock()
			if f.sticky == nil {
				f.sticky = fmt.Errorf("%s: %w", method, err)
			}
			f.mu.Unlock()
		}
	})
	f.cond.Broadcast()
	return nil
}

func (f *Fake) StreamCreate(flags uint32) (Stream, error) {
	defer f.mu.Unlock()
	if err := f.enter("StreamCreate", true); err != nil {
		return 0, err
	}
	if flags&^StreamNonBlocking != 0 {
		return 0, ErrInvalidValue
	}
	s := Stream(f.handle())
	st := &fakeStream{}
	f.streams[s] = st
	go f.run(st)
	return s, nil
}

// run is the worker of one stream: it runs queued operations in order.
func (f *Fake) run(st *fakeStream) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for {
		for !st.gone && (len(st.queue) == 0 || f.held) {
			f.cond.Wait()
		}
		if len(st.queue) == 0 { // gone and drained
			return
		}
		op := st.queue[0]
		st.queue = st.queue[1:]
		st.busy = true
		f.mu.Unlock()
		op()
		f.mu.Lock()
		st.busy = false
		f.cond.Broadcast()
	}
}

func (f *Fake) StreamDestroy(s Stream) error {
	defer f.mu.Unlock()
	if err := f.enter("StreamDestroy", true); err != nil {
		return err
	}
	st, ok := f.streams[s]
	if !ok {
		return ErrInvalidHandle
	}
	st.gone = true // the worker drains what is queued, then exits
	delete(f.streams, s)
	f.cond.Broadcast()
	return nil
}

func (f *Fake) StreamQuery(s Stream) error {
	defer f.mu.Unlock()
	if err := f.enter("StreamQuery", true); err != nil {
		return err
	}
	st, ok := f.streamLocked(s) // the legacy default stream (0) exists without being created
	if !ok {
		return ErrInvalidHandle
	}
	if f.sticky != nil {
		return f.sticky
	}
	if len(st.queue) > 0 || st.busy {
		return ErrNotReady
	}
	return nil
}

func (f *Fake) StreamSynchronize(s Stream) error {
	defer f.mu.Unlock()
	if err := f.enter("StreamSynchronize", true); err != nil {
		return err
	}
	st, ok := f.streams[s]
	if !ok {
		return ErrInvalidHandle
	}
	for (len(st.queue) > 0 || st.busy) && f.sticky == nil {
		f.cond.Wait()
	}
	return f.sticky
}

func (f *Fake) StreamWaitEvent(s Stream, e Event, flags uint32) error {
	f.mu.Lock()
	ev, ok := f.events[e]
	var gen uint64
	if ok {
		gen = ev.recorded
	}
	pe, isPeer := f.peerEvs[e]
	f.mu.Unlock()
	if isPeer {
		return f.enqueue("StreamWaitEvent", s, func() error { pe.wait(); return nil })
	}
	if !ok {
		f.mu.Lock()
		f.calls["StreamWaitEvent"]++
		f.mu.Unlock()
		return ErrInvalidHandle
	}
	if flags != 0 {
		return ErrInvalidValue
	}
	return f.enqueue("StreamWaitEvent", s, func() error {
		f.mu.Lock()
		defer f.mu.Unlock()
		for ev.done < gen && f.sticky == nil {
			f.cond.Wait()
		}
		return nil
	})
}

// memWord resolves the 8-byte word at device address addr (device memory
// or mapped registered host memory) for StreamWaitValue64 and
// StreamWriteValue64; it counts a failed call as enter would.
func (f *Fake) memWord(method string, addr DevicePtr) (*atomic.Uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, err := f.memory(addr, 8)
	if err == nil && addr%8 != 0 {
		err = ErrInvalidValue
	}
	if err != nil {
		f.calls[method]++
		return nil, err
	}
	return (*atomic.Uint64)(unsafe.Pointer(unsafe.SliceData(b))), nil
}

// StreamWaitValue64 queues a wait that polls the word until it passes the
// test, as the driver compares: GEQ as (int64)(word - v) >= 0 (it wraps).
// The wait ends early, letting later work run, only when the stream is
// destroyed or an error is sticky (a real wait would hang: tests must not).
func (f *Fake) StreamWaitValue64(s Stream, addr DevicePtr, v uint64, flags uint32) error {
	if flags != StreamWaitValueGEQ && flags != StreamWaitValueEQ {
		return ErrInvalidValue
	}
	w, err := f.memWord("StreamWaitValue64", addr)
	if err != nil {
		return err
	}
	f.mu.Lock()
	st := f.streams[s]
	f.mu.Unlock()
	return f.enqueue("StreamWaitValue64", s, func() error {
		for i := 0; ; i++ {
			if x := w.Load(); flags == StreamWaitValueGEQ && int64(x-v) >= 0 || flags == StreamWaitValueEQ && x == v {
				return nil
			}
			f.mu.Lock()
			quit := f.sticky != nil || st != nil && st.gone
			f.mu.Unlock()
			if quit {
				return nil
			}
			if i < 1000 {
				runtime.Gosched()
			} else {
				time.Sleep(20 * time.Microsecond)
			}
		}
	})
}

// StreamWriteValue64 queues a store of v into the word.
func (f *Fake) StreamWriteValue64(s Stream, addr DevicePtr, v uint64, flags uint32) error {
	if flags != StreamWriteValueDefault {
		return ErrInvalidValue
	}
	w, err := f.memWord("StreamWriteValue64", addr)
	if err != nil {
		return err
	}
	return f.enqueue("StreamWriteValue64", s, func() error {
		w.Store(v)
		return nil
	})
}

func (f *Fake) EventCreate(flags uint32) (Event, error) {
	defer f.mu.Unlock()
	if err := f.enter("EventCreate", true); err != nil {
		return 0, err
	}
	if flags&^0x7 != 0 || (flags&EventInterprocess != 0 && flags&EventDisableTiming == 0) {
		return 0, ErrInvalidValue
	}
	e := Event(f.handle())
	f.events[e] = &fakeEvent{flags: flags}
	return e, nil
}

func (f *Fake) EventDestroy(e Event) error {
	defer f.mu.Unlock()
	if err := f.enter("EventDestroy", true); err != nil {
		return err
	}
	if _, ok := f.peerEvs[e]; ok {
		delete(f.peerEvs, e)
		return nil
	}
	if _, ok := f.events[e]; !ok {
		return ErrInvalidHandle
	}
	delete(f.events, e)
	return nil
}

func (f *Fake) EventRecord(e Event, s Stream) error {
	f.mu.Lock()
	ev, ok := f.events[e]
	f.mu.Unlock()
	if !ok {
		return ErrInvalidHandle
	}
	var gen uint64
	err := f.enqueueLocked("EventRecord", s, func() {
		ev.recorded++
		gen = ev.recorded
	}, func() error {
		f.mu.Lock()
		defer f.mu.Unlock()
		if gen > ev.done {
			ev.done = gen
		}
		f.cond.Broadcast()
		return nil
	})
	return err
}

// streamLocked returns stream s if it exists and is not destroyed. The
// legacy default stream (0) exists in every context; it is made on first
// use. Caller holds f.mu.
func (f *Fake) streamLocked(s Stream) (*fakeStream, bool) {
	st, ok := f.streams[s]
	if !ok && s == 0 {
		st, ok = &fakeStream{}, true
		f.streams[0] = st
		go f.run(st)
	}
	return st, ok && !st.gone
}

// enqueueLocked is enqueue with a hook run under the lock at enqueue time.
func (f *Fake) enqueueLocked(method string, s Stream, atEnqueue func(), op func() error) error {
	defer f.mu.Unlock()
	if err := f.enter(method, true); err != nil {
		return err
	}
	if f.sticky != nil {
		return f.sticky
	}
	st, ok := f.streamLocked(s)
	if !ok {
		return ErrInvalidHandle
	}
	atEnqueue()
	st.queue = append(st.queue, func() { _ = op() })
	f.cond.Broadcast()
	return nil
}

func (f *Fake) EventQuery(e Event) error {
	defer f.mu.Unlock()
	if err := f.enter("EventQuery", true); err != nil {
		return err
	}
	if pe, ok := f.peerEvs[e]; ok {
		return pe.query()
	}
	ev, ok := f.events[e]
	if !ok {
		return ErrInvalidHandle
	}
	if f.sticky != nil {
		return f.sticky
	}
	if ev.done < ev.recorded {
		return ErrNotReady
	}
	return nil
}

func (pe fakePeerEvent) query() error {
	pe.owner.mu.Lock()
	defer pe.owner.mu.Unlock()
	if pe.ev.done < pe.ev.recorded {
		return ErrNotReady
	}
	return nil
}

// wait blocks until the peer event's recording at call time has completed.
func (pe fakePeerEvent) wait() {
	pe.owner.mu.Lock()
	defer pe.owner.mu.Unlock()
	gen := pe.ev.recorded
	for pe.ev.done < gen && pe.owner.sticky == nil {
		pe.owner.cond.Wait()
	}
}

func (f *Fake) EventSynchronize(e Event) error {
	defer f.mu.Unlock()
	if err := f.enter("EventSynchronize", true); err != nil {
		return err
	}
	if pe, ok := f.peerEvs[e]; ok {
		f.mu.Unlock()
		pe.wait()
		f.mu.Lock()
		return nil
	}
	ev, ok := f.events[e]
	if !ok {
		return ErrInvalidHandle
	}
	gen := ev.recorded
	for ev.done < gen && f.sticky == nil {
		f.cond.Wait()
	}
	return f.sticky
}

// IPC handles of the Fake: bytes 0..7 the exporting Fake's id, 8..15 the
// address (allocation base or event handle), 16..23 the size.
func (f *Fake) IPCGetMemHandle(p DevicePtr) (IPCMemHandle, error) {
	var h IPCMemHandle
	defer f.mu.Unlock()
	if err := f.enter("IPCGetMemHandle", true); err != nil {
		return h, err
	}
	b, ok := f.allocs[p]
	if !ok {
		return h, ErrInvalidValue
	}
	binary.LittleEndian.PutUint64(h[0:], f.id)
	binary.LittleEndian.PutUint64(h[8:], uint64(p))
	binary.LittleEndian.PutUint64(h[16:], uint64(len(b)))
	return h, nil
}

func peerFake(id uint64, self uint64) (*Fake, error) {
	if id == self {
		return nil, ErrInvalidContext // a process cannot open its own handle
	}
	v, ok := fakeRegistry.Load(id)
	if !ok {
		return nil, ErrInvalidValue
	}
	return v.(*Fake), nil
}

func (f *Fake) IPCOpenMemHandle(h IPCMemHandle, flags uint32) (DevicePtr, error) {
	if err := f.enter("IPCOpenMemHandle", true); err != nil {
		f.mu.Unlock()
		return 0, err
	}
	f.mu.Unlock()
	peer, err := peerFake(binary.LittleEndian.Uint64(h[0:]), f.id)
	if err != nil {
		return 0, err
	}
	b, err := peer.Memory(DevicePtr(binary.LittleEndian.Uint64(h[8:])), binary.LittleEndian.Uint64(h[16:]))
	if err != nil {
		return 0, ErrInvalidValue
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	p := DevicePtr(f.next + 0x1000)
	f.next += (uint64(len(b)) + 0x1fff) &^ 0xfff
	f.aliases[p] = b
	return p, nil
}

func (f *Fake) IPCCloseMemHandle(p DevicePtr) error {
	defer f.mu.Unlock()
	if err := f.enter("IPCCloseMemHandle", true); err != nil {
		return err
	}
	if _, ok := f.aliases[p]; !ok {
		return ErrInvalidValue
	}
	delete(f.aliases, p)
	return nil
}

func (f *Fake) IPCGetEventHandle(e Event) (IPCEventHandle, error) {
	var h IPCEventHandle
	defer f.mu.Unlock()
	if err := f.enter("IPCGetEventHandle", true); err != nil {
		return h, err
	}
	ev, ok := f.events[e]
	if !ok {
		return h, ErrInvalidHandle
	}
	if ev.flags&EventInterprocess == 0 {
		return h, ErrInvalidValue
	}
	ev.shared = true
	binary.LittleEndian.PutUint64(h[0:], f.id)
	binary.LittleEndian.PutUint64(h[8:], uint64(e))
	return h, nil
}

func (f *Fake) IPCOpenEventHandle(h IPCEventHandle) (Event, error) {
	if err := f.enter("IPCOpenEventHandle", true); err != nil {
		f.mu.Unlock()
		return 0, err
	}
	f.mu.Unlock()
	peer, err := peerFake(binary.LittleEndian.Uint64(h[0:]), f.id)
	if err != nil {
		return 0, err
	}
	peer.mu.Lock()
	ev, ok := peer.events[Event(binary.LittleEndian.Uint64(h[8:]))]
	peer.mu.Unlock()
	if !ok || !ev.shared {
		return 0, ErrInvalidValue
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	e := Event(f.handle())
	// The opened event is a view of the peer's: queries and waits see the
	// peer's progress, under the peer's lock.
	f.peerEvs[e] = fakePeerEvent{owner: peer, ev: ev}
	return e, nil
}

func (f *Fake) ModuleLoadData(image []byte) (Module, error) {
	defer f.mu.Unlock()
	if err := f.enter("ModuleLoadData", true); err != nil {
		return 0, err
	}
	if len(image) == 0 {
		return 0, ErrInvalidImage
	}
	m := Module(f.handle())
	f.modules[m] = true
	return m, nil
}

func (f *Fake) ModuleUnload(m Module) error {
	defer f.mu.Unlock()
	if err := f.enter("ModuleUnload", true); err != nil {
		return err
	}
	if !f.modules[m] {
		return ErrInvalidHandle
	}
	delete(f.modules, m)
	return nil
}

func (f *Fake) ModuleGetFunction(m Module, name string) (Function, error) {
	defer f.mu.Unlock()
	if err := f.enter("ModuleGetFunction", true); err != nil {
		return 0, err
	}
	if !f.modules[m] {
		return 0, ErrInvalidHandle
	}
	if _, ok := f.kernels[name]; !ok {
		return 0, ErrNotFound
	}
	fn := Function(f.handle())
	f.functions[fn] = name
	return fn, nil
}

func (f *Fake) LaunchKernel(fn Function, grid, block Dim3, sharedMem uint32, s Stream, args *Args) error {
	if args.Overflow() {
		return ErrInvalidValue
	}
	if grid.X == 0 || grid.Y == 0 || grid.Z == 0 || block.X == 0 || block.Y == 0 || block.Z == 0 ||
		block.X*block.Y*block.Z > 1024 {
		f.mu.Lock()
		f.calls["LaunchKernel"]++
		f.mu.Unlock()
		return ErrInvalidValue
	}
	f.mu.Lock()
	name, ok := f.functions[fn]
	k := f.kernels[name]
	f.mu.Unlock()
	if !ok {
		return ErrInvalidHandle
	}
	a := *args // the driver copies parameters at launch
	return f.enqueue("LaunchKernel", s, func() error {
		if err := k(f, grid, block, &a); err != nil {
			return fmt.Errorf("kernel %s: %w", name, err)
		}
		return nil
	})
}

// Kernel returns the kernel registered under name, e.g. to wrap it.
func (f *Fake) Kernel(name string) (FakeKernel, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k, ok := f.kernels[name]
	return k, ok
}
