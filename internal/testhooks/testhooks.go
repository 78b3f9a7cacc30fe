// Package testhooks holds the knobs the project's own tests set to inject
// failures into the actors of a runtime: a panic of a value or location
// actor, a panic after the ledger handled a request.
//
// No user of the module can reach them: the package is internal, and
// system.Options carries its knobs in an unexported field. A test outside
// package system sets that field with [With], through the setter package
// system installs with [Install] when it is initialised; system.Start hands
// the knobs to the actors (actors.Config.Knobs), so they affect only the
// runtime started with those options.
package testhooks

import (
	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/messages"
)

// Knobs inject failures in tests. Nil knobs do nothing.
type Knobs struct {
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

// setter returns a copy of opts (a system.Options) carrying k.
var setter func(opts any, k Knobs) any

// Install makes f the setter [With] uses. Package system calls it once,
// from its init, with a function that sets the unexported knobs field of a
// system.Options.
func Install(f func(opts any, k Knobs) any) { setter = f }

// With returns a copy of opts, a system.Options, that carries k. It panics
// if package system is not linked in or opts is of another type.
func With[O any](opts O, k Knobs) O {
	if setter == nil {
		panic("testhooks: no setter installed (package system is not linked in)")
	}
	return setter(opts, k).(O)
}
