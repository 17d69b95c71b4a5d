package ctxmgr_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	ctxmgr "github.com/migctl/migctl/context"
	"github.com/migctl/migctl/context/ctlpb"
	"github.com/migctl/migctl/context/fakeshim"
	"github.com/migctl/migctl/context/swapproto"
)

// Helper processes: the test binary re-executed as a shim or a CLI client in
// another process (another pid, another pid namespace, another uid).
const (
	helperEnv    = "CTXMGR_TEST_HELPER" // "shim" or "ctl"
	helperSocket = "CTXMGR_TEST_SOCKET"
	helperClaim  = "CTXMGR_TEST_CLAIM" // the pid the shim's hello claims; "self" for its own
)

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "shim":
		os.Exit(helperShim())
	case "ctl":
		os.Exit(helperCtl())
	}
	os.Exit(m.Run())
}

// helperShim says hello claiming $CTXMGR_TEST_CLAIM and prints the first
// answer's type and reason.
func helperShim() int {
	claim := os.Getpid()
	if v := os.Getenv(helperClaim); v != "self" {
		claim, _ = strconv.Atoi(v)
	}
	c, err := net.DialTimeout("unix", os.Getenv(helperSocket), 5*time.Second)
	if err != nil {
		fmt.Println("dial:", err)
		return 1
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if err := swapproto.NewWriter(c).Write(swapproto.Message{Type: swapproto.TypeHello, Version: swapproto.Version,
		PID: claim, Job: "helper", Device: "0", Bytes: 1024}); err != nil {
		fmt.Println("hello:", err)
		return 1
	}
	m, err := swapproto.NewReader(c).Read()
	if err != nil {
		fmt.Println("read:", err)
		return 1
	}
	fmt.Printf("pid=%d type=%s reason=%s\n", os.Getpid(), m.Type, m.Reason)
	if m.Type == swapproto.TypeWelcome {
		// Stay registered until the test closes stdin.
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	}
	return 0
}

// helperCtl calls the control API's Status and prints the gRPC code and message.
func helperCtl() int {
	conn, err := grpc.NewClient("unix://"+os.Getenv(helperSocket), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Println("client:", err)
		return 1
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = ctlpb.NewControlClient(conn).Status(ctx, &ctlpb.StatusRequest{})
	st := status.Convert(err)
	fmt.Printf("uid=%d code=%s msg=%s\n", os.Getuid(), st.Code(), st.Message())
	return 0
}

// helper runs the test binary as a helper process and returns its output.
func helper(t *testing.T, mode, socket, claim string, attr *syscall.SysProcAttr) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	cmd := execHelper(ctx, os.Args[0], mode, socket)
	cmd.Env = append(cmd.Env, helperClaim+"="+claim)
	cmd.SysProcAttr = attr
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "helper: %s", out)
	return string(out)
}

// execHelper returns the command that runs bin (a copy of this test binary)
// as a helper of mode on socket.
func execHelper(ctx context.Context, bin, mode, socket string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, helperSocket+"="+socket)
	return cmd
}

// syncLog is a log buffer safe for the daemon's goroutines.
type syncLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func startLoggedDaemon(t *testing.T, opts ctxmgr.Options) (*daemon, *syncLog) {
	t.Helper()
	log := &syncLog{}
	opts.Logger = slog.New(slog.NewTextHandler(log, nil))
	return startDaemon(t, opts), log
}

