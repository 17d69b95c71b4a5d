package shimtest

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// binDir is where libmigswap.so, fakecuda/libcuda.so.1 and the test
// programs are; set by TestMain.
var (
	binDir   string
	buildErr error
)

func TestMain(m *testing.M) {
	code := func() int {
		if d := os.Getenv("MIGSWAP_BIN"); d != "" {
			binDir = d
			return m.Run()
		}
		if _, err := exec.LookPath("gcc"); err != nil {
			buildErr = fmt.Errorf("gcc not found: %w", err)
			return m.Run()
		}
		dir, err := os.MkdirTemp("", "migswap-bin-")
		if err != nil {
			buildErr = err
			return m.Run()
		}
		defer os.RemoveAll(dir)
		_, file, _, _ := runtime.Caller(0)
		shimDir := filepath.Join(filepath.Dir(file), "..")
		out, err := exec.Command("make", "-s", "-C", shimDir, "BIN="+dir).CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "building the shim: %v\n%s", err, out)
			return 1
		}
		binDir = dir
		return m.Run()
	}()
	os.Exit(code)
}

func needBin(t testing.TB) {
	t.Helper()
	if buildErr != nil {
		t.Skipf("cannot build the shim: %v", buildErr)
	}
	for _, f := range []string{"libmigswap.so", "fakecuda/libcuda.so.1", "migswap_testprog", "migswap_testprog_linked", "nexttest/migswap_nexttest"} {
		_, err := os.Stat(filepath.Join(binDir, f))
		require.NoError(t, err, "MIGSWAP_BIN=%s lacks %s", binDir, f)
	}
}

// shortDir returns a short temporary directory (Unix socket paths are limited
// to 108 bytes).
func shortDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("", "ms")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// ---------------------------------------------------------------- fake device

// fakeStats mirrors struct fakecuda_stats in shim/fakecuda.h.
type fakeStats struct {
	Magic, Capacity, InUse, Peak, Launches, VMMCreates, PlainAllocs, VMMInUse uint64
}

func readFakeStats(t testing.TB, path string) fakeStats {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(b), 64)
	var w [8]uint64
	for i := range w {
		w[i] = binary.LittleEndian.Uint64(b[i*8:])
	}
	return fakeStats{w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]}
}

// --------------------------------------------------------------- test program

type proc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
	mu    sync.Mutex
	all   []string
	done  chan struct{}
	err   error
}

type env struct {
	dir    string
	socket string // "" for no daemon
	stats  string
	extra  []string
	shim   bool
}

func newEnv(t testing.TB) *env {
	d := shortDir(t)
	return &env{dir: d, stats: filepath.Join(d, "stats"), shim: true}
}

// newEnvWithDaemon is newEnv whose programs connect to a fresh fake daemon.
func newEnvWithDaemon(t testing.TB) (*env, *fakeDaemon) {
	e := newEnv(t)
	d := startDaemon(t, e.dir)
	e.socket = d.path
	return e, d
}

func (e *env) environ() []string {
	v := os.Environ()
	out := v[:0:0]
	for _, kv := range v {
		if strings.HasPrefix(kv, "LD_PRELOAD=") || strings.HasPrefix(kv, "MIGSWAP_") || strings.HasPrefix(kv, "FAKECUDA_") {
			continue
		}
		out = append(out, kv)
	}
	out = append(out,
		"LD_LIBRARY_PATH="+filepath.Join(binDir, "fakecuda"),
		"FAKECUDA_STATS="+e.stats,
		"MIGSWAP_CHECKSUM=1",
	)
	if e.shim {
		out = append(out, "LD_PRELOAD="+filepath.Join(binDir, "libmigswap.so"))
	}
	if e.socket != "" {
		out = append(out, "MIGSWAP_SOCKET="+e.socket)
	} else {
		out = append(out, "MIGSWAP_SOCKET="+filepath.Join(e.dir, "absent.sock"))
	}
	return append(out, e.extra...)
}

