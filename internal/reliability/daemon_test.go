package reliability

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/migctl/migctl/context/fakeshim"
	"github.com/migctl/migctl/context/swapproto"
	"github.com/migctl/migctl/internal/testutil"
)

const (
	gib      = int64(1) << 30
	capacity = 80 * gib // what the daemon under test declares per device
)

// daemonProc is a `migctl daemon` process with declared memory.
type daemonProc struct {
	s         *suite
	cmd       *exec.Cmd
	swap, ctl string
	log       *testutil.LockedBuffer
}

// startDaemon starts the real daemon binary in dir; it is stopped at the end
// of the test.
func (s *suite) startDaemon(t *testing.T, dir string) (*daemonProc, error) {
	d := &daemonProc{s: s, swap: filepath.Join(dir, "run", "swap.sock"), ctl: filepath.Join(dir, "run", "ctl.sock"), log: &testutil.LockedBuffer{}}
	d.cmd = exec.Command(s.bin, "daemon", "--gpu-memory", strconv.FormatInt(capacity>>30, 10)+"GiB",
		"--swap-socket", d.swap, "--socket", d.ctl, "--rebalance-every", "0")
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	if err := d.cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan struct{})
	go func() { _ = d.cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = d.cmd.Process.Kill()
			<-exited
		}
	})
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		select {
		case <-exited:
			return nil, fmt.Errorf("the daemon exited: %s", d.log.String())
		default:
		}
		if _, err1 := os.Stat(d.swap); err1 == nil {
			if _, err2 := os.Stat(d.ctl); err2 == nil {
				return d, nil
			}
		}
	}
	return nil, fmt.Errorf("the daemon did not create its sockets: %s", d.log.String())
}

// alive reports an error when the daemon process has gone.
func (d *daemonProc) alive() error {
	if err := d.cmd.Process.Signal(syscall.Signal(0)); err != nil {
		return fmt.Errorf("the daemon died: %v\n%s", err, d.log.String())
	}
	return nil
}

// status runs `migctl swap status -o json` and checks that every byte count
// in it is within [0, capacity]; it returns the number of processes.
func (d *daemonProc) status() (int, error) {
	r := d.s.run(10*time.Second, nil, nil, "swap", "status", "--socket", d.ctl, "-o", "json")
	if r.code != 0 || r.timedOut {
		return 0, fmt.Errorf("swap status: %s", r)
	}
	var v any
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
		return 0, fmt.Errorf("swap status output: %v: %s", err, r.stdout)
	}
	if err := boundedCounts(v, ""); err != nil {
		return 0, fmt.Errorf("swap status: %w", err)
	}
	n := 0
	if m, ok := v.(map[string]any); ok {
		if l, ok := m["processes"].([]any); ok {
			n = len(l)
		}
	}
	return n, nil
}

// boundedCounts walks JSON and checks the byte counts.
func boundedCounts(v any, key string) error {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if err := boundedCounts(e, k); err != nil {
				return err
			}
		}
	case []any:
		for _, e := range x {
			if err := boundedCounts(e, key); err != nil {
				return err
			}
		}
	case float64:
		switch strings.ToLower(key) {
		case "bytes", "gpubytes", "free", "done", "total":
			if x < 0 || x > float64(capacity) {
				return fmt.Errorf("%s = %.0f is outside [0, %d]", key, x, capacity)
			}
		}
	}
	return nil
}

// settle waits until the registry is empty (a dropped shim is forgotten).
func (d *daemonProc) settle() error {
	var last error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		n, err := d.status()
		if err == nil && n == 0 {
			return nil
		}
		last = err
		if err == nil {
			last = fmt.Errorf("%d processes still registered", n)
		}
	}
	return last
}

// rawShim is a hostile shim: it writes whatever it is told.
type rawShim struct {
	c net.Conn
	r *swapproto.Reader
}

