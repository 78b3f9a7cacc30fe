package actors

import (
	"context"
	"fmt"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/messages"
)

// valueActor carries out the transfers of one value (initialization,
// copies, reconstruction through the value's loader), one at a time in
// the order the supervisor admitted them. The supervisor gives a value an
// actor with its first transfer in flight and takes it back when the last
// one has settled (it then waits idle for another value, or is stopped:
// see supervisor.transferSettled). It holds no accounting and no state of
// its value: it only does what the supervisor admitted and reports the
// outcome.
type valueActor struct {
	eng *Engine
}

func (a *valueActor) Receive(ctx actor.Context) {
	var m *messages.DoTransfer
	demotion := false
	switch msg := ctx.Message().(type) {
	case *messages.DoTransfer:
		m = msg
	case *demoteTransfer:
		m, demotion = msg.DoTransfer, true
	default:
		return
	}
	if a.eng.hooks.PanicOnTransfer != nil && a.eng.hooks.PanicOnTransfer(m.Effect) {
		panic(fmt.Sprintf("injected value actor panic during %s (test hook)", m.Effect))
	}
	err := a.transfer(ctx, m, demotion)
	ctx.Send(a.eng.Supervisor, &messages.TransferDone{Admission: m.Admission, Err: err})
}

func (a *valueActor) allocate(ctx actor.Context, key messages.BufferKey, bytes int64) error {
	pid := a.eng.locations[key.Location]
	// No timeout of our own: the location actor enforces the allocation
	// deadline and always answers (its supervision strategy answers for it
	// if it crashes). Giving up here could leave a buffer the ledger no
	// longer charges.
	res, err := ctx.RequestFuture(pid, &messages.Allocate{Key: key, Bytes: bytes}, -1).Result()
	if err != nil {
		return fmt.Errorf("allocation of %d bytes at %s: location actor did not answer: %w", bytes, key.Location, err)
	}
	return res.(*messages.Allocated).Err
}

func (a *valueActor) free(ctx actor.Context, key messages.BufferKey) {
	ctx.Send(a.eng.locations[key.Location], &messages.Free{Key: key})
}

// transfer runs one transfer effect (demotion: the copy of a demotion
// step, see demoteCopy). On failure every buffer it allocated is freed
// again; the destination's ledger charge is released by the supervisor
// when it commits the failure.
func (a *valueActor) transfer(ctx actor.Context, m *messages.DoTransfer, demotion bool) (err error) {
	e := m.Effect
	dst := messages.BufferKey{Value: e.Handle.ID, Location: e.Location}
	if err := a.allocate(ctx, dst, e.Bytes); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			a.free(ctx, dst)
		}
	}()
	dbuf, _ := a.eng.Buffers.Get(dst)
	opctx, cancel := context.WithCancel(a.eng.ctx)
	defer cancel()
	switch e.Kind {
	case budget.EffectInitialize:
		if m.Data == nil {
			return nil // the buffer keeps its fresh contents (zero on the soft backend)
		}
		return a.eng.backend.Write(opctx, dbuf, m.Data)
	case budget.EffectCopy:
		sbuf, ok := a.eng.Buffers.Get(messages.BufferKey{Value: e.Handle.ID, Location: e.From})
		if !ok {
			return fmt.Errorf("copy of %s: no buffer at %s", e.Handle.Name, e.From)
		}
		if demotion {
			return a.demoteCopy(opctx, e, dbuf, sbuf)
		}
		return a.copy(opctx, dbuf, sbuf)
	case budget.EffectReconstruct:
		loader, ok := a.eng.loaders.get(e.Handle.ID)
		if !ok {
			return fmt.Errorf("reconstruct %s: no loader registered", e.Handle.Name)
		}
		if e.TempAt == "" {
			return a.eng.backend.Load(opctx, dbuf, e.Location, loader)
		}
		tmp := messages.BufferKey{Value: e.Handle.ID, Location: e.TempAt, Temporary: m.Admission}
		if err := a.allocate(ctx, tmp, e.Bytes); err != nil {
			return err
		}
		defer a.free(ctx, tmp)
		tbuf, _ := a.eng.Buffers.Get(tmp)
		if err := a.eng.backend.Load(opctx, tbuf, e.Location, loader); err != nil {
			return err
		}
		return a.copy(opctx, dbuf, tbuf)
	}
	return fmt.Errorf("value actor: unexpected effect %s", e.Kind)
}

// copy enqueues dst←src on the destination location's stream, records an
// event after it and waits for that event.
func (a *valueActor) copy(ctx context.Context, dst, src cuda.Buffer) error {
	ev, err := a.eng.streams[dst.Location()].copyAndRecord(dst, src)
	if err != nil {
		return err
	}
	if err := ev.Wait(ctx); err != nil {
		return err
	}
	return ev.Err()
}
