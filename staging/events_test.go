package staging_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/staging"
)

// reportingRuntime is a ledger runtime that takes failure reports, as
// *system.System does.
type reportingRuntime struct {
	*ledgerRuntime
	mu      sync.Mutex
	reports []string
	tasks   []uint64
}

func (r *reportingRuntime) ReportStagingFailure(pipeline, device string, task uint64, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reports = append(r.reports, pipeline+"@"+device)
	r.tasks = append(r.tasks, task)
}

// A pipeline's failure is reported to a runtime that takes reports, once.
func TestPipelineFailureReported(t *testing.T) {
	cfg := baseConfig()
	cfg.Name = "ckpt"
	rt := &reportingRuntime{ledgerRuntime: newRuntime(t, 0, soft.Config{})}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	p, err := staging.New(ctx, rt, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	f := &fixture{t: t, rt: rt.ledgerRuntime, p: p, cfg: cfg, ctx: ctx}

	freeze := newGate()
	f.rt.be.Faults().Arm(cuda.FaultCopy, "pinned-host")
	step, task := f.stepTask(fill(1, rowBytes), freeze, "k", 0)
	require.NoError(t, f.p.Submit(f.ctx, task))
	freeze.open()
	var inj *cuda.InjectedFaultError
	require.ErrorAs(t, task.Wait(f.ctx), &inj)
	require.NoError(t, step.Release())

	rt.mu.Lock()
	defer rt.mu.Unlock()
	assert.Equal(t, []string{"ckpt@cuda:0"}, rt.reports)
	assert.Equal(t, []uint64{uint64(task.ID())}, rt.tasks)
}