func dialRaw(socket string) (*rawShim, error) {
	c, err := net.DialTimeout("unix", socket, 2*time.Second)
	if err != nil {
		return nil, err
	}
	return &rawShim{c: c, r: swapproto.NewReader(c)}, nil
}

func (r *rawShim) line(b []byte) error {
	_ = r.c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_, err := r.c.Write(b)
	return err
}

func (r *rawShim) send(m swapproto.Message) error {
	b, err := swapproto.Encode(m)
	if err != nil {
		return err
	}
	return r.line(b)
}

func (r *rawShim) read(timeout time.Duration) (swapproto.Message, error) {
	_ = r.c.SetReadDeadline(time.Now().Add(timeout))
	return r.r.Read()
}

// closedWithin reads until the daemon closes the connection; it returns the
// error messages read on the way.
func (r *rawShim) closedWithin(timeout time.Duration) ([]string, error) {
	var reasons []string
	deadline := time.Now().Add(timeout)
	for {
		_ = r.c.SetReadDeadline(deadline)
		m, err := r.r.Read()
		switch {
		case errors.Is(err, io.EOF), errors.Is(err, syscall.ECONNRESET):
			return reasons, nil
		case err != nil:
			return reasons, fmt.Errorf("connection not closed: %v (answers: %v)", err, reasons)
		}
		reasons = append(reasons, m.Type+": "+m.Reason)
	}
}

// hello is a valid hello for the test process (pid 0: the daemon takes the
// peer's pid).
func hello(f func(*swapproto.Message)) swapproto.Message {
	m := swapproto.Message{Type: swapproto.TypeHello, Version: swapproto.Version, Job: "hostile", Device: "0", Bytes: gib}
	if f != nil {
		f(&m)
	}
	return m
}

// refusedHello: the hello is answered with an error and the connection closed.
func refusedHello(d *daemonProc, m swapproto.Message, want string) (time.Duration, error) {
	start := time.Now()
	sh, err := dialRaw(d.swap)
	if err != nil {
		return 0, err
	}
	defer sh.c.Close()
	if err := sh.send(m); err != nil {
		return 0, err
	}
	reasons, err := sh.closedWithin(5 * time.Second)
	took := time.Since(start)
	if err != nil {
		return took, err
	}
	if len(reasons) == 0 || !strings.HasPrefix(reasons[0], "error: ") || !strings.Contains(reasons[0], want) {
		return took, fmt.Errorf("answers %v, want an error saying %q", reasons, want)
	}
	if _, err := d.status(); err != nil {
		return took, err
	}
	return took, d.alive()
}

// droppedAfter: after a valid hello, msg gets an error and the connection is
// closed; the registry shows nothing out of bounds and empties.
func droppedAfter(d *daemonProc, msg []byte, want string) (time.Duration, error) {
	if err := d.settle(); err != nil {
		return 0, fmt.Errorf("before: %w", err)
	}
	sh, err := dialRaw(d.swap)
	if err != nil {
		return 0, err
	}
	defer sh.c.Close()
	if err := sh.send(hello(nil)); err != nil {
		return 0, err
	}
	if m, err := sh.read(5 * time.Second); err != nil || m.Type != swapproto.TypeWelcome {
		return 0, fmt.Errorf("no welcome for a valid hello: %v %+v", err, m)
	}
	start := time.Now()
	if err := sh.line(msg); err != nil {
		return 0, err
	}
	reasons, err := sh.closedWithin(5 * time.Second)
	took := time.Since(start)
	if err != nil {
		return took, err
	}
	if len(reasons) == 0 || !strings.Contains(reasons[len(reasons)-1], want) {
		return took, fmt.Errorf("answers %v, want one saying %q", reasons, want)
	}
	if err := d.settle(); err != nil {
		return took, err
	}
	if !strings.Contains(d.log.String(), "protocol violation") && !strings.Contains(d.log.String(), "protocol errors") {
		return took, errors.New("the daemon did not log the violation")
	}
	return took, d.alive()
}

