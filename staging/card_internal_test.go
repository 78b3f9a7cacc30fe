package staging

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Each write task is an actor: with N tasks open the pipeline's actor has
// N live task children, named after their tasks; a task's actor stops once
// the task is terminal (written or failed).
func TestCardEachOpenTaskIsAChildActorOfThePipeline(t *testing.T) {
	p := newActorPipeline(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 5
	var tasks []*Task
	for i := range n {
		task, err := p.Open(ctx, TaskSpec{ReqID: "req", WriteN: i, Mode: JoinNextStep})
		require.NoError(t, err)
		tasks = append(tasks, task)
		assert.Equal(t, "pipeline/task-"+itoa(uint64(task.ID())), task.t.pid.Id, "a child of the pipeline's actor, named after the task")
	}
	assert.Equal(t, n, p.sys.liveTasks())

	// Eager: Submit runs the copy stage and the pool write inline.
	require.NoError(t, p.Submit(ctx, tasks[0], tasks[1], tasks[2]))
	for _, task := range tasks[:3] {
		assert.True(t, task.State().Terminal())
	}
	got, err := p.sys.awaitLiveTasks(ctx, n-3)
	require.NoError(t, err)
	assert.Equal(t, n-3, got, "the written tasks' actors stopped")

	// A failure (here the pipeline's first, which fails the tasks still
	// pending too) stops the failed tasks' actors.
	require.True(t, p.sys.Fail(tasks[3].t, assert.AnError))
	got, err = p.sys.awaitLiveTasks(ctx, 0)
	require.NoError(t, err)
	assert.Zero(t, got)
	assert.Equal(t, Failed, tasks[4].State())
}
