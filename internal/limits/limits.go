package limits

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/migctl/migctl/allreduce"
	"github.com/migctl/migctl/comm"
	"github.com/migctl/migctl/internal/cuda"
)

// ErrInvalid reports unusable options or cache contents.
var ErrInvalid = errors.New("invalid")

// Host is the CPU's reduction bandwidth, in GiB/s of input read: Inputs
// float32 buffers of Bytes each summed by one thread, and by Threads; and
// the host's memory bandwidth as the CPU alone reaches it.
type Host struct {
	Hostname         string  `json:"hostname" yaml:"hostname"`
	CPUs             int     `json:"cpus" yaml:"cpus"`
	Inputs           int     `json:"inputs" yaml:"inputs"`
	Bytes            int     `json:"bytes" yaml:"bytes"`
	Threads          int     `json:"threads" yaml:"threads"`
	ReduceThreadGiBs float64 `json:"reduceThreadGiBs" yaml:"reduceThreadGiBs"`
	ReduceHostGiBs   float64 `json:"reduceHostGiBs" yaml:"reduceHostGiBs"`
	// MemoryGiBs is the bytes read plus the bytes written per second
	// when Threads goroutines each copy their part of one MemoryBytes
	// buffer into another (Go's copy, large enough to miss every cache):
	// what host memory moves for the CPU alone, with no DMA. Each byte
	// copied counts twice, once read and once written (a write-allocate
	// read of the destination, where the copy makes one, is not counted).
	// 0: not measured (a cache from before it existed).
	MemoryBytes int       `json:"memoryBytes,omitempty" yaml:"memoryBytes,omitempty"`
	MemoryGiBs  float64   `json:"memoryGiBs,omitempty" yaml:"memoryGiBs,omitempty"`
	Measured    time.Time `json:"measured" yaml:"measured"`
}

// GPU is one device's pinned copy bandwidth and small round trip.
type GPU struct {
	Ordinal int    `json:"ordinal" yaml:"ordinal"`
	UUID    string `json:"uuid" yaml:"uuid"`
	Name    string `json:"name" yaml:"name"`
	Bytes   int    `json:"bytes" yaml:"bytes"`
	// H2DGiBs and D2HGiBs each way alone; DuplexGiBs both at once, the two
	// directions together.
	H2DGiBs    float64 `json:"h2dGiBs" yaml:"h2dGiBs"`
	D2HGiBs    float64 `json:"d2hGiBs" yaml:"d2hGiBs"`
	DuplexGiBs float64 `json:"duplexGiBs" yaml:"duplexGiBs"`
	// RoundTripUS is the median of an 8-KiB copy out and back in.
	RoundTripUS float64 `json:"roundTripUs" yaml:"roundTripUs"`
	// The contended measurement: the same copies both ways at once, issued
	// back to back for about a second, while ContendedThreads goroutines
	// reduce float32 sums of 4 pageable buffers of ContendedBytes each
	// (each goroutine its own part, round and round). ContendedCopyGiBs is
	// the copies' rate then, the two directions together;
	// ContendedReduceGiBs the CPU's, in GiB/s of input read, over the same
	// window. HostMemUnderDMAGiBs is what host memory moved in all per
	// second: the device→host copies' writes + the host→device copies'
	// reads + the reductions' reads + their writes (a quarter of the
	// reads: one output per 4 inputs) — the figure the cost model charges
	// host-staged schedules against (allreduce.Machine.HostMemGiBs). All
	// 0: not measured (a cache from before it existed).
	ContendedThreads    int       `json:"contendedThreads,omitempty" yaml:"contendedThreads,omitempty"`
	ContendedBytes      int       `json:"contendedBytes,omitempty" yaml:"contendedBytes,omitempty"`
	ContendedCopyGiBs   float64   `json:"contendedCopyGiBs,omitempty" yaml:"contendedCopyGiBs,omitempty"`
	ContendedReduceGiBs float64   `json:"contendedReduceGiBs,omitempty" yaml:"contendedReduceGiBs,omitempty"`
	HostMemUnderDMAGiBs float64   `json:"hostMemUnderDMAGiBs,omitempty" yaml:"hostMemUnderDMAGiBs,omitempty"`
	Measured            time.Time `json:"measured" yaml:"measured"`
}

