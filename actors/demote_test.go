package actors

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/messages"
)

// fakeCopier is a DemotionCopier that records what it is handed and
// copies through the backend (served), declines, or fails.
type fakeCopier struct {
	be      cuda.Backend
	decline bool
	fail    error
	mu      sync.Mutex
	seen    []Demotion
}

func (c *fakeCopier) CopyDemotion(ctx context.Context, d Demotion) (bool, error) {
	c.mu.Lock()
	c.seen = append(c.seen, Demotion{Value: d.Value, From: d.From, To: d.To, Bytes: d.Bytes})
	c.mu.Unlock()
	if c.decline {
		return false, nil
	}
	if c.fail != nil {
		return true, c.fail
	}
	b, err := c.be.Read(ctx, d.Src)
	if err != nil {
		return true, err
	}
	return true, c.be.Write(ctx, d.Dst, b)
}

func (c *fakeCopier) calls() []Demotion {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Demotion(nil), c.seen...)
}

// execute runs plan and returns its reply.
func (h *harness) execute(p budget.Plan) *messages.RunReply {
	h.t.Helper()
	rep, _ := h.ask(func(to *actor.PID) any { return &messages.Execute{Plan: p, ReplyTo: to} })
	rr, ok := rep.(*messages.RunReply)
	require.True(h.t, ok, "Execute answered %T", rep)
	return rr
}

// demotionFixture registers v (exclusive, 4 KiB) at the host and moves
// it to cuda:0; the demotion plan moves it on to cuda:1.
func demotionFixture(h *harness) (budget.Handle, []byte, budget.Plan) {
	h.t.Helper()
	data := testPattern(21, 4<<10)
	v := h.mustRegister(budget.ValueSpec{Name: "v", Bytes: int64(len(data)), Mode: budget.Exclusive, At: locHost}, data)
	require.NoError(h.t, h.transition(messages.Move, v, locHost, locGPU0).Err)
	return v, data, budget.Plan{Reclaim: []budget.Action{{Handle: v, Location: locGPU0, To: locGPU1}}}
}

func TestDemotionGoesThroughTheCopierServingItsRoute(t *testing.T) {
	h := startEngine(t)
	c := &fakeCopier{be: h.be}
	stop, err := h.eng.ServeDemotions(locGPU0, locGPU1, c)
	require.NoError(t, err)
	defer stop()
	v, data, plan := demotionFixture(h)

	require.NoError(t, h.execute(plan).Err)
	assert.Equal(t, []Demotion{{Value: "v", From: locGPU0, To: locGPU1, Bytes: int64(len(data))}}, c.calls())
	assert.Equal(t, data, h.read(v, locGPU1), "bytes intact at the target")
	h.drain(locGPU0)
	assert.Zero(t, h.used(locGPU0), "the source is freed once the demotion completes")
	assert.Equal(t, int64(len(data)), h.locRecord(locGPU1).UsedBytes, "charged once, at the target")
	assert.Zero(t, h.locRecord(locGPU0).UsedBytes)
}

// Only demotions are handed over: a plain move on the same route, and a
// demotion on a route nobody serves, are the value actor's own copies.
func TestDemotionCopierServesOnlyDemotionsOnItsRoute(t *testing.T) {
	h := startEngine(t)
	c := &fakeCopier{be: h.be}
	stop, err := h.eng.ServeDemotions(locGPU1, locGPU0, c) // the other direction
	require.NoError(t, err)
	defer stop()
	v, data, plan := demotionFixture(h)
	require.NoError(t, h.execute(plan).Err)
	assert.Equal(t, data, h.read(v, locGPU1))
	require.NoError(t, h.transition(messages.Move, v, locGPU1, locGPU0).Err, "a move on the served route")
	assert.Equal(t, data, h.read(v, locGPU0))
	assert.Empty(t, c.calls())
}

func TestDemotionDeclinedByTheCopierFallsBackToTheMove(t *testing.T) {
	h := startEngine(t)
	c := &fakeCopier{be: h.be, decline: true}
	stop, err := h.eng.ServeDemotions(locGPU0, locGPU1, c)
	require.NoError(t, err)
	defer stop()
	v, data, plan := demotionFixture(h)
	require.NoError(t, h.execute(plan).Err)
	assert.Len(t, c.calls(), 1, "asked, and declined")
	assert.Equal(t, data, h.read(v, locGPU1), "the value actor copied")
}