func (e *env) start(t testing.TB, args ...string) *proc {
	t.Helper()
	prog := "migswap_testprog"
	if len(args) > 0 && args[0] == "direct" {
		prog = "migswap_testprog_linked"
	}
	cmd := exec.Command(filepath.Join(binDir, prog), args...)
	cmd.Env = e.environ()
	cmd.Stderr = &prefixWriter{t: t}
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &proc{cmd: cmd, stdin: stdin, lines: make(chan string, 1024), done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.mu.Lock()
			p.all = append(p.all, sc.Text())
			p.mu.Unlock()
			p.lines <- sc.Text()
		}
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

type prefixWriter struct{ t testing.TB }

func (w *prefixWriter) Write(b []byte) (int, error) {
	w.t.Logf("stderr: %s", strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// waitLine returns the first line starting with prefix.
func (p *proc) waitLine(t testing.TB, prefix string, timeout time.Duration) map[string]string {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case l := <-p.lines:
			if strings.HasPrefix(l, prefix+" ") || l == prefix {
				return parseKV(l)
			}
		case <-deadline:
			p.mu.Lock()
			defer p.mu.Unlock()
			require.FailNowf(t, "timeout", "no %q line within %v; output so far:\n%s", prefix, timeout, strings.Join(p.all, "\n"))
		}
	}
}

// finish tells the program to stop and waits for it; returns all its lines.
func (p *proc) finish(t testing.TB, timeout time.Duration) []string {
	t.Helper()
	_, _ = io.WriteString(p.stdin, "stop\n")
	_ = p.stdin.Close()
	select {
	case <-p.done:
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		require.FailNow(t, "program did not exit")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.all...)
}

// line returns the parsed line with prefix from lines.
func line(t testing.TB, lines []string, prefix string) map[string]string {
	t.Helper()
	for _, l := range lines {
		if strings.HasPrefix(l, prefix+" ") {
			return parseKV(l)
		}
	}
	require.FailNowf(t, "missing line", "no %q line in:\n%s", prefix, strings.Join(lines, "\n"))
	return nil
}

func parseKV(l string) map[string]string {
	m := map[string]string{}
	i := strings.IndexByte(l, ' ')
	if i < 0 {
		return m
	}
	s := l[i+1:]
	for len(s) > 0 {
		s = strings.TrimLeft(s, " ")
		eq := strings.IndexByte(s, '=')
		if eq < 0 {
			break
		}
		k := s[:eq]
		s = s[eq+1:]
		var v string
		if strings.HasPrefix(s, "\"") {
			end := strings.IndexByte(s[1:], '"')
			if end < 0 {
				v, s = s[1:], ""
			} else {
				v, s = s[1:1+end], s[2+end:]
			}
		} else {
			end := strings.IndexByte(s, ' ')
			if end < 0 {
				v, s = s, ""
			} else {
				v, s = s[:end], s[end:]
			}
		}
		m[k] = v
	}
	return m
}

func num(t testing.TB, m map[string]string, k string) uint64 {
	t.Helper()
	v, ok := m[k]
	require.True(t, ok, "no key %q in %v", k, m)
	n, err := strconv.ParseUint(v, 0, 64)
	require.NoError(t, err, "key %q", k)
	return n
}

// ---------------------------------------------------------------- fake daemon

type msg map[string]any

func (m msg) str(k string) string { s, _ := m[k].(string); return s }
func (m msg) num(k string) float64 {
	f, _ := m[k].(float64)
	return f
}

// fakeDaemon is a minimal daemon speaking shim/PROTOCOL.md.
type fakeDaemon struct {
	t      testing.TB
	ln     net.Listener
	path   string
	conns  chan *shimConn
	mu     sync.Mutex
	onNeed func(c *shimConn, bytes uint64) (granted bool, reason string)
}

// setNeed installs the answer to `need` messages (default: denied).
func (d *fakeDaemon) setNeed(f func(c *shimConn, bytes uint64) (bool, string)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.onNeed = f
}

type shimConn struct {
	d        *fakeDaemon
	c        net.Conn
	hello    msg
	wmu      sync.Mutex
	mu       sync.Mutex
	nextID   int
	waiters  map[int]chan msg
	progress []msg
	usage    uint64
	errors   []msg
	closed   chan struct{}
}

func startDaemon(t testing.TB, dir string) *fakeDaemon {
	t.Helper()
	path := filepath.Join(dir, "d.sock")
	ln, err := net.Listen("unix", path)
	require.NoError(t, err)
	require.NoError(t, os.Chmod(path, 0o600))
	d := &fakeDaemon{t: t, ln: ln, path: path, conns: make(chan *shimConn, 16)}
	go d.accept()
	t.Cleanup(func() { ln.Close() })
	return d
}

func (d *fakeDaemon) accept() {
	for {
		c, err := d.ln.Accept()
		if err != nil {
			return
		}
		go d.serve(c)
	}
}

func (d *fakeDaemon) serve(c net.Conn) {
	sc := bufio.NewScanner(c)
	sc.Buffer(make([]byte, 8192), 8192)
	if !sc.Scan() {
		c.Close()
		return
	}
	var hello msg
	if json.Unmarshal(sc.Bytes(), &hello) != nil || hello.str("type") != "hello" {
		c.Close()
		return
	}
	sconn := &shimConn{d: d, c: c, hello: hello, waiters: map[int]chan msg{}, closed: make(chan struct{}), nextID: 100}
	sconn.send(msg{"type": "welcome", "version": 1})
	d.conns <- sconn
	defer close(sconn.closed)
	for sc.Scan() {
		var m msg
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			d.t.Errorf("shim sent invalid JSON %q: %v", sc.Text(), err)
			continue
		}
		switch m.str("type") {
		case "result":
			sconn.mu.Lock()
			ch := sconn.waiters[int(m.num("id"))]
			sconn.mu.Unlock()
			if ch != nil {
				ch <- m
			}
		case "progress":
			sconn.mu.Lock()
			sconn.progress = append(sconn.progress, m)
			sconn.mu.Unlock()
		case "usage":
			sconn.mu.Lock()
			sconn.usage = uint64(m.num("bytes"))
			sconn.mu.Unlock()
		case "need":
			go func(m msg) {
				granted, reason := false, "no policy"
				d.mu.Lock()
				onNeed := d.onNeed
				d.mu.Unlock()
				if onNeed != nil {
					granted, reason = onNeed(sconn, uint64(m.num("bytes")))
				}
				if granted {
					sconn.send(msg{"type": "granted", "id": m["id"]})
				} else {
					sconn.send(msg{"type": "denied", "id": m["id"], "reason": reason})
				}
			}(m)
		case "error":
			sconn.mu.Lock()
			sconn.errors = append(sconn.errors, m)
			sconn.mu.Unlock()
		default:
			d.t.Errorf("unexpected message from shim: %s", sc.Text())
		}
	}
}