// TestHostileShimMessagesDisconnect: a registered shim that sends a field out
// of its limits is told why, disconnected and logged, and the registry and
// free memory never show the bad value (issue 8 item 10).
func TestHostileShimMessagesDisconnect(t *testing.T) {
	d, log := startLoggedDaemon(t, ctxmgr.Options{GPUMemory: 80 * gib})
	d.shim(t, fakeshim.Hello{PID: 6999, Device: "0", Bytes: gib}, fakeshim.Behavior{}) // a bystander
	tests := []struct {
		desc string
		msg  swapproto.Message
		want string
	}{
		{"negative usage", swapproto.Message{Type: swapproto.TypeUsage, Bytes: -900 << 40}, "usage: bytes -989560464998400 is negative"},
		{"usage over the device", swapproto.Message{Type: swapproto.TypeUsage, Bytes: 81 * gib}, `usage: bytes 86973087744 exceeds device "0"'s 80.0 GiB of memory`},
		{"absurd usage", swapproto.Message{Type: swapproto.TypeUsage, Bytes: 1 << 62}, "over the 17592186044416-byte limit"},
		{"negative need", swapproto.Message{Type: swapproto.TypeNeed, ID: "1", Bytes: -gib}, "need: bytes -1073741824 is negative"},
		{"need without id", swapproto.Message{Type: swapproto.TypeNeed, Bytes: gib}, "need: missing id"},
		{"progress past total", swapproto.Message{Type: swapproto.TypeProgress, ID: "1", Done: 9, Total: 1}, "done 9 exceeds total 1"},
		{"progress over the device", swapproto.Message{Type: swapproto.TypeProgress, ID: "1", Total: 100 * gib}, "progress: total"},
		{"negative result bytes", swapproto.Message{Type: swapproto.TypeResult, ID: "1", Bytes: -1}, "result: bytes -1 is negative"},
		{"negative seconds", swapproto.Message{Type: swapproto.TypeResult, ID: "1", Seconds: -3}, "seconds -3 is out of range"},
		{"error with control characters", swapproto.Message{Type: swapproto.TypeResult, ID: "1", Error: "x\x1b[2J"}, "control character"},
	}
	for i, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			pid := 7000 + i
			s := d.shim(t, fakeshim.Hello{PID: pid, Device: "0", Bytes: gib}, fakeshim.Behavior{})
			require.NoError(t, s.Send(tc.msg))
			select {
			case <-s.Done():
			case <-time.After(5 * time.Second):
				t.Fatal("the daemon kept a shim that broke the limits")
			}
			require.Eventually(t, func() bool { _, ok := d.proc(t, pid); return !ok }, 5*time.Second, 5*time.Millisecond)
			require.NotEmpty(t, s.Errors())
			require.Contains(t, s.Errors()[0], tc.want)
			require.Contains(t, s.Errors()[0], "disconnecting")
			require.Contains(t, log.String(), "shim disconnected for a protocol violation")
			require.Contains(t, log.String(), fmt.Sprintf("pid=%d", pid))
			procs, free, err := d.m.Status(ctx5s(t))
			require.NoError(t, err)
			require.Len(t, procs, 1, "only the bystander")
			require.Equal(t, 79*gib, free["0"], "the bad value never counted")
		})
	}
}

// TestHostileHelloRefused: a hello out of its limits gets an error and no
// welcome, and the refusal is logged.
func TestHostileHelloRefused(t *testing.T) {
	d, log := startLoggedDaemon(t, ctxmgr.Options{GPUMemory: 80 * gib})
	tests := []struct {
		desc string
		h    fakeshim.Hello
		want string
	}{
		{"negative bytes", fakeshim.Hello{PID: 11, Bytes: -900 << 40}, "hello: bytes -989560464998400 is negative"},
		{"bytes over the device", fakeshim.Hello{PID: 12, Device: "GPU-a", Bytes: 100 * gib}, `bytes 107374182400 exceed device "GPU-a"'s 80.0 GiB`},
		{"negative pid", fakeshim.Hello{PID: -5}, "pid -5 is out of range"},
		{"absurd priority", fakeshim.Hello{PID: 13, Priority: 1 << 40}, "priority 1099511627776 is out of range"},
		{"job with a newline", fakeshim.Hello{PID: 14, Job: "a\nfake log line"}, "job contains control character U+000A"},
		{"long job", fakeshim.Hello{PID: 15, Job: strings.Repeat("j", 300)}, "job is 300 bytes, over 256"},
		{"device with a space", fakeshim.Hello{PID: 16, Device: "GPU 0"}, `device "GPU 0" contains ' '`},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			_, err := fakeshim.Dial(ctx5s(t), d.socket, tc.h, fakeshim.Behavior{})
			require.ErrorContains(t, err, tc.want)
			require.Contains(t, log.String(), "shim refused")
		})
	}
	procs, _, err := d.m.Status(ctx5s(t))
	require.NoError(t, err)
	require.Empty(t, procs)
}

// unknownDeviceMemory knows devices "0" and "1" (80 GiB each) only.
type unknownDeviceMemory struct{}

func (unknownDeviceMemory) Free(_ context.Context, device string) (int64, error) {
	if device != "0" && device != "1" {
		return 0, fmt.Errorf("no device %q", device)
	}
	return 80 * gib, nil
}

