// Package testhooks lets the project's own tests inject failures into the
// actors of a runtime: a panic of a value or location actor, a panic after
// the ledger handled a request. No user of the module can import it; the
// public API (system.Options) carries no test hook.
//
// A test puts its hooks in the context it passes to system.Start (or
// system.StartNode) with [With]; Start hands [From] of that context to the
// actors (actors.Config.Hooks). Nothing else reads the context's hooks, so
// a hook affects only the runtime started with it.
package testhooks

import (
	"context"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/messages"
)

// Hooks inject failures in tests. Nil hooks do nothing.
type Hooks struct {
	// PanicOnTransfer makes the value actor panic before carrying out an
	// effect for which it returns true.
	PanicOnTransfer func(budget.Effect) bool
	// PanicOnAllocate makes the location actor panic while allocating a
	// key; its supervision strategy answers the allocation with an error
	// and restarts it.
	PanicOnAllocate func(messages.BufferKey) bool
	// AfterLedger is called by the supervisor after the ledger handled a
	// request and before the reply is sent, with the request's kind (the
	// message type's name: "Acquire", "Register", "Transition", …). A
	// panic in it stands for a ledger invariant panic: the change is
	// applied, the caller has no reply yet, and the supervisor must stop
	// the runtime with a [*actors.FatalError].
	AfterLedger func(request string)
}

type ctxKey struct{}

// With returns a copy of ctx that carries h, for system.Start.
func With(ctx context.Context, h Hooks) context.Context {
	return context.WithValue(ctx, ctxKey{}, h)
}

// From returns the hooks ctx carries, or no hooks.
func From(ctx context.Context) Hooks {
	h, _ := ctx.Value(ctxKey{}).(Hooks)
	return h
}
