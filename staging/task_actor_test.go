package staging

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/soft"
)

// freeRuntime is a Runtime whose reservations succeed within the clone cap
// (its ledger's locations have no budget): the task actor's state machine
// is under test here, not the budgets.
type freeRuntime struct {
	*ledgerBook
	be *soft.Backend
}

func (r freeRuntime) Backend() cuda.Backend { return r.be }

// newActorPipeline starts an eager pipeline (no copy queue, no committer:
// the test drives the task actors itself) and closes it at the end.
func newActorPipeline(t *testing.T) *Pipeline {
	t.Helper()
	be, err := soft.New(soft.Config{Locations: []string{"pageable-host", "pinned-host", "cuda:0"}})
	require.NoError(t, err)
	p, err := New(context.Background(), freeRuntime{ledgerBook: newLedgerBook(t), be: be}, Config{
		Device: "cuda:0", Slots: 1, SlotBytes: 64, Keys: []string{"k"}, PoolSlots: 4, RowBytes: 8,
		CloneBudgetBytes: 64, Eager: true,
	})
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, p.Close(context.Background()))
		require.NoError(t, be.Close())
	})
	return p
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// The task actor refuses every skip, and only the transitions into
// HOST_READY / WRITTEN / FAILED close the wait channels.
func TestTaskActorLifecycle(t *testing.T) {
	p := newActorPipeline(t)
	st := p.sys
	ctx := context.Background()
	open, err := p.Open(ctx, TaskSpec{ReqID: "req", WriteN: 2, Mode: JoinNextStep})
	require.NoError(t, err)
	task := open.t
	assert.Equal(t, "req", task.ReqID)
	assert.Equal(t, 2, task.WriteN)

	var illegal *IllegalTransitionError
	for _, to := range []TaskState{Copying, HostReady, Written, Pending} {
		require.ErrorAs(t, st.Transition(ctx, task, to), &illegal, "PENDING -> %s", to)
	}
	require.NoError(t, st.Enqueue(ctx, task, prioLow))
	assert.Equal(t, Queued, task.State())
	require.ErrorAs(t, st.Transition(ctx, task, HostReady), &illegal)
	_, won, err := st.Claim(ctx, task)
	require.NoError(t, err)
	require.True(t, won)
	_, won, _ = st.Claim(ctx, task)
	assert.False(t, won, "only one claim wins")
	var refused *AppendRefusedError
	require.ErrorAs(t, st.Append(ctx, task, &taskChunk{}), &refused)
	assert.Equal(t, Copying, refused.State)
	assert.False(t, closed(task.HostReady()))
	require.ErrorAs(t, st.Transition(ctx, task, Written), &illegal)
	require.NoError(t, st.Transition(ctx, task, HostReady))
	<-task.HostReady() // closed just after the actor answered the transition
	assert.False(t, closed(task.Done()))
	require.NoError(t, st.Transition(ctx, task, Written))
	<-task.Done()
	assert.NoError(t, task.Err())
	assert.False(t, st.Fail(task, errors.New("late")), "a terminal task does not fail")
	require.ErrorAs(t, st.Transition(ctx, task, Failed), &illegal)

	// FAILED from a non-terminal state closes both channels, after the
	// pipeline's failure record is published.
	open, err = p.Open(ctx, TaskSpec{ReqID: "req", WriteN: 3, Mode: JoinOnFinish})
	require.NoError(t, err)
	other := open.t
	boom := errors.New("boom")
	require.True(t, st.Fail(other, boom))
	assert.True(t, closed(other.HostReady()))
	assert.True(t, closed(other.Done()))
	assert.Equal(t, boom, other.Err())
	var failed *FailedError
	require.ErrorAs(t, p.Err(), &failed)
	assert.Equal(t, other.ID, failed.Task)
	assert.Equal(t, boom, failed.Err)
	require.ErrorIs(t, st.Enqueue(ctx, other, prioLow), boom)
}

// A failure sent to tasks that were pending (the pipeline's failure, or an
// aborted Close) leaves a task whose copy stage is claimed to that stage:
// its chunks are the stage's until it ends.
func TestFailUnclaimedLeavesClaimedTasks(t *testing.T) {
	p := newActorPipeline(t)
	st := p.sys
	ctx := context.Background()
	open, err := p.Open(ctx, TaskSpec{ReqID: "req", WriteN: 1, Mode: JoinOnFinish})
	require.NoError(t, err)
	claimed := open.t
	require.NoError(t, st.Enqueue(ctx, claimed, prioLow))
	_, won, err := st.Claim(ctx, claimed)
	require.NoError(t, err)
	require.True(t, won)
	open, err = p.Open(ctx, TaskSpec{ReqID: "req", WriteN: 2, Mode: JoinOnFinish})
	require.NoError(t, err)
	pending := open.t

	boom := errors.New("boom")
	assert.False(t, st.FailUnclaimed(claimed, boom), "claimed: left to its copy stage")
	assert.Equal(t, Copying, claimed.State())
	assert.NoError(t, p.Err(), "nothing failed")
	assert.True(t, st.FailUnclaimed(pending, boom))
	assert.Equal(t, Failed, pending.State())
	st.FailAsync(claimed, boom)
	require.NoError(t, st.Transition(ctx, claimed, HostReady), "the async failure left it alone too")
	require.NoError(t, st.Transition(ctx, claimed, Written))
}

// A claim the task's actor granted is known to its caller even when the
// caller's context has ended: Claim waits for the actor's answer. (A
// claim given up on the context after the actor granted it left the task
// claimed with nobody to end it; Close's drain then waited for it for
// ever — found by the close checker's soak.)
func TestClaimGrantedIsKnownWhateverTheContext(t *testing.T) {
	ctx := context.Background()
	ended, cancel := context.WithCancel(ctx)
	cancel()
	for i := range 30 { // the answer and ctx's end race in Claim's wait: try it often
		p := newActorPipeline(t) // one each: the task's failure is the pipeline's first
		task, err := p.Open(ctx, TaskSpec{ReqID: "claim", WriteN: 0, Mode: JoinNextStep})
		require.NoError(t, err)
		require.NoError(t, p.sys.Enqueue(ctx, task.t, prioLow))
		_, won, err := p.sys.Claim(ended, task.t)
		state := task.State()
		failed := p.sys.Fail(task.t, context.Canceled) // the claimer ends the task (here whoever the claim went to)
		require.Equal(t, Copying, state, "the actor granted the claim")
		require.True(t, won, "claim %d: granted by the actor, but its caller was not told", i)
		require.ErrorIs(t, err, context.Canceled, "ctx's error comes back with the claim")
		require.True(t, failed)
	}
}