func TestHelloUnknownDeviceRefused(t *testing.T) {
	d := startDaemon(t, ctxmgr.Options{Memory: unknownDeviceMemory{}})
	_, err := fakeshim.Dial(ctx5s(t), d.socket, fakeshim.Hello{PID: 21, Device: "GPU-nowhere"}, fakeshim.Behavior{})
	require.ErrorContains(t, err, `unknown device "GPU-nowhere": no device "GPU-nowhere"`)
	s := d.shim(t, fakeshim.Hello{PID: 22, Device: "1", Bytes: gib}, fakeshim.Behavior{})
	require.NoError(t, s.Usage(2*gib), "no declared capacity: any count up to swapproto.MaxBytes")
}

// TestNeedOverTheDeviceDenied: a program may ask for more than the device
// has; the need is denied with the reason and the shim stays connected.
func TestNeedOverTheDeviceDenied(t *testing.T) {
	d := startDaemon(t, ctxmgr.Options{GPUMemory: 16 * gib})
	s := d.shim(t, fakeshim.Hello{PID: 31, Device: "0"}, fakeshim.Behavior{})
	ok, reason, err := s.Need(ctx5s(t), 17*gib)
	require.NoError(t, err)
	require.False(t, ok)
	require.Contains(t, reason, `need 17.0 GiB exceeds device "0"'s 16.0 GiB of memory`)
	_, registered := d.proc(t, 31)
	require.True(t, registered)
}

// TestGarbageFloodDisconnects: bad lines are answered and forgiven up to a
// bound, then the shim is dropped.
func TestGarbageFloodDisconnects(t *testing.T) {
	d, log := startLoggedDaemon(t, ctxmgr.Options{GPUMemory: 16 * gib})
	s := d.shim(t, fakeshim.Hello{PID: 41}, fakeshim.Behavior{})
	for range 16 {
		require.NoError(t, s.SendLine([]byte("garbage\n")))
	}
	require.Eventually(t, func() bool { return len(s.Errors()) == 16 }, 5*time.Second, 5*time.Millisecond)
	_, ok := d.proc(t, 41)
	require.True(t, ok, "16 bad lines are forgiven")
	require.NoError(t, s.SendLine([]byte(strings.Repeat("x", 2*swapproto.MaxLine)+"\n")))
	select {
	case <-s.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the 17th bad line did not end the connection")
	}
	require.Contains(t, log.String(), "more than 16 protocol errors")
}

// TestForeignPIDRefused: a shim in another process may only claim its own
// pid (issue 8 item 11); claiming pid 1 is refused and logged.
func TestForeignPIDRefused(t *testing.T) {
	d, log := startLoggedDaemon(t, ctxmgr.Options{GPUMemory: 16 * gib})
	out := helper(t, "shim", d.socket, "1", nil)
	require.Contains(t, out, "type=error")
	require.Regexp(t, `reason=hello claims pid 1, but the connecting process is pid \d+`, out)
	require.Contains(t, log.String(), "shim refused")
	out = helper(t, "shim", d.socket, strconv.Itoa(os.Getpid()), nil)
	require.Contains(t, out, "type=error", "the test process's pid is not the helper's")

	// Its own pid (or 0) is welcome.
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"=shim", helperSocket+"="+d.socket, helperClaim+"=self")
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { stdin.Close(); _ = cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	require.Contains(t, line, "type=welcome")
	p, ok := d.proc(t, cmd.Process.Pid)
	require.True(t, ok)
	require.Zero(t, p.PeerPID, "the claim is the peer's pid: no PeerPID")
}

// TestNamespacedPIDAccepted: a shim in its own pid namespace (a container)
// claims its namespace pid; the daemon accepts it because /proc says that is
// the peer's pid there, and keeps the host pid as PeerPID. Needs root
// (CLONE_NEWPID).
func TestNamespacedPIDAccepted(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("creating a pid namespace needs root")
	}
	d := startDaemon(t, ctxmgr.Options{GPUMemory: 16 * gib})
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"=shim", helperSocket+"="+d.socket, helperClaim+"=self")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { stdin.Close(); _ = cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	require.Contains(t, line, "pid=1 type=welcome", "pid 1 in its namespace")
	p, ok := d.proc(t, 1)
	require.True(t, ok)
	require.Equal(t, cmd.Process.Pid, p.PeerPID, "the host pid is kept as PeerPID")

	// A second shim, not in that namespace, may not claim the same pid 1.
	out := helper(t, "shim", d.socket, "1", nil)
	require.Contains(t, out, "hello claims pid 1, but the connecting process is pid")
}