func encode(m swapproto.Message) []byte {
	b, err := swapproto.Encode(m)
	if err != nil {
		panic(err)
	}
	return b
}

func (s *suite) daemonRows(t *testing.T) {
	// One daemon for the hostile-shim rows, stopped at the end of the suite.
	d, dErr := s.startDaemon(t, tempDir(t, 0o700))

	need := func(t *testing.T, tr *trials) bool {
		if dErr != nil {
			tr.fail("starting the daemon", dErr)
			return false
		}
		return true
	}
	dropped := "error naming the field, disconnected, logged; `swap status` never shows it"

	s.row(t, "daemon", "hostile shim: negative byte counts", dropped, func(t *testing.T, tr *trials) {
		if !need(t, tr) {
			return
		}
		tr.try("hello bytes -900 TiB", func() (time.Duration, error) {
			return refusedHello(d, hello(func(m *swapproto.Message) { m.Bytes = -900 << 40 }), "bytes -989560464998400 is negative")
		})
		for _, c := range []struct {
			name string
			msg  swapproto.Message
			want string
		}{
			{"usage -900 TiB", swapproto.Message{Type: swapproto.TypeUsage, Bytes: -900 << 40}, "is negative"},
			{"usage -1", swapproto.Message{Type: swapproto.TypeUsage, Bytes: -1}, "is negative"},
			{"need -1 GiB", swapproto.Message{Type: swapproto.TypeNeed, ID: "1", Bytes: -gib}, "is negative"},
			{"progress done -1", swapproto.Message{Type: swapproto.TypeProgress, ID: "1", Done: -1, Total: 1}, "is negative"},
			{"result bytes -1", swapproto.Message{Type: swapproto.TypeResult, ID: "1", Bytes: -1}, "is negative"},
			{"result seconds -1", swapproto.Message{Type: swapproto.TypeResult, ID: "1", Seconds: -1}, "out of range"},
		} {
			tr.try(c.name, func() (time.Duration, error) { return droppedAfter(d, encode(c.msg), c.want) })
		}
	})

	s.row(t, "daemon", "hostile shim: absurd byte counts (over the device, 2^62)", dropped+"; a need over the device (but under 16 TiB) is denied, the shim kept", func(t *testing.T, tr *trials) {
		if !need(t, tr) {
			return
		}
		tr.try("hello bytes 2^50", func() (time.Duration, error) {
			return refusedHello(d, hello(func(m *swapproto.Message) { m.Bytes = 1 << 50 }), "over the")
		})
		tr.try("hello bytes 81 GiB on an 80-GiB device", func() (time.Duration, error) {
			return refusedHello(d, hello(func(m *swapproto.Message) { m.Bytes = capacity + gib }), "exceed device")
		})
		for _, c := range []struct {
			name string
			msg  swapproto.Message
			want string
		}{
			{"usage 2^62", swapproto.Message{Type: swapproto.TypeUsage, Bytes: 1 << 62}, "over the"},
			{"usage 81 GiB", swapproto.Message{Type: swapproto.TypeUsage, Bytes: capacity + gib}, "exceeds device"},
			{"progress total 2^62", swapproto.Message{Type: swapproto.TypeProgress, ID: "1", Total: 1 << 62}, "over the"},
			{"result bytes 81 GiB", swapproto.Message{Type: swapproto.TypeResult, ID: "1", Bytes: capacity + gib}, "exceeds device"},
		} {
			tr.try(c.name, func() (time.Duration, error) { return droppedAfter(d, encode(c.msg), c.want) })
		}
		tr.try("need 2^50", func() (time.Duration, error) {
			return droppedAfter(d, encode(swapproto.Message{Type: swapproto.TypeNeed, ID: "1", Bytes: 1 << 50}), "over the")
		})
		tr.try("need 81 GiB (denied, kept)", func() (time.Duration, error) {
			if err := d.settle(); err != nil {
				return 0, err
			}
			sh, err := fakeshim.Dial(ctx(t, 5*time.Second), d.swap, fakeshim.Hello{Device: "0"}, fakeshim.Behavior{})
			if err != nil {
				return 0, err
			}
			defer sh.Close()
			start := time.Now()
			ok, reason, err := sh.Need(ctx(t, 5*time.Second), capacity+gib)
			took := time.Since(start)
			switch {
			case err != nil:
				return took, err
			case ok || !strings.Contains(reason, "exceeds device"):
				return took, fmt.Errorf("granted %v, reason %q", ok, reason)
			}
			if n, err := d.status(); err != nil || n != 1 {
				return took, fmt.Errorf("the shim must stay registered: %d, %v", n, err)
			}
			return took, nil
		})
	})

	s.row(t, "daemon", "hostile shim: hello claiming another pid", "refused with an error naming the real pid, logged", func(t *testing.T, tr *trials) {
		if !need(t, tr) {
			return
		}
		for _, c := range []struct {
			name string
			pid  int
		}{{"pid 1", 1}, {"the daemon's pid", d.cmd.Process.Pid}, {"the parent's pid", os.Getppid()}, {"pid 4194305", 4194305}} {
			tr.try(c.name, func() (time.Duration, error) {
				want := fmt.Sprintf("hello claims pid %d, but the connecting process is pid %d", c.pid, os.Getpid())
				if c.pid > swapproto.MaxPID {
					want = "out of range"
				}
				return refusedHello(d, hello(func(m *swapproto.Message) { m.PID = c.pid }), want)
			})
		}
		tr.try("own pid still welcome", func() (time.Duration, error) {
			if err := d.settle(); err != nil {
				return 0, err
			}
			start := time.Now()
			sh, err := fakeshim.Dial(ctx(t, 5*time.Second), d.swap, fakeshim.Hello{PID: os.Getpid(), Device: "0"}, fakeshim.Behavior{})
			if err != nil {
				return time.Since(start), err
			}
			sh.Close()
			return time.Since(start), nil
		})
	})

	s.row(t, "daemon", "hostile shim: garbage lines", "each answered with an error, connection kept; the 17th ends it (logged); a garbage first line is refused", func(t *testing.T, tr *trials) {
		if !need(t, tr) {
			return
		}
		tr.try("garbage instead of hello", func() (time.Duration, error) {
			start := time.Now()
			sh, err := dialRaw(d.swap)
			if err != nil {
				return 0, err
			}
			defer sh.c.Close()
			if err := sh.line([]byte("\x00\xffGET / HTTP/1.1\r\n")); err != nil {
				return 0, err
			}
			reasons, err := sh.closedWithin(5 * time.Second)
			if err == nil && (len(reasons) == 0 || !strings.Contains(reasons[0], "malformed")) {
				err = fmt.Errorf("answers %v", reasons)
			}
			return time.Since(start), err
		})
		if err := d.settle(); err != nil {
			tr.fail("settle", err)
			return
		}
		sh, err := dialRaw(d.swap)
		if err != nil {
			tr.fail("dial", err)
			return
		}
		defer sh.c.Close()
		if err := sh.send(hello(nil)); err != nil {
			tr.fail("hello", err)
			return
		}
		if m, err := sh.read(5 * time.Second); err != nil || m.Type != swapproto.TypeWelcome {
			tr.fail("hello", fmt.Errorf("no welcome: %v %+v", err, m))
			return
		}
		lines := []string{"not json", `{"type":3}`, `{"type":"telemetry"}`, `{"type":"welcome"}`, `{"type":"swap_out","id":1}`,
			`{"type":"result","id":999,"ok":true}`, "\x00\x01\x02", `{"type":"usage"`, "[1,2,3]", `"hello"`, "{}", "null",
			`{"type":"need","id":{"x":1},"bytes":5}`, `{"type":"usage","bytes":"lots"}`, `{"type":"usage","bytes":1e400}`, "\xff\xfe"}
		for _, l := range lines {
			tr.try(fmt.Sprintf("%q", l), func() (time.Duration, error) {
				start := time.Now()
				if err := sh.line([]byte(l + "\n")); err != nil {
					return 0, err
				}
				m, err := sh.read(5 * time.Second)
				took := time.Since(start)
				if err != nil || m.Type != swapproto.TypeError {
					return took, fmt.Errorf("want an error answer, got %+v, %v", m, err)
				}
				if n, err := d.status(); err != nil || n != 1 {
					return took, fmt.Errorf("the shim must stay registered: %d, %v", n, err)
				}
				return took, nil
			})
		}
		tr.try("17th bad line", func() (time.Duration, error) {
			start := time.Now()
			if err := sh.line([]byte("garbage\n")); err != nil {
				return 0, err
			}
			reasons, err := sh.closedWithin(5 * time.Second)
			took := time.Since(start)
			if err == nil && (len(reasons) == 0 || !strings.Contains(reasons[len(reasons)-1], "more than 16 protocol errors")) {
				err = fmt.Errorf("answers %v", reasons)
			}
			if err == nil {
				err = d.settle()
			}
			return took, err
		})
	})

	s.row(t, "daemon", "hostile shim: oversized lines (5 KiB to 64 MiB)", "answered \"longer than 4 KiB\", connection kept, daemon memory bounded (RSS < 200 MiB)", func(t *testing.T, tr *trials) {
		if !need(t, tr) {
			return
		}
		if err := d.settle(); err != nil {
			tr.fail("settle", err)
			return
		}
		sh, err := dialRaw(d.swap)
		if err != nil {
			tr.fail("dial", err)
			return
		}
		defer sh.c.Close()
		if err := sh.send(hello(nil)); err != nil {
			tr.fail("hello", err)
			return
		}
		if m, err := sh.read(5 * time.Second); err != nil || m.Type != swapproto.TypeWelcome {
			tr.fail("hello", fmt.Errorf("no welcome: %v %+v", err, m))
			return
		}
		for _, size := range []int{5 << 10, 1 << 20, 64 << 20} {
			tr.try(fmt.Sprintf("%d bytes", size), func() (time.Duration, error) {
				b := []byte(`{"type":"usage","job":"` + strings.Repeat("x", size) + "\"}\n")
				start := time.Now()
				if err := sh.line(b); err != nil {
					return 0, err
				}
				m, err := sh.read(10 * time.Second)
				took := time.Since(start)
				if err != nil || m.Type != swapproto.TypeError || !strings.Contains(m.Reason, "longer than 4 KiB") {
					return took, fmt.Errorf("want an error answer, got %+v, %v", m, err)
				}
				if n, err := d.status(); err != nil || n != 1 {
					return took, fmt.Errorf("the shim must stay registered: %d, %v", n, err)
				}
				if rss := vmRSS(d.cmd.Process.Pid); rss > 200<<20 {
					return took, fmt.Errorf("daemon RSS %d MiB", rss>>20)
				}
				return took, nil
			})
		}
	})

	s.row(t, "daemon", "shim disconnects mid-swap", "`swap out` ends with the swap failed (\"shim disconnected\"), the process forgotten", func(t *testing.T, tr *trials) {
		if !need(t, tr) {
			return
		}
		for i := range 3 {
			tr.try(fmt.Sprintf("trial %d", i+1), func() (time.Duration, error) {
				if err := d.settle(); err != nil {
					return 0, err
				}
				sh, err := fakeshim.Dial(ctx(t, 5*time.Second), d.swap, fakeshim.Hello{Job: "dies", Device: "0", Bytes: gib},
					fakeshim.Behavior{Chunks: 4, ChunkDelay: 20 * time.Millisecond, DisconnectMidSwap: true})
				if err != nil {
					return 0, err
				}
				defer sh.Close()
				r := s.run(20*time.Second, nil, nil, "swap", "out", "--job", "dies", "--socket", d.ctl, "-o", "json", "-q")
				switch {
				case r.timedOut || r.signal != 0:
					return r.took, fmt.Errorf("swap out: %s", r)
				case !strings.Contains(r.stdout+r.stderr, "disconnected"):
					return r.took, fmt.Errorf("swap out does not say the shim disconnected: %s %s", r, r.stdout)
				}
				return r.took, d.settle()
			})
		}
	})

	s.row(t, "daemon", "refused uid (nobody, socket permissions opened)", "gRPC PermissionDenied: \"permission denied by the daemon (uid 65534 is not allowed; run as …)\", logged", func(t *testing.T, tr *trials) {
		if os.Geteuid() != 0 {
			tr.skipped = "needs root to run a client as another uid"
			return
		}
		dir := tempDir(t, 0o755)
		bin := filepath.Join(dir, "migctl")
		if err := copyFile(s.bin, bin, 0o755); err != nil {
			tr.fail("copying the binary", err)
			return
		}
		d2, err := s.startDaemon(t, dir)
		if err != nil {
			tr.fail("starting the daemon", err)
			return
		}
		for _, p := range []string{filepath.Dir(d2.ctl), d2.ctl, d2.swap} {
			mode := os.FileMode(0o666)
			if p == filepath.Dir(d2.ctl) {
				mode = 0o755
			}
			if err := os.Chmod(p, mode); err != nil {
				tr.fail("opening permissions", err)
				return
			}
		}
		nobody := &syscall.Credential{Uid: 65534, Gid: 65534}
		for _, c := range []struct{ name, socket string }{
			{"swap status on the control socket", d2.ctl}, {"swap status again", d2.ctl}, {"a gRPC client on the shim socket", d2.swap},
		} {
			tr.try(c.name, func() (time.Duration, error) {
				r := runCmd(10*time.Second, nil, nobody, bin, "swap", "status", "--socket", c.socket)
				return r.took, rejected(r, "permission denied", "uid 65534")
			})
		}
		tr.try("a shim as nobody on the shim socket", func() (time.Duration, error) {
			helper := filepath.Join(dir, "reliability.test")
			if err := copyFile(os.Args[0], helper, 0o755); err != nil {
				return 0, err
			}
			r := runCmd(10*time.Second, []string{envHelperShim + "=" + d2.swap}, nobody, helper)
			if !strings.Contains(r.stdout, "error: permission denied by the daemon (uid 65534 is not allowed") {
				return r.took, fmt.Errorf("shim answer: %s %s", r, r.stdout)
			}
			return r.took, nil
		})
		if !strings.Contains(d2.log.String(), "peer refused") {
			tr.fail("daemon log", errors.New("the refusal is not logged"))
		}
	})
}

func copyFile(from, to string, mode os.FileMode) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, mode)
}

// vmRSS returns a process's resident memory in bytes (0 if unknown).
func vmRSS(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

// envHelperShim makes the test binary a shim that says hello on the socket it
// names and prints the answer (TestMain), to run as another uid.
const envHelperShim = "RELIABILITY_HELPER_SHIM"

func TestMain(m *testing.M) {
	if socket := os.Getenv(envHelperShim); socket != "" {
		sh, err := dialRaw(socket)
		if err == nil {
			err = sh.send(hello(nil))
		}
		if err == nil {
			var reasons []string
			reasons, err = sh.closedWithin(5 * time.Second)
			fmt.Println(strings.Join(reasons, "\n"))
		}
		if err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	testutil.Main(m) // removes the migctl that testutil.MigctlBin built
}

// ctx is a context bounded by d, cancelled at the end of the test.
func ctx(t *testing.T, d time.Duration) context.Context {
	c, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return c
}
