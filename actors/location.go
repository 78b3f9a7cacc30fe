package actors

import (
	"context"
	"fmt"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/residency-go/residency/messages"
)

// locationActor carries out the physical allocations and frees of one
// location, one message at a time. Because the supervisor sends a free to
// this actor when it commits a removal — before it admits anything that
// could reuse those bytes — the free is always processed before any later
// allocation here: the device never holds more than the ledger admitted.
type locationActor struct {
	eng *Engine
	loc string
}

func (a *locationActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *messages.Allocate:
		ctx.Respond(&messages.Allocated{Key: m.Key, Err: a.allocate(m)})
	case *messages.Free:
		a.free(m.Key)
	case *messages.Drain:
		ctx.Respond(&messages.Drained{})
	}
}

func (a *locationActor) allocate(m *messages.Allocate) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("location actor %s: allocation panicked: %v", a.loc, r)
		}
	}()
	if a.eng.hooks.PanicOnAllocate != nil && a.eng.hooks.PanicOnAllocate(m.Key) {
		panic("injected allocation panic (test hook)")
	}
	if _, exists := a.eng.Buffers.Get(m.Key); exists {
		return fmt.Errorf("location actor %s: buffer %v already allocated", a.loc, m.Key)
	}
	buf, err := a.eng.backend.Allocate(context.Background(), a.loc, m.Bytes)
	if err != nil {
		return err
	}
	a.eng.Buffers.put(m.Key, buf)
	return nil
}

func (a *locationActor) free(key messages.BufferKey) {
	buf, ok := a.eng.Buffers.take(key)
	if !ok {
		return // never allocated (a failed transfer) or already freed
	}
	if err := a.eng.backend.Free(buf); err != nil {
		a.eng.log.Error().Err(err).Str("location", a.loc).Uint64("value", key.Value).Msg("free failed")
	}
}
