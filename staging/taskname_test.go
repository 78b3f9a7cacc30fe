package staging

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A named task's errors carry its name as a field and name it by it in
// their messages; an unnamed task is named by its id.
func TestTaskNameInErrors(t *testing.T) {
	p := newActorPipeline(t)
	st := p.sys
	ctx := context.Background()
	open, err := p.Open(ctx, TaskSpec{ReqID: "req", Mode: JoinNextStep, Name: "w1"})
	require.NoError(t, err)
	assert.Equal(t, "w1", open.Name())
	task := open.t

	var illegal *IllegalTransitionError
	require.ErrorAs(t, st.Transition(ctx, task, Written), &illegal)
	assert.Equal(t, "w1", illegal.TaskName)
	assert.Equal(t, `staging: task "w1": illegal transition PENDING -> WRITTEN`, illegal.Error())

	require.NoError(t, st.Enqueue(ctx, task, prioLow))
	_, won, err := st.Claim(ctx, task)
	require.NoError(t, err)
	require.True(t, won)
	var refused *AppendRefusedError
	require.ErrorAs(t, st.Append(ctx, task, &taskChunk{}), &refused)
	assert.Equal(t, "w1", refused.TaskName)
	assert.Equal(t, `staging: task "w1": append refused: the task is COPYING; open a fresh task`, refused.Error())
	assert.Contains(t, task.String(), `task "w1" (req "req"`)
	require.NoError(t, st.Transition(ctx, task, HostReady))
	require.NoError(t, st.Transition(ctx, task, Written))

	unnamed, err := p.Open(ctx, TaskSpec{ReqID: "req", Mode: JoinOnFinish})
	require.NoError(t, err)
	assert.Empty(t, unnamed.Name())
	boom := errors.New("boom")
	require.True(t, st.Fail(unnamed.t, boom))
	var failed *FailedError
	require.ErrorAs(t, p.Err(), &failed)
	assert.Empty(t, failed.TaskName)
	assert.Equal(t, "staging: pipeline failed at task 2: boom", failed.Error())
}

// The failure record names the task that failed the pipeline.
func TestTaskNameInFailureRecord(t *testing.T) {
	p := newActorPipeline(t)
	ctx := context.Background()
	open, err := p.Open(ctx, TaskSpec{ReqID: "req", Mode: JoinOnFinish, Name: "decode 7"})
	require.NoError(t, err)
	require.True(t, p.sys.Fail(open.t, errors.New("boom")))
	var failed *FailedError
	require.ErrorAs(t, p.Err(), &failed)
	assert.Equal(t, open.ID(), failed.Task)
	assert.Equal(t, "decode 7", failed.TaskName)
	assert.Equal(t, `staging: pipeline failed at task "decode 7": boom`, failed.Error())
}

// Open refuses a name that is too long or not UTF-8 with a *TaskNameError
// (matching ErrConfig), and opens nothing.
func TestTaskNameRefused(t *testing.T) {
	p := newActorPipeline(t)
	ctx := context.Background()
	for _, name := range []string{strings.Repeat("n", MaxTaskNameBytes+1), "bad\xffname"} {
		task, err := p.Open(ctx, TaskSpec{ReqID: "req", Mode: JoinNextStep, Name: name})
		assert.Nil(t, task)
		var bad *TaskNameError
		require.ErrorAs(t, err, &bad)
		assert.Equal(t, name, bad.Name)
		require.ErrorIs(t, err, ErrConfig)
	}
	assert.Contains(t, (&TaskNameError{Name: strings.Repeat("n", MaxTaskNameBytes+1)}).Error(), "longer than 256")
	assert.Contains(t, (&TaskNameError{Name: "bad\xff"}).Error(), "not valid UTF-8")
	st := p.Stats()
	assert.Zero(t, st.Opened, "nothing was opened")
	assert.Zero(t, st.Tasks[Pending])
	task, err := p.Open(ctx, TaskSpec{ReqID: "req", Mode: JoinNextStep, Name: strings.Repeat("n", MaxTaskNameBytes)})
	require.NoError(t, err)
	assert.Equal(t, TaskID(1), task.ID(), "the refused opens took no id")
}
