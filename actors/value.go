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
	eng   *Engine
	reply *answerBox // where its allocations are answered; nil until its first
}

func (a *valueActor) Receive(ctx actor.Context) {
	var m *messages.DoTransfer
	demotion := false
	switch msg := ctx.Message().(type) {
	case *messages.DoTransfer:
		m = msg
	case *demoteTransfer:
		m, demotion = msg.DoTransfer, true
	case *actor.Stopped, *actor.Restarting:
		// This incarnation is done (a restart makes a new one).
		a.reply.remove(ctx)
		return
	default:
		return
	}
	if a.eng.hooks.PanicOnTransfer != nil && a.eng.hooks.PanicOnTransfer(m.Effect) {
		panic(fmt.Sprintf("injected value actor panic during %s (test hook)", m.Effect))
	}
	op := a.eng.ops.begin(RunningOp{Kind: transferKind(m.Effect.Kind, demotion), Value: m.Effect.Handle.Name, Location: m.Effect.Location}, true, transferKeys(m)...)
	defer a.eng.endOp(op)
	err := a.transfer(ctx, m, demotion)
	if a.eng.ops.isAbandoned() {
		return // failed already by ForceShutdown; endOp frees its buffers
	}
	ctx.Send(a.eng.Supervisor, &messages.TransferDone{Admission: m.Admission, Err: err})
}

// transferKind names a transfer for [RunningOp].
func transferKind(k budget.EffectKind, demotion bool) string {
	switch {
	case demotion:
		return "demotion copy"
	case k == budget.EffectReconstruct:
		return "load"
	case k == budget.EffectCopy:
		return "copy"
	case k == budget.EffectInitialize:
		return "initialize"
	}
	return k.String()
}

// transferKeys are the buffers a transfer writes or reads: its
// destination, its source (a copy) and its temporary (a load elsewhere).
func transferKeys(m *messages.DoTransfer) []messages.BufferKey {
	e := m.Effect
	keys := []messages.BufferKey{{Value: e.Handle.ID, Location: e.Location}}
	if e.Kind == budget.EffectCopy {
		keys = append(keys, messages.BufferKey{Value: e.Handle.ID, Location: e.From})
	}
	if e.Kind == budget.EffectReconstruct && e.TempAt != "" {
		keys = append(keys, messages.BufferKey{Value: e.Handle.ID, Location: e.TempAt, Temporary: m.Admission})
	}
	return keys
}

func (a *valueActor) allocate(ctx actor.Context, key messages.BufferKey, bytes int64) error {
	if a.eng.ops.isAbandoned() {
		return ErrAbandoned // the location actors are stopping
	}
	pid := a.eng.locations[key.Location]
	if a.reply == nil {
		a.reply = newAnswerBox(ctx)
	}
	// No timeout of our own: the location actor enforces the allocation
	// deadline and always answers (its supervision strategy answers for it
	// if it crashes). Giving up here could leave a buffer the ledger no
	// longer charges.
	ctx.RequestWithCustomSender(pid, &messages.Allocate{Key: key, Bytes: bytes}, a.reply.pid)
	switch res := (<-a.reply.ch).(type) {
	case *messages.Allocated:
		return res.Err
	default:
		return fmt.Errorf("allocation of %d bytes at %s: location actor did not answer (got %T)", bytes, key.Location, res)
	}
}

// answerBox is the address at which a value actor receives the answers to
// its allocations, one at a time: a process registered once per actor
// incarnation, instead of a future (a registration and a removal) per
// request.
type answerBox struct {
	pid *actor.PID
	ch  chan any
}

func newAnswerBox(ctx actor.Context) *answerBox {
	b := &answerBox{ch: make(chan any, 1)}
	reg := ctx.ActorSystem().ProcessRegistry
	b.pid, _ = reg.Add(b, "value-reply$"+reg.NextId())
	return b
}

// remove unregisters the box (nil: none was made).
func (b *answerBox) remove(ctx actor.Context) {
	if b != nil {
		ctx.ActorSystem().ProcessRegistry.Remove(b.pid)
	}
}

// SendUserMessage delivers the answer to the one request outstanding.
// It never blocks the sender: an answer with none outstanding (there is
// none: every request waits for its answer) would be dropped.
func (b *answerBox) SendUserMessage(_ *actor.PID, m any) {
	select {
	case b.ch <- actor.UnwrapEnvelopeMessage(m):
	default:
	}
}

func (b *answerBox) SendSystemMessage(*actor.PID, any) {}
func (b *answerBox) Stop(*actor.PID)                   {}

func (a *valueActor) free(ctx actor.Context, key messages.BufferKey) {
	if a.eng.ops.isAbandoned() {
		return // endOp frees the operation's buffers itself
	}
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
	opctx, cancel := context.WithCancel(a.eng.opsCtx)
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
