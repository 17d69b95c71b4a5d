package trainer

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// uncomparable is a caller's context type that == cannot compare.
type uncomparable struct {
	context.Context
	tags []string
}

// The worker's call clock: one context for call after call while the
// caller's context is the same and no call times out; a call past its
// timeout ends with ErrTimeout and the next gets a fresh context; another
// caller's context is the parent of the next call's; a caller's context
// type that == cannot compare is fine.
func TestCallClock(t *testing.T) {
	c := newCallClock(newHoldState())
	defer c.close()
	bg := context.Background()

	ctx1, end := c.begin(bg, time.Second)
	_, ok := ctx1.Deadline()
	require.True(t, ok, "the executor needs a deadline")
	end()
	ctx2, end := c.begin(bg, time.Second)
	require.Equal(t, ctx1, ctx2, "reused")
	end()
	time.Sleep(1100 * time.Millisecond)
	require.NoError(t, ctx2.Err(), "an ended call's clock does not run on")

	ctx3, end := c.begin(bg, 30*time.Millisecond)
	time.Sleep(150 * time.Millisecond)
	require.Error(t, ctx3.Err())
	require.True(t, errors.Is(context.Cause(ctx3), ErrTimeout), "%v", context.Cause(ctx3))
	end()
	ctx4, end := c.begin(bg, time.Second)
	require.NoError(t, ctx4.Err(), "a fresh context after a timeout")
	end()

	parent, cancel := context.WithCancel(bg)
	ctx5, end := c.begin(parent, time.Second)
	cancel()
	require.Error(t, ctx5.Err(), "the caller's context is the parent")
	end()
	ctx6, end := c.begin(uncomparable{bg, nil}, time.Second)
	require.NoError(t, ctx6.Err())
	end()
	ctx7, end := c.begin(uncomparable{bg, nil}, time.Second)
	require.NoError(t, ctx7.Err())
	end()
}
