package trainer

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/allreduce"
	"github.com/migctl/migctl/comm"
	"github.com/migctl/migctl/internal/cuda"
)

// queueBackTuning is a chained all-reduce of 160 KB: 10 chunks of 16 KiB,
// all in the 16 slots, so that every copy out is queued at the issue.
func queueBackTuning(queue bool) Tuning {
	return Tuning{Chunk: 16 << 10, Slots: 16, SmallBytes: 1 << 10, CompleteOnDevice: true, QueueCopiesBack: queue}
}

const queueBackCount = 40000

// With Tuning.QueueCopiesBack a chained all-reduce whose chunks fit the
// slots readies its caller at the issue: rank 0 gets its event before rank
// 1 has even entered the call, and a stream ordered after the event reads
// the whole, correct result once rank 1 has contributed (the copies back
// wait on the device for the chunks' reductions). With CompleteOnDevice
// alone, rank 0 is readied only once the last chunk is reduced, so not
// before rank 1 enters.
func TestQueuedCopiesBackReadyAtTheIssue(t *testing.T) {
	const n = 2
	for _, queue := range []bool{true, false} {
		t.Run(fmt.Sprintf("queue_copies_back=%v", queue), func(t *testing.T) {
			fakes := make([]*cuda.Fake, n)
			fakeOpts := blockingFakes(fakes, nil)
			opts := func(r int) []Option {
				return append(fakeOpts(r), WithTuning(queueBackTuning(queue)), WithAlgorithm(AlgorithmHostStaged))
			}
			readied := make(chan comm.Event, 1)
			before := allreduce.QueuedBackCalls()
			errs := world(t, n, opts, func(g *Group) error {
				ctx := context.Background()
				f := fakes[g.Rank()]
				stream, ptr, b, done, err := callerInput(ctx, g, f, queueBackCount)
				if err != nil {
					return err
				}
				defer done()
				if !g.Chains(b, b) || !g.CompletesEarly() {
					return fmt.Errorf("an all-reduce of %d floats: chains %v, completes early %v", queueBackCount, g.Chains(b, b), g.CompletesEarly())
				}
				if g.Rank() == 1 {
					// Enter once rank 0 is readied, or after a while.
					var early bool
					select {
					case ev := <-readied:
						early = true
						readied <- ev
					case <-time.After(500 * time.Millisecond):
					}
					if early != queue {
						return fmt.Errorf("rank 0 readied before rank 1 entered: %v, with QueueCopiesBack %v", early, queue)
					}
					return g.AllReduce(ctx, b, b, Sum)
				}
				f.SetCopyToDeviceTime(time.Millisecond) // copies back that take time
				w := g.AllReduceAsync(ctx, b, b, Sum)
				w.OnReady(func(ev comm.Event) { readied <- ev })
				var ev comm.Event
				select {
				case ev = <-readied:
					readied <- ev // for rank 1
				case <-w.Done():
					return fmt.Errorf("the all-reduce ended without readying early: %v", w.Err())
				}
				if err := readAfterReady(g, f, stream, ev, ptr, queueBackCount); err != nil {
					return err
				}
				return w.Wait(ctx)
			})
			requireAll(t, errs)
			queued := allreduce.QueuedBackCalls() - before
			if queue {
				require.Equal(t, uint64(n), queued, "calls that queued their copies back")
			} else {
				require.Zero(t, queued, "calls that queued their copies back")
			}
		})
	}
}

// A call readied at its issue whose peer then fails never completes: its
// copies back wait on the device for flags the peer will not raise. The
// call fails, and the waits are released, so that the group closes with
// its streams drained (Close reports an undrained stream).
func TestQueuedCopiesBackReleasedWhenAPeerFails(t *testing.T) {
	const n = 2
	fakes := make([]*cuda.Fake, n)
	fakeOpts := blockingFakes(fakes, nil)
	opts := func(r int) []Option {
		return append(fakeOpts(r), WithTuning(queueBackTuning(true)), WithAlgorithm(AlgorithmHostStaged))
	}
	readied := make(chan struct{})
	errs := world(t, n, opts, func(g *Group) error {
		ctx := context.Background()
		if g.Rank() == 1 {
			select {
			case <-readied:
			case <-time.After(10 * time.Second):
				return fmt.Errorf("rank 0 was not readied at its issue")
			}
			g.Abort("rank 1 gives up")
			return nil
		}
		_, ptr, err := deviceInput(ctx, g, queueBackCount)
		if err != nil {
			return err
		}
		b := DeviceBufferAfter(ptr, queueBackCount, Float32, nil)
		w := g.AllReduceAsync(ctx, b, b, Sum)
		w.OnReady(func(comm.Event) { close(readied) })
		err = w.Wait(ctx)
		if err == nil {
			return fmt.Errorf("the all-reduce succeeded without rank 1")
		}
		if !errors.Is(err, comm.ErrAborted) {
			return fmt.Errorf("the all-reduce failed, but not as aborted: %w", err)
		}
		return nil
	})
	requireAll(t, errs)
}