func (d *fakeDaemon) waitConn(t testing.TB) *shimConn {
	t.Helper()
	select {
	case c := <-d.conns:
		return c
	case <-time.After(20 * time.Second):
		require.FailNow(t, "no shim connected")
		return nil
	}
}

func (c *shimConn) send(m msg) {
	b, _ := json.Marshal(m)
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, _ = c.c.Write(append(b, '\n'))
}

func (c *shimConn) pid() int { return int(c.hello.num("pid")) }

// swap sends swap_out or swap_in and waits for its result. Test goroutine
// only (it fails t); callbacks on the fake daemon's goroutines use trySwap.
func (c *shimConn) swap(t testing.TB, typ string) msg {
	t.Helper()
	m, err := c.trySwap(typ)
	require.NoError(t, err)
	return m
}

// trySwap is swap returning an error instead of failing a test.
func (c *shimConn) trySwap(typ string) (msg, error) {
	c.mu.Lock()
	c.nextID++
	id := c.nextID
	ch := make(chan msg, 1)
	c.waiters[id] = ch
	c.mu.Unlock()
	c.send(msg{"type": typ, "id": id})
	select {
	case m := <-ch:
		if m.num("id") != float64(id) {
			return nil, fmt.Errorf("%s: result for id %v, want %d", typ, m["id"], id)
		}
		return m, nil
	case <-c.closed:
		return nil, fmt.Errorf("shim connection closed during %s", typ)
	case <-time.After(60 * time.Second):
		return nil, fmt.Errorf("no result for %s", typ)
	}
}

func (c *shimConn) progressCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.progress)
}