// Limits is one host's measured figures.
type Limits struct {
	Host Host  `json:"host" yaml:"host"`
	GPUs []GPU `json:"gpus" yaml:"gpus"`
}

// HostOptions shape MeasureHost; zero fields take defaults.
type HostOptions struct {
	Bytes   int // per input (default 64 MiB)
	Inputs  int // default 4
	Threads int // default runtime.NumCPU()
	Reps    int // best of (default 3)
	// MemoryBytes is the source and the destination of the memory copy,
	// each (default 512 MiB: with both, beyond any last-level cache).
	MemoryBytes int
}

// MeasureHost times comm.ReduceHost of float32 sums on one thread and on
// Threads, and a copy of MemoryBytes split over Threads goroutines, each
// after one untimed pass, and keeps the best of Reps each.
func MeasureHost(ctx context.Context, o HostOptions) (Host, error) {
	if o.Bytes <= 0 {
		o.Bytes = 64 << 20
	}
	if o.Inputs <= 0 {
		o.Inputs = 4
	}
	if o.Threads <= 0 {
		o.Threads = runtime.NumCPU()
	}
	if o.Reps <= 0 {
		o.Reps = 3
	}
	if o.MemoryBytes <= 0 {
		o.MemoryBytes = 512 << 20
	}
	o.Bytes &^= 63
	o.MemoryBytes &^= 63
	if o.Bytes == 0 || o.MemoryBytes == 0 {
		return Host{}, fmt.Errorf("measuring reductions or copies of under 64 bytes: %w", ErrInvalid)
	}
	h := Host{CPUs: runtime.NumCPU(), Inputs: o.Inputs, Bytes: o.Bytes, Threads: o.Threads, MemoryBytes: o.MemoryBytes,
		Measured: time.Now().UTC()}
	h.Hostname, _ = os.Hostname()
	srcs := make([][]byte, o.Inputs)
	for i := range srcs {
		srcs[i] = make([]byte, o.Bytes)
		for j := 0; j < o.Bytes; j += 4096 {
			srcs[i][j] = 1 // touch every page
		}
	}
	dst := make([]byte, o.Bytes)
	rate := func(threads int) (float64, error) {
		best := 0.0
		for rep := range o.Reps + 1 {
			if err := ctx.Err(); err != nil {
				return 0, err
			}
			start := time.Now()
			if err := comm.ReduceHost(dst, srcs, comm.Float32, comm.Sum, threads); err != nil {
				return 0, err
			}
			if d := time.Since(start).Seconds(); rep > 0 && d > 0 {
				best = max(best, float64(o.Inputs*o.Bytes)/d/allreduce.GiB)
			}
		}
		return best, nil
	}
	var err error
	if h.ReduceThreadGiBs, err = rate(1); err != nil {
		return h, fmt.Errorf("measuring a one-thread reduction: %w", err)
	}
	if h.ReduceHostGiBs, err = rate(o.Threads); err != nil {
		return h, fmt.Errorf("measuring a %d-thread reduction: %w", o.Threads, err)
	}
	srcs, dst = nil, nil // let the reduction's buffers go before the copy's
	if h.MemoryGiBs, err = memoryRate(ctx, o.MemoryBytes, o.Threads, o.Reps); err != nil {
		return h, fmt.Errorf("measuring a %d-thread memory copy: %w", o.Threads, err)
	}
	return h, nil
}

// memoryRate is the best of reps copies of bytes from one buffer into
// another by threads goroutines (each a 64-byte aligned part), after one
// untimed pass, in GiB/s of bytes read plus bytes written.
func memoryRate(ctx context.Context, bytes, threads, reps int) (float64, error) {
	src, dst := make([]byte, bytes), make([]byte, bytes)
	for j := 0; j < bytes; j += 4096 {
		src[j], dst[j] = 1, 1 // touch every page
	}
	part := func(i int) int { return (bytes / 64 * i / threads) * 64 }
	best := 0.0
	var wg sync.WaitGroup
	for rep := range reps + 1 {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		start := time.Now()
		for i := range threads {
			wg.Add(1)
			go func(lo, hi int) {
				defer wg.Done()
				copy(dst[lo:hi], src[lo:hi])
			}(part(i), part(i+1))
		}
		wg.Wait()
		if d := time.Since(start).Seconds(); rep > 0 && d > 0 {
			best = max(best, float64(2*bytes)/d/allreduce.GiB)
		}
	}
	return best, nil
}