// A copy the copier fails drops the value (budget.Run.FailStep): nothing
// at the target, its buffer freed, the source removed, the run goes on.
func TestDemotionFailedByTheCopierDropsTheValue(t *testing.T) {
	h := startEngine(t)
	c := &fakeCopier{be: h.be, fail: errors.New("injected demotion copy failure")}
	stop, err := h.eng.ServeDemotions(locGPU0, locGPU1, c)
	require.NoError(t, err)
	defer stop()
	data := testPattern(5, 1<<10)
	v := h.mustRegister(budget.ValueSpec{Name: "v", Bytes: int64(len(data)), Mode: budget.Replicable, At: locHost}, data)
	require.NoError(t, h.transition(messages.Copy, v, locHost, locGPU0).Err)

	rep := h.execute(budget.Plan{Reclaim: []budget.Action{{Handle: v, Location: locGPU0, To: locGPU1}}})
	require.NoError(t, rep.Err, "a failed demotion does not fail the run")
	assert.Len(t, c.calls(), 1)
	h.drain(locGPU0, locGPU1)
	for _, loc := range []string{locGPU0, locGPU1} {
		assert.Zero(t, h.used(loc), "device bytes at %s", loc)
		assert.Zero(t, h.locRecord(loc).UsedBytes, "ledger bytes at %s", loc)
		_, ok := h.eng.Buffers.Get(messages.BufferKey{Value: v.ID, Location: loc})
		assert.False(t, ok, "no buffer at %s", loc)
	}
	assert.Equal(t, data, h.read(v, locHost), "the other copy is untouched")
}

func TestServeDemotionsValidatesAndStops(t *testing.T) {
	h := startEngine(t)
	c := &fakeCopier{be: h.be}
	for name, route := range map[string][2]string{
		"unknown from": {"cuda:7", locGPU1},
		"unknown to":   {locGPU0, "pinned-host"},
		"same":         {locGPU0, locGPU0},
	} {
		_, err := h.eng.ServeDemotions(route[0], route[1], c)
		var ie *budget.InvalidInputError
		assert.ErrorAs(t, err, &ie, name)
	}
	_, err := h.eng.ServeDemotions(locGPU0, locGPU1, nil)
	var ie *budget.InvalidInputError
	assert.ErrorAs(t, err, &ie, "nil copier")

	// Two copiers on one route: the earlier serves until it stops.
	first, second := &fakeCopier{be: h.be}, &fakeCopier{be: h.be}
	stop1, err := h.eng.ServeDemotions(locGPU0, locGPU1, first)
	require.NoError(t, err)
	stop2, err := h.eng.ServeDemotions(locGPU0, locGPU1, second)
	require.NoError(t, err)
	defer stop2()
	assert.Same(t, first, h.eng.demoters.copier(locGPU0, locGPU1))
	stop1()
	stop1() // idempotent: does not remove the second
	assert.Same(t, second, h.eng.demoters.copier(locGPU0, locGPU1))
	stop2()
	assert.Nil(t, h.eng.demoters.copier(locGPU0, locGPU1))
}

// A value actor that crashes while carrying out a demotion's copy fails
// that transfer like any other: the demotion drops the value, the target's
// buffer is freed, and the run goes on.
func TestDemotionValueActorCrashDropsTheValue(t *testing.T) {
	h := startEngine(t, withHooks(Hooks{PanicOnTransfer: func(e budget.Effect) bool { return e.Location == locGPU1 }}))
	data := testPattern(6, 1<<10)
	v := h.mustRegister(budget.ValueSpec{Name: "v", Bytes: int64(len(data)), Mode: budget.Replicable, At: locHost}, data)
	require.NoError(t, h.transition(messages.Copy, v, locHost, locGPU0).Err)
	require.NoError(t, h.execute(budget.Plan{Reclaim: []budget.Action{{Handle: v, Location: locGPU0, To: locGPU1}}}).Err)
	h.drain(locGPU0, locGPU1)
	for _, loc := range []string{locGPU0, locGPU1} {
		assert.Zero(t, h.used(loc), "device bytes at %s", loc)
		assert.Zero(t, h.locRecord(loc).UsedBytes, "ledger bytes at %s", loc)
	}
	assert.Equal(t, data, h.read(v, locHost))
}
