package actors

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/messages"
)

// nopEnv is a staging environment that does nothing (the task actor's state
// machine alone is under test).
type nopEnv struct{ failed []error }

func (*nopEnv) CopyStage(context.Context, *StagingTask, []*StagingChunk) error { return nil }
func (*nopEnv) Accept(*StagingTask, messages.TaskState, *StagingChunk) error   { return nil }
func (*nopEnv) Queued(*StagingTask, []*StagingChunk)                           {}
func (*nopEnv) HostReady(*StagingTask, []*StagingChunk)                        {}
func (*nopEnv) PoolWrite(context.Context, *StagingTask, []*StagingChunk, []ScatterRow) error {
	return nil
}
func (*nopEnv) Written(*StagingTask, []*StagingChunk) {}
func (e *nopEnv) Failed(_ *StagingTask, _ []*StagingChunk, err error) {
	e.failed = append(e.failed, err)
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
func TestStagingTaskActorLifecycle(t *testing.T) {
	env := &nopEnv{}
	st, err := StartStaging(StagingConfig{Env: env, Eager: true})
	require.NoError(t, err)
	defer st.Stop()
	ctx := context.Background()
	task, err := st.NewTask("req", 2, messages.JoinNextStep)
	require.NoError(t, err)
	assert.Equal(t, "req", task.ReqID)
	assert.Equal(t, 2, task.WriteN)

	var illegal *IllegalTransitionError
	for _, to := range []messages.TaskState{messages.TaskCopying, messages.TaskHostReady, messages.TaskWritten, messages.TaskPending} {
		require.ErrorAs(t, st.Transition(ctx, task, to), &illegal, "PENDING -> %s", to)
	}
	require.NoError(t, st.Enqueue(ctx, task, messages.PriorityLow))
	assert.Equal(t, messages.TaskQueued, task.State())
	require.ErrorAs(t, st.Transition(ctx, task, messages.TaskHostReady), &illegal)
	_, won, err := st.Claim(ctx, task)
	require.NoError(t, err)
	require.True(t, won)
	_, won, _ = st.Claim(ctx, task)
	assert.False(t, won, "only one claim wins")
	var refused *AppendRefusedError
	require.ErrorAs(t, st.Append(ctx, task, &StagingChunk{}), &refused)
	assert.Equal(t, messages.TaskCopying, refused.State)
	assert.False(t, closed(task.HostReady()))
	require.ErrorAs(t, st.Transition(ctx, task, messages.TaskWritten), &illegal)
	require.NoError(t, st.Transition(ctx, task, messages.TaskHostReady))
	<-task.HostReady() // closed just after the actor answered the transition
	assert.False(t, closed(task.Done()))
	require.NoError(t, st.Transition(ctx, task, messages.TaskWritten))
	<-task.Done()
	assert.NoError(t, task.Err())
	assert.False(t, st.Fail(task, errors.New("late")), "a terminal task does not fail")
	require.ErrorAs(t, st.Transition(ctx, task, messages.TaskFailed), &illegal)

	// FAILED from a non-terminal state closes both channels, after Failed.
	other, err := st.NewTask("req", 3, messages.JoinOnFinish)
	require.NoError(t, err)
	boom := errors.New("boom")
	require.True(t, st.Fail(other, boom))
	assert.True(t, closed(other.HostReady()))
	assert.True(t, closed(other.Done()))
	assert.Equal(t, boom, other.Err())
	assert.Equal(t, []error{boom}, env.failed)
	require.ErrorIs(t, st.Enqueue(ctx, other, messages.PriorityLow), boom)
}

// A failure sent to tasks that were pending (the pipeline's failure, or an
// aborted Close) leaves a task whose copy stage is claimed to that stage:
// its chunks are the stage's until it ends.
func TestStagingFailUnclaimedLeavesClaimedTasks(t *testing.T) {
	env := &nopEnv{}
	st, err := StartStaging(StagingConfig{Env: env, Eager: true})
	require.NoError(t, err)
	defer st.Stop()
	ctx := context.Background()
	claimed, err := st.NewTask("req", 1, messages.JoinOnFinish)
	require.NoError(t, err)
	require.NoError(t, st.Enqueue(ctx, claimed, messages.PriorityLow))
	_, won, err := st.Claim(ctx, claimed)
	require.NoError(t, err)
	require.True(t, won)
	pending, err := st.NewTask("req", 2, messages.JoinOnFinish)
	require.NoError(t, err)

	boom := errors.New("boom")
	assert.False(t, st.FailUnclaimed(claimed, boom), "claimed: left to its copy stage")
	assert.Equal(t, messages.TaskCopying, claimed.State())
	assert.Empty(t, env.failed)
	assert.True(t, st.FailUnclaimed(pending, boom))
	assert.Equal(t, messages.TaskFailed, pending.State())
	st.FailAsync(claimed, boom)
	require.NoError(t, st.Transition(ctx, claimed, messages.TaskHostReady), "the async failure left it alone too")
}
