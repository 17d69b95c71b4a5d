package ctxmgr_test

import (
	"context"
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	ctxmgr "github.com/migctl/migctl/context"
	"github.com/migctl/migctl/context/ctlpb"
	"github.com/migctl/migctl/context/fakeshim"
)

func startControl(t *testing.T, d *daemon) ctlpb.ControlClient {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "run", "control.sock")
	ln, err := ctxmgr.ListenUnix(socket, nil)
	require.NoError(t, err)
	srv := grpc.NewServer()
	ctxmgr.NewControlServer(d.m).Register(srv)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return ctlpb.NewControlClient(conn)
}

func collect(t *testing.T, stream grpc.ServerStreamingClient[ctlpb.SwapEvent]) ([]*ctlpb.SwapProgress, []*ctlpb.SwapResult, error) {
	var prog []*ctlpb.SwapProgress
	var res []*ctlpb.SwapResult
	for {
		ev, err := stream.Recv()
		if err == io.EOF {
			return prog, res, nil
		}
		if err != nil {
			return prog, res, err
		}
		if p := ev.GetProgress(); p != nil {
			prog = append(prog, p)
		}
		if r := ev.GetResult(); r != nil {
			res = append(res, r)
		}
	}
}

func TestControlAPI(t *testing.T) {
	d := startDaemon(t, ctxmgr.Options{GPUMemory: 16 * gib})
	cl := startControl(t, d)
	s := d.shim(t, fakeshim.Hello{PID: 901, Job: "bert", Priority: 1, Device: "GPU-x", Bytes: 12 * gib},
		fakeshim.Behavior{Chunks: 3, ChunkDelay: 2 * time.Millisecond})
	ctx := ctx5s(t)

	st, err := cl.Status(ctx, &ctlpb.StatusRequest{})
	require.NoError(t, err)
	require.Len(t, st.Processes, 1)
	require.Equal(t, "bert", st.Processes[0].Job)
	require.Equal(t, "running", st.Processes[0].State)
	require.Equal(t, 12*gib, st.Processes[0].GpuBytes)
	require.Equal(t, []*ctlpb.DeviceMemory{{Device: "GPU-x", Free: 4 * gib}}, sanitize(st.Devices))

	stream, err := cl.Swap(ctx, &ctlpb.SwapRequest{Direction: ctlpb.Direction_DIRECTION_OUT, Job: "bert"})
	require.NoError(t, err)
	prog, res, err := collect(t, stream)
	require.NoError(t, err)
	require.Len(t, prog, 3)
	require.Equal(t, 12*gib, prog[2].Done)
	require.Len(t, res, 1)
	require.True(t, res[0].Ok)
	require.Equal(t, 12*gib, res[0].Bytes)
	require.True(t, s.Out())

	errCases := []struct {
		desc string
		req  *ctlpb.SwapRequest
		code codes.Code
		msg  string
	}{
		{"already out", &ctlpb.SwapRequest{Direction: ctlpb.Direction_DIRECTION_OUT, Pid: 901}, codes.FailedPrecondition, "already swapped out"},
		{"no such pid", &ctlpb.SwapRequest{Direction: ctlpb.Direction_DIRECTION_IN, Pid: 4242}, codes.NotFound, "pid 4242: no such shimmed process"},
		{"no such job", &ctlpb.SwapRequest{Direction: ctlpb.Direction_DIRECTION_IN, Job: "gpt"}, codes.NotFound, `job "gpt": no such job`},
		{"both pid and job", &ctlpb.SwapRequest{Direction: ctlpb.Direction_DIRECTION_IN, Job: "bert", Pid: 901}, codes.InvalidArgument, "exactly one"},
		{"no direction", &ctlpb.SwapRequest{Pid: 901}, codes.InvalidArgument, "direction"},
	}
	for _, tc := range errCases {
		t.Run(tc.desc, func(t *testing.T) {
			stream, err := cl.Swap(ctx, tc.req)
			require.NoError(t, err)
			_, _, err = collect(t, stream)
			require.Equal(t, tc.code, status.Code(err), err)
			require.ErrorContains(t, err, tc.msg)
		})
	}

	// Reserve for a non-shimmed job: 16 GiB free now, so 10 GiB needs no victim
	// and is then kept from the policy (an auto swap-in would not fit).
	rr, err := cl.Reserve(ctx, &ctlpb.ReserveRequest{Device: "GPU-x", Bytes: 10 * gib, Priority: 5, HoldSeconds: 60})
	require.NoError(t, err)
	require.Empty(t, rr.Victims)
	require.Equal(t, 16*gib, rr.Free)
	_, err = cl.Reserve(ctx, &ctlpb.ReserveRequest{Device: "GPU-x", Bytes: 10 * gib, Priority: 5})
	require.Equal(t, codes.FailedPrecondition, status.Code(err))
	require.ErrorContains(t, err, "memory request denied")

	stream, err = cl.Swap(ctx, &ctlpb.SwapRequest{Direction: ctlpb.Direction_DIRECTION_IN, Pid: 901})
	require.NoError(t, err)
	_, res, err = collect(t, stream)
	require.NoError(t, err)
	require.True(t, res[0].Ok)
	require.Equal(t, ctlpb.Direction_DIRECTION_IN, res[0].Direction)
	require.False(t, s.Out())
}

func TestReserveSwapsOutLowerPriority(t *testing.T) {
	d := startDaemon(t, ctxmgr.Options{GPUMemory: 16 * gib})
	cl := startControl(t, d)
	low := d.shim(t, fakeshim.Hello{PID: 951, Priority: 0, Device: "0", Bytes: 12 * gib}, fakeshim.Behavior{})
	rr, err := cl.Reserve(ctx5s(t), &ctlpb.ReserveRequest{Device: "0", Bytes: 8 * gib, Priority: 1, HoldSeconds: 60})
	require.NoError(t, err)
	require.Equal(t, []int32{951}, rr.Victims)
	require.True(t, low.Out())
	// The reservation keeps it out even when the policy runs.
	require.NoError(t, d.m.Rebalance(context.Background()))
	require.True(t, low.Out())
}

func sanitize(in []*ctlpb.DeviceMemory) []*ctlpb.DeviceMemory {
	out := make([]*ctlpb.DeviceMemory, len(in))
	for i, d := range in {
		out[i] = &ctlpb.DeviceMemory{Device: d.Device, Free: d.Free}
	}
	return out
}