// GPUOptions shape MeasureGPU; zero fields take defaults.
type GPUOptions struct {
	Bytes      int // per copy (default 256 MiB)
	Reps       int // best of (default 5)
	RoundTrips int // 8-KiB round trips, median (default 200)
	// ContendFor is how long the contended measurement copies (default
	// 1 s; negative: skip it); ContendThreads the goroutines reducing
	// meanwhile (default runtime.NumCPU()−1, at least 1: a core is left to
	// the thread issuing copies); ContendBytes each of the reduction's 4
	// pageable inputs (default 128 MiB).
	ContendFor     time.Duration
	ContendThreads int
	ContendBytes   int
}

// contendInputs is the number of inputs the contended reduction sums.
const contendInputs = 4

// MeasureGPU times pinned copies on CUDA device ordinal: host→device and
// device→host alone and at once on two streams (best of Reps), the same
// copies both ways again while CPU threads reduce in host memory (the
// contended figures of GPU), and the median of 8-KiB round trips. It needs
// the device and the host to itself to be meaningful; it initializes the
// driver and uses the primary context. It blocks for a few seconds at the
// default sizes and returns early with ctx's error when ctx is done.
func MeasureGPU(ctx context.Context, api cuda.Interface, ordinal int, o GPUOptions) (g GPU, err error) {
	if o.Bytes <= 0 {
		o.Bytes = 256 << 20
	}
	if o.Reps <= 0 {
		o.Reps = 5
	}
	if o.RoundTrips <= 0 {
		o.RoundTrips = 200
	}
	if o.ContendFor == 0 {
		o.ContendFor = time.Second
	}
	if o.ContendThreads <= 0 {
		o.ContendThreads = max(1, runtime.NumCPU()-1)
	}
	if o.ContendBytes <= 0 {
		o.ContendBytes = 128 << 20
	}
	o.ContendBytes = max(o.ContendBytes&^63, 64)
	const small = 8 << 10
	o.Bytes = max(o.Bytes, small)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := api.Init(0); err != nil {
		return g, fmt.Errorf("initializing CUDA: %w", err)
	}
	dev, err := api.DeviceGet(ordinal)
	if err != nil {
		return g, fmt.Errorf("CUDA device %d: %w", ordinal, err)
	}
	g = GPU{Ordinal: ordinal, Bytes: o.Bytes, Measured: time.Now().UTC()}
	if g.Name, err = api.DeviceGetName(dev); err != nil {
		return g, fmt.Errorf("reading the name of CUDA device %d: %w", ordinal, err)
	}
	if g.UUID, err = DeviceUUID(api, dev); err != nil {
		return g, fmt.Errorf("reading the UUID of CUDA device %d: %w", ordinal, err)
	}
	cctx, err := api.DevicePrimaryCtxRetain(dev)
	if err != nil {
		return g, fmt.Errorf("retaining the context of CUDA device %d: %w", ordinal, err)
	}
	defer func() { _ = api.DevicePrimaryCtxRelease(dev) }()
	if err := api.CtxSetCurrent(cctx); err != nil {
		return g, err
	}
	var cleanup []func()
	defer func() {
		for i := len(cleanup) - 1; i >= 0; i-- {
			cleanup[i]()
		}
	}()
	host := func() (unsafe.Pointer, error) {
		mem, err := unix.Mmap(-1, 0, o.Bytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		if err != nil {
			return nil, fmt.Errorf("mapping %d bytes of host memory: %w", o.Bytes, err)
		}
		cleanup = append(cleanup, func() { _ = unix.Munmap(mem) })
		p := unsafe.Pointer(&mem[0])
		if err := api.MemHostRegister(p, uint64(o.Bytes), cuda.HostRegisterPortable); err != nil {
			return nil, fmt.Errorf("pinning %d bytes of host memory: %w", o.Bytes, err)
		}
		cleanup = append(cleanup, func() { _ = api.MemHostUnregister(p) })
		return p, nil
	}
	device := func() (cuda.DevicePtr, error) {
		d, err := api.MemAlloc(uint64(o.Bytes))
		if err != nil {
			return 0, fmt.Errorf("allocating %d bytes on CUDA device %d: %w", o.Bytes, ordinal, err)
		}
		cleanup = append(cleanup, func() { _ = api.MemFree(d) })
		return d, nil
	}
	stream := func() (cuda.Stream, error) {
		s, err := api.StreamCreate(cuda.StreamNonBlocking)
		if err != nil {
			return 0, err
		}
		cleanup = append(cleanup, func() { _ = api.StreamDestroy(s) })
		return s, nil
	}
	h1, err := host()
	if err != nil {
		return g, err
	}
	h2, err := host()
	if err != nil {
		return g, err
	}
	d1, err := device()
	if err != nil {
		return g, err
	}
	d2, err := device()
	if err != nil {
		return g, err
	}
	s1, err := stream()
	if err != nil {
		return g, err
	}
	s2, err := stream()
	if err != nil {
		return g, err
	}
	n := uint64(o.Bytes)
	h2d := func(s cuda.Stream) error { return api.MemcpyHtoDAsync(d1, h1, n, s) }
	d2h := func(s cuda.Stream) error { return api.MemcpyDtoHAsync(h2, d2, n, s) }
	best := func(bytes float64, issue func() error) (float64, error) {
		b := 0.0
		for rep := range o.Reps + 1 {
			if err := ctx.Err(); err != nil {
				return 0, err
			}
			start := time.Now()
			if err := issue(); err != nil {
				return 0, err
			}
			for _, s := range []cuda.Stream{s1, s2} {
				if err := api.StreamSynchronize(s); err != nil {
					return 0, err
				}
			}
			if d := time.Since(start).Seconds(); rep > 0 && d > 0 {
				b = max(b, bytes/d/allreduce.GiB)
			}
		}
		return b, nil
	}
	if g.H2DGiBs, err = best(float64(n), func() error { return h2d(s1) }); err != nil {
		return g, fmt.Errorf("timing host-to-device copies: %w", err)
	}
	if g.D2HGiBs, err = best(float64(n), func() error { return d2h(s1) }); err != nil {
		return g, fmt.Errorf("timing device-to-host copies: %w", err)
	}
	if g.DuplexGiBs, err = best(float64(2*n), func() error {
		if err := h2d(s1); err != nil {
			return err
		}
		return d2h(s2)
	}); err != nil {
		return g, fmt.Errorf("timing copies both ways at once: %w", err)
	}
	if o.ContendFor > 0 {
		duplex := func() error {
			if err := h2d(s1); err != nil {
				return err
			}
			if err := d2h(s2); err != nil {
				return err
			}
			for _, s := range []cuda.Stream{s1, s2} {
				if err := api.StreamSynchronize(s); err != nil {
					return err
				}
			}
			return nil
		}
		c, err := contend(ctx, duplex, float64(2*n), o)
		if err != nil {
			return g, fmt.Errorf("timing copies both ways during CPU reductions: %w", err)
		}
		g.ContendedThreads, g.ContendedBytes = o.ContendThreads, o.ContendBytes
		g.ContendedCopyGiBs, g.ContendedReduceGiBs = c.copyGiBs, c.reduceGiBs
		g.HostMemUnderDMAGiBs = c.copyGiBs + c.reduceGiBs*(contendInputs+1)/contendInputs
	}
	trips := make([]float64, 0, o.RoundTrips)
	for i := range o.RoundTrips + 10 {
		if i%50 == 0 {
			if err := ctx.Err(); err != nil {
				return g, err
			}
		}
		start := time.Now()
		if err := api.MemcpyDtoHAsync(h2, d2, small, s1); err != nil {
			return g, err
		}
		if err := api.MemcpyHtoDAsync(d1, h2, small, s1); err != nil {
			return g, err
		}
		if err := api.StreamSynchronize(s1); err != nil {
			return g, err
		}
		if i >= 10 {
			trips = append(trips, float64(time.Since(start).Nanoseconds())/1e3)
		}
	}
	sort.Float64s(trips)
	g.RoundTripUS = trips[len(trips)/2]
	return g, nil
}

type contention struct{ copyGiBs, reduceGiBs float64 }

// contend runs o.ContendThreads goroutines that reduce float32 sums of
// contendInputs pageable buffers of o.ContendBytes, each its own part in
// pieces of at most 1 MiB round and round, and meanwhile, once every
// goroutine finished a piece, calls round (roundBytes of copies, issued
// and waited for) back to back for o.ContendFor. It returns the copies'
// rate and the reductions' rate over the copies' window, in GiB/s of
// copies and of input read. It blocks on the calling goroutine (the one
// holding the CUDA context) and stops early when ctx is done.
func contend(ctx context.Context, round func() error, roundBytes float64, o GPUOptions) (contention, error) {
	srcs := make([][]byte, contendInputs)
	for i := range srcs {
		srcs[i] = make([]byte, o.ContendBytes)
	}
	dst := make([]byte, o.ContendBytes)
	threads := o.ContendThreads
	var (
		read    atomic.Int64 // input bytes reduced so far
		stop    atomic.Bool
		started sync.WaitGroup
		done    sync.WaitGroup
		errs    = make([]error, threads)
	)
	const piece = 1 << 20
	started.Add(threads)
	done.Add(threads)
	for t := range threads {
		lo, hi := (o.ContendBytes/64*t/threads)*64, (o.ContendBytes/64*(t+1)/threads)*64
		go func() {
			defer done.Done()
			first := true
			defer func() {
				if first {
					started.Done()
				}
			}()
			for j := lo; j < hi; j += 4096 {
				for _, s := range srcs {
					s[j] = 1 // touch every page of this part
				}
				dst[j] = 1
			}
			part := make([][]byte, len(srcs))
			for off := lo; hi > lo && !stop.Load() && ctx.Err() == nil; {
				end := min(off+piece, hi)
				for i, s := range srcs {
					part[i] = s[off:end]
				}
				if err := comm.ReduceHost(dst[off:end], part, comm.Float32, comm.Sum, 1); err != nil {
					errs[t] = err
					return
				}
				read.Add(int64(len(srcs) * (end - off)))
				if first {
					first = false
					started.Done()
				}
				if off = end; off == hi {
					off = lo
				}
			}
		}()
	}
	defer func() {
		stop.Store(true)
		done.Wait()
	}()
	started.Wait() // errs is read once every goroutine is done
	if err := ctx.Err(); err != nil {
		return contention{}, err
	}
	start := time.Now()
	r0 := read.Load()
	rounds := 0
	for rounds == 0 || time.Since(start) < o.ContendFor {
		if err := ctx.Err(); err != nil {
			return contention{}, err
		}
		if err := round(); err != nil {
			return contention{}, err
		}
		rounds++
	}
	d := time.Since(start).Seconds()
	r1 := read.Load()
	stop.Store(true)
	done.Wait()
	if err := errors.Join(errs...); err != nil {
		return contention{}, err
	}
	return contention{copyGiBs: float64(rounds) * roundBytes / d / allreduce.GiB,
		reduceGiBs: float64(r1-r0) / d / allreduce.GiB}, nil
}

// DeviceUUID names a device as CUDA_VISIBLE_DEVICES and nvidia-smi do:
// "MIG-..." for a MIG instance, else "GPU-...".
func DeviceUUID(api cuda.Interface, dev cuda.Device) (string, error) {
	u, err := api.DeviceGetUUID(dev)
	if err != nil {
		return "", err
	}
	parent, err := api.DeviceGetUUIDv1(dev)
	if err != nil || parent == u {
		return u.String("GPU"), nil
	}
	return u.String("MIG"), nil
}

// Machine turns the figures into the cost model's machine, for the GPUs
// with these UUIDs (the slowest of them binds; nil: every measured GPU).
// HostMemGiBs is the GPU's HostMemUnderDMAGiBs when those are one GPU: it
// was measured with one GPU's copies, and the copies of several GPUs may
// get more out of host memory, so for several it keeps base's value. What
// was not measured keeps base's value.
func (l Limits) Machine(base allreduce.Machine, uuids []string) allreduce.Machine {
	m := base
	if l.Host.ReduceThreadGiBs > 0 {
		m.ReduceThreadGiBs, m.ReduceHostGiBs = l.Host.ReduceThreadGiBs, l.Host.ReduceHostGiBs
	}
	var link, duplex, trip float64
	var selected []GPU
	for _, g := range l.GPUs {
		if uuids != nil && !slices.Contains(uuids, g.UUID) {
			continue
		}
		selected = append(selected, g)
		w := min(g.H2DGiBs, g.D2HGiBs)
		if link == 0 || w < link {
			link = w
		}
		if duplex == 0 || g.DuplexGiBs < duplex {
			duplex = g.DuplexGiBs
		}
		trip = max(trip, g.RoundTripUS)
	}
	if link > 0 {
		m.LinkGiBs, m.DuplexGiBs = link, duplex
		m.RoundTrip = time.Duration(trip * float64(time.Microsecond))
	}
	if len(selected) == 1 && selected[0].HostMemUnderDMAGiBs > 0 {
		m.HostMemGiBs = selected[0].HostMemUnderDMAGiBs
	}
	// A floor takes the best figure seen: the CPU reduction measured with
	// copies running (ContendedReduceGiBs) cannot really be faster than
	// alone, so when it is, the alone figure was disturbed (seen on an
	// H200 host: 41.2 GiB/s alone, 58.7 beside the copies, 73-76 in the two
	// runs before) and would raise every floor the reduction binds.
	for _, g := range selected {
		if m.ReduceHostGiBs > 0 {
			m.ReduceHostGiBs = max(m.ReduceHostGiBs, g.ContendedReduceGiBs)
		}
	}
	return m
}

// NodeMachine is Machine for the GPUs a job runs on, for its algorithm
// choice: the cached GPUs among chosen (nil: any GPU of the node) that the
// node has (node: the UUIDs its driver lists), and false when there is no
// such GPU — figures of a GPU not here (another host's cache, a fake
// driver's, a simulated node) or of the host alone describe no machine the
// job runs on.
func (l Limits) NodeMachine(base allreduce.Machine, node, chosen []string) (allreduce.Machine, bool) {
	want := node
	if chosen != nil {
		want = nil
		for _, u := range chosen {
			if slices.Contains(node, u) {
				want = append(want, u)
			}
		}
	}
	var uuids []string
	for _, u := range want {
		if g, ok := l.GPU(u); ok && g.H2DGiBs > 0 && !slices.Contains(uuids, u) {
			uuids = append(uuids, u)
		}
	}
	if len(uuids) == 0 {
		return base, false
	}
	return l.Machine(base, uuids), true
}

// GPU returns the cached figures of the device with this UUID.
func (l Limits) GPU(uuid string) (GPU, bool) {
	for _, g := range l.GPUs {
		if g.UUID == uuid {
			return g, true
		}
	}
	return GPU{}, false
}

// Put replaces or adds g.
func (l *Limits) Put(g GPU) {
	for i := range l.GPUs {
		if l.GPUs[i].UUID == g.UUID {
			l.GPUs[i] = g
			return
		}
	}
	l.GPUs = append(l.GPUs, g)
	sort.Slice(l.GPUs, func(i, j int) bool { return l.GPUs[i].Ordinal < l.GPUs[j].Ordinal })
}

// cacheFile is the cache's JSON: one entry per host name.
type cacheFile struct {
	Version int               `json:"version"`
	Hosts   map[string]Limits `json:"hosts"`
}

// DefaultCachePath is $XDG_CACHE_HOME/migctl/limits.json (the user's cache
// directory when XDG_CACHE_HOME is unset).
func DefaultCachePath() (string, error) {
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("finding a cache directory (set XDG_CACHE_HOME): %w", err)
	}
	return filepath.Join(dir, "migctl", "limits.json"), nil
}

