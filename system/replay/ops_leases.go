package replay

import (
	"context"

	"github.com/residency-go/residency/internal/jsonline"
	"github.com/residency-go/residency/system"
)

// The ops on leases, holds and CUDA events: one parse and one exec
// function per op (the table is in ops.go).

func parseHandleAtAs(o *Op, f *jsonline.Fields) {
	o.handle, o.location, o.as = f.Str("handle"), f.Str("location"), f.Str("as")
}

func parseLease(o *Op, f *jsonline.Fields) { o.lease = f.Str("lease") }

func parseRecordEvent(o *Op, f *jsonline.Fields) {
	o.lease, o.event = f.Str("lease"), f.Str("event")
}

func parseEvent(o *Op, f *jsonline.Fields) { o.event = f.Str("event") }

func parseHold(o *Op, f *jsonline.Fields) { o.hold = f.Str("hold") }

// bindCheck refuses an empty or duplicate name for acquire and hold
// (fields: handle, location, as; the name binds only on success), after
// the fields before it, which the runtime checks first.
func (r *Runner) bindCheck(ctx context.Context, h system.Handle, o Op, kind string, dup bool) error {
	if o.as != "" && !dup {
		return nil
	}
	if err := r.endpointFieldError(ctx, h, o.location); err != nil {
		return err
	}
	if o.as == "" {
		return invalid("a %s name must not be empty", kind)
	}
	return invalid("duplicate %s name %q", kind, o.as)
}

func (r *Runner) execAcquire(ctx context.Context, o Op, _ *Result) (bool, error) {
	h, err := r.handle(o.handle)
	if err != nil {
		return false, err
	}
	_, dup := r.leases[o.as]
	if err := r.bindCheck(ctx, h, o, "lease", dup); err != nil {
		return true, err
	}
	l, err := r.sys.Acquire(ctx, h, o.location)
	if err != nil {
		return true, err
	}
	r.leases[o.as] = &leaseEntry{lease: l}
	r.leaseNames[uint64(l.ID())] = scriptName{kind: "lease", name: o.as}
	return true, nil
}

func (r *Runner) execHold(ctx context.Context, o Op, _ *Result) (bool, error) {
	h, err := r.handle(o.handle)
	if err != nil {
		return false, err
	}
	_, dup := r.holds[o.as]
	if err := r.bindCheck(ctx, h, o, "hold", dup); err != nil {
		return true, err
	}
	hd, err := r.sys.Hold(ctx, h, o.location)
	if err != nil {
		return true, err
	}
	r.holds[o.as] = &holdEntry{hold: hd}
	r.holdNames[uint64(hd.ID())] = scriptName{kind: "hold", name: o.as}
	return true, nil
}

func (r *Runner) execRelease(ctx context.Context, o Op, _ *Result) (bool, error) {
	e, ok := r.leases[o.lease]
	switch {
	case !ok:
		return false, r.unknownLease(o.lease)
	case e.released:
		return false, invalid("lease %q was already released", o.lease)
	}
	if err := e.lease.Release(ctx); err != nil {
		return true, err
	}
	e.released = true
	r.finishLease(o.lease, e)
	return true, nil
}

func (r *Runner) execRecordEvent(ctx context.Context, o Op, _ *Result) (bool, error) {
	e, ok := r.leases[o.lease]
	switch {
	case !ok:
		return false, invalid("unknown lease %q", o.lease)
	case e.released:
		return false, invalid("cannot record an event on lease %q: it was released", o.lease)
	}
	if _, dup := r.events[o.event]; dup {
		return false, invalid("duplicate event name %q", o.event)
	}
	ev := system.NewManualEvent()
	id, err := e.lease.RecordEvent(ctx, ev)
	if err != nil {
		return true, err
	}
	e.pending++
	r.events[o.event] = &scriptEvent{ev: ev, id: id, lease: e}
	r.eventNames[uint64(id)] = scriptName{kind: "event", name: o.event}
	return true, nil
}

func (r *Runner) execCompleteEvent(ctx context.Context, o Op, _ *Result) (bool, error) {
	e, ok := r.events[o.event]
	if !ok {
		return false, invalid("unknown event %q", o.event)
	}
	if e.completed {
		return false, invalid("event %q was already completed", o.event)
	}
	e.completed = true
	e.ev.Complete()
	r.finishEvent(o.event, e)
	return true, r.sys.WaitReaped(ctx, e.id)
}

func (r *Runner) execUnhold(ctx context.Context, o Op, _ *Result) (bool, error) {
	e, ok := r.holds[o.hold]
	switch {
	case !ok:
		return false, invalid("unknown hold %q", o.hold)
	case e.released:
		return false, invalid("hold %q was already released", o.hold)
	}
	if err := e.hold.Release(ctx); err != nil {
		return true, err
	}
	e.released = true
	r.finishHold(o.hold, e)
	return true, nil
}
