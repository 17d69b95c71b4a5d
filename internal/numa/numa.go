package numa

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Placement is where a process runs: CPUs it may run on (nil: any) and the
// NUMA node its memory is preferred on (-1: none, the kernel's default).
type Placement struct {
	Node int   `json:"node" yaml:"node"`
	CPUs []int `json:"cpus,omitempty" yaml:"cpus,omitempty"`
}

// None is no placement.
var None = Placement{Node: -1}

// IsNone says whether p places nothing.
func (p Placement) IsNone() bool { return p.Node < 0 && len(p.CPUs) == 0 }

func (p Placement) String() string {
	switch {
	case p.IsNone():
		return "anywhere"
	case len(p.CPUs) == 0:
		return fmt.Sprintf("memory on node %d", p.Node)
	case p.Node < 0:
		return "CPUs " + FormatList(p.CPUs)
	}
	return fmt.Sprintf("node %d, CPUs %s", p.Node, FormatList(p.CPUs))
}

// ParseList parses a kernel CPU or node list ("0-3,8,10-11"; "" is empty)
// into sorted, distinct numbers.
func ParseList(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	var out []int
	if s == "" {
		return out, nil
	}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return nil, fmt.Errorf("list %q: %q is not a number", s, lo)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, fmt.Errorf("list %q: bad range %q", s, part)
			}
		}
		if b-a > 1<<16 {
			return nil, fmt.Errorf("list %q: range %q too large", s, part)
		}
		for i := a; i <= b; i++ {
			out = append(out, i)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// FormatList writes numbers as a kernel list, runs as ranges ("0-3,8").
func FormatList(xs []int) string {
	xs = slices.Compact(slices.Sorted(slices.Values(xs)))
	var b strings.Builder
	for i := 0; i < len(xs); {
		j := i
		for j+1 < len(xs) && xs[j+1] == xs[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		if j > i {
			fmt.Fprintf(&b, "%d-%d", xs[i], xs[j])
		} else {
			fmt.Fprintf(&b, "%d", xs[i])
		}
		i = j + 1
	}
	return b.String()
}

// EnvSysfs points this package at another sysfs tree than /sys (tests; a
// host whose /sys is mounted elsewhere).
const EnvSysfs = "MIGCTL_SYSFS_ROOT"

// EnvPlace set to "off" keeps the trainer SDK from placing what it
// allocates (migctl run --numa off sets it for the workers).
const EnvPlace = "MIGCTL_NUMA"

// HostSysfs is the sysfs tree of this host: EnvSysfs's, else /sys.
func HostSysfs() Sysfs { return Sysfs(os.Getenv(EnvSysfs)) }

// NodeOf is the NUMA node to prefer for memory that the PCI device at
// busID (any form: BusID) reads and writes: its node, when the host has
// more than one and sysfs says which; else -1 (nothing to choose). EnvPlace
// "off" makes it -1 too.
func (s Sysfs) NodeOf(busID string) int {
	if os.Getenv(EnvPlace) == "off" || busID == "" {
		return -1
	}
	if nodes, err := s.Nodes(); err != nil || len(nodes) < 2 {
		return -1
	}
	p, err := s.Device(BusID(busID))
	if err != nil {
		return -1
	}
	return p.Node
}

// Sysfs is the root of a sysfs tree ("" is /sys; tests give a fake one).
type Sysfs string

func (s Sysfs) path(parts ...string) string {
	root := string(s)
	if root == "" {
		root = "/sys"
	}
	return filepath.Join(append([]string{root}, parts...)...)
}

func (s Sysfs) read(parts ...string) (string, error) {
	b, err := os.ReadFile(s.path(parts...))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// Nodes are the host's online NUMA nodes (one node, 0, where the kernel
// has no NUMA).
func (s Sysfs) Nodes() ([]int, error) {
	v, err := s.read("devices", "system", "node", "online")
	if errors.Is(err, os.ErrNotExist) {
		return []int{0}, nil
	}
	if err != nil {
		return nil, err
	}
	return ParseList(v)
}

// BusID turns a PCI address as NVML gives it ("00000000:17:00.0") into
// sysfs's form ("0000:17:00.0").
func BusID(nvmlBusID string) string {
	id := strings.ToLower(strings.TrimSpace(nvmlBusID))
	if dom, rest, ok := strings.Cut(id, ":"); ok && len(dom) > 4 {
		id = dom[len(dom)-4:] + ":" + rest
	}
	return id
}

// Device is where PCI device busID (sysfs form, BusID) sits: its NUMA node
// (-1 when the platform does not say) and the CPUs local to it (nil when
// sysfs does not list them).
func (s Sysfs) Device(busID string) (Placement, error) {
	if busID == "" {
		return None, errors.New("no PCI address")
	}
	v, err := s.read("bus", "pci", "devices", busID, "numa_node")
	if err != nil {
		return None, fmt.Errorf("NUMA node of PCI device %s: %w", busID, err)
	}
	node, err := strconv.Atoi(v)
	if err != nil {
		return None, fmt.Errorf("NUMA node of PCI device %s: %q", busID, v)
	}
	p := Placement{Node: max(node, -1)}
	if v, err := s.read("bus", "pci", "devices", busID, "local_cpulist"); err == nil {
		if p.CPUs, err = ParseList(v); err != nil {
			return None, fmt.Errorf("CPUs local to PCI device %s: %w", busID, err)
		}
	}
	return p, nil
}

// Start runs start (which starts a process, as exec.Cmd.Start does) on an
// OS thread bound to p's CPUs (those of them this process may use; none: as
// it is) with its memory preferred on p's node, so that the process
// inherits both, and then gives the thread back what it had. The thread is
// not let die instead: a child started with Pdeathsig gets its signal when
// the thread that forked it exits. A placement the kernel refuses (no NUMA
// support, CPUs outside this container's set) leaves that part as it is
// and is returned as placeErr, after start ran.
func Start(p Placement, start func() error) (placeErr, err error) {
	if p.IsNone() {
		return nil, start()
	}
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		saved, serr := save()
		if serr != nil {
			placeErr = serr
			err = start()
			runtime.UnlockOSThread()
			close(done)
			return
		}
		placeErr = place(p)
		err = start()
		if rerr := saved.restore(); rerr != nil {
			// This thread keeps the placement: park it for good rather
			// than let it run other goroutines there or exit (which would
			// signal the child).
			close(done)
			select {}
		}
		runtime.UnlockOSThread()
		close(done)
	}()
	<-done
	return placeErr, err
}

// threadState is a thread's CPUs and memory policy.
type threadState struct {
	cpus   unix.CPUSet
	policy int
	nodes  unix.CPUSet // a node mask, laid out as a CPU mask
}

func save() (threadState, error) {
	var st threadState
	if err := unix.SchedGetaffinity(0, &st.cpus); err != nil {
		return st, fmt.Errorf("reading this thread's CPUs: %w", err)
	}
	var mode int32
	_, _, errno := unix.Syscall6(unix.SYS_GET_MEMPOLICY, uintptr(unsafe.Pointer(&mode)),
		uintptr(unsafe.Pointer(&st.nodes)), uintptr(len(st.nodes)*64), 0, 0, 0)
	if errno != 0 {
		return st, fmt.Errorf("reading this thread's memory policy: %w", errno)
	}
	st.policy = int(mode)
	return st, nil
}

func (st threadState) restore() error {
	if err := unix.SchedSetaffinity(0, &st.cpus); err != nil {
		return err
	}
	nodes := &st.nodes
	if st.policy == unix.MPOL_DEFAULT {
		nodes = nil
	}
	return unix.SetMemPolicy(st.policy, nodes)
}

func place(p Placement) error {
	var errs []error
	if len(p.CPUs) > 0 {
		var now, set unix.CPUSet
		if err := unix.SchedGetaffinity(0, &now); err != nil {
			errs = append(errs, fmt.Errorf("reading this thread's CPUs: %w", err))
		} else {
			set.Zero()
			for _, c := range p.CPUs {
				if c < len(now)*64 && now.IsSet(c) {
					set.Set(c)
				}
			}
			switch {
			case set.Count() == 0:
				errs = append(errs, fmt.Errorf("none of CPUs %s is ours to use", FormatList(p.CPUs)))
			default:
				if err := unix.SchedSetaffinity(0, &set); err != nil {
					errs = append(errs, fmt.Errorf("binding to CPUs %s: %w", FormatList(p.CPUs), err))
				}
			}
		}
	}
	if p.Node >= 0 {
		var mask unix.CPUSet // a node mask, laid out as a CPU mask
		mask.Zero()
		mask.Set(p.Node)
		if err := unix.SetMemPolicy(unix.MPOL_PREFERRED, &mask); err != nil {
			errs = append(errs, fmt.Errorf("preferring memory on node %d: %w", p.Node, err))
		}
	}
	return errors.Join(errs...)
}