// Load returns host's cached figures (zero Limits if none or no file).
func Load(path, host string) (Limits, error) {
	c, err := readCache(path)
	if err != nil {
		return Limits{}, err
	}
	return c.Hosts[host], nil
}

// Save stores l as host's figures, keeping other hosts' (atomically: a
// temporary file renamed over the cache).
func Save(path, host string, l Limits) error {
	c, err := readCache(path)
	if err != nil {
		c = cacheFile{} // an unreadable cache is replaced
	}
	if c.Hosts == nil {
		c.Hosts = map[string]Limits{}
	}
	c.Version = 1
	c.Hosts[host] = l
	buf, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("creating the cache directory: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".limits-*.json")
	if err != nil {
		return fmt.Errorf("writing the limits cache: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(buf, '\n')); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("writing the limits cache: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing the limits cache: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("writing the limits cache: %w", err)
	}
	return nil
}

func readCache(path string) (cacheFile, error) {
	var c cacheFile
	buf, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return c, nil
	}
	if err != nil {
		return c, fmt.Errorf("reading the limits cache: %w", err)
	}
	if err := json.Unmarshal(buf, &c); err != nil {
		return c, fmt.Errorf("limits cache %s: %v (delete it to measure again): %w", path, err, ErrInvalid)
	}
	return c, nil
}
