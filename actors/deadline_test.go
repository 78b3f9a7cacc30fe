package actors

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDeadlineCtxEndsAtItsDeadline(t *testing.T) {
	ctx, release := withDeadline(context.Background(), time.Now().Add(20*time.Millisecond))
	defer release()
	require.NoError(t, ctx.Err())
	d, ok := ctx.Deadline()
	require.True(t, ok)
	assert.WithinDuration(t, time.Now().Add(20*time.Millisecond), d, 20*time.Millisecond)
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed long after the deadline")
	}
	require.ErrorIs(t, ctx.Err(), context.DeadlineExceeded)
}

func TestDeadlineCtxErrClosesDone(t *testing.T) {
	// Nobody asked for Done before the deadline passed: Err finds it
	// passed, and Done is then closed (Err is non-nil only once Done is).
	ctx, release := withDeadline(context.Background(), time.Now().Add(-time.Millisecond))
	defer release()
	require.ErrorIs(t, ctx.Err(), context.DeadlineExceeded)
	select {
	case <-ctx.Done():
	default:
		t.Fatal("Err is non-nil but Done is open")
	}
	// And with Done asked first.
	ctx2, release2 := withDeadline(context.Background(), time.Now().Add(time.Hour))
	defer release2()
	done := ctx2.Done()
	ctx2.deadline = time.Now().Add(-time.Millisecond) // as if an hour passed
	require.ErrorIs(t, ctx2.Err(), context.DeadlineExceeded)
	select {
	case <-done:
	default:
		t.Fatal("Err is non-nil but Done is open")
	}
}

func TestDeadlineCtxFollowsItsParent(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	ctx, release := withDeadline(parent, time.Now().Add(time.Hour))
	defer release()
	done := ctx.Done()
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed after the parent ended")
	}
	require.ErrorIs(t, ctx.Err(), context.Canceled)

	// A parent that ended before anybody asked: Err says so at once.
	ctx2, release2 := withDeadline(parent, time.Now().Add(time.Hour))
	defer release2()
	require.ErrorIs(t, ctx2.Err(), context.Canceled)
	<-ctx2.Done()

	// The earlier deadline of the parent is the context's.
	pd, pcancel := context.WithDeadline(context.Background(), time.Now().Add(time.Minute))
	defer pcancel()
	ctx3, release3 := withDeadline(pd, time.Now().Add(time.Hour))
	defer release3()
	d, _ := ctx3.Deadline()
	want, _ := pd.Deadline()
	assert.Equal(t, want, d)
}

func TestDeadlineCtxReleaseStopsItsTimer(t *testing.T) {
	ctx, release := withDeadline(context.Background(), time.Now().Add(time.Hour))
	_ = ctx.Done()
	timer := ctx.timer
	require.NotNil(t, timer, "Done made the timer")
	release()
	assert.False(t, timer.Stop(), "release stopped the timer")
	assert.Nil(t, ctx.stopParent)
	require.NoError(t, ctx.Err())

	// Without Done, no timer is ever made.
	ctx2, release2 := withDeadline(context.Background(), time.Now().Add(time.Hour))
	require.NoError(t, ctx2.Err())
	release2()
	assert.Nil(t, ctx2.timer)
}
