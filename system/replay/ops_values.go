package replay

import (
	"context"
	"errors"
	"fmt"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/internal/jsonline"
	"github.com/residency-go/residency/system"
)

// The ops on values and their copies, reservations, observation (snapshot,
// trace) and fault injection: one parse and one exec function per op (the
// table is in ops.go).

func parseStart(o *Op, f *jsonline.Fields) {
	o.locations = readLocations(f, "locations")
	o.spill = readSpill(f, "spill")
	o.trace = f.OptInt("trace")
	o.stateLimit = f.OptInt("search_state_limit")
	if o.trace != nil && *o.trace < 0 {
		f.Fail(fmt.Errorf("field \"trace\": the trace capacity must be ≥ 0 (0 disables the trace)"))
	}
	if o.stateLimit != nil && *o.stateLimit < 0 {
		f.Fail(fmt.Errorf("field \"search_state_limit\": must be ≥ 0 (0 means the default)"))
	}
}

func parseRegister(o *Op, f *jsonline.Fields) {
	o.handle = f.Str("handle")
	o.bytes = f.Bytes("bytes")
	o.replica, _ = f.OptStr("replica")
	at, hasAt := f.OptStr("at")
	src, hasSrc := f.OptStr("source")
	switch {
	case hasAt && hasSrc:
		f.Fail(fmt.Errorf("give either \"at\" (resident at registration) or \"source\" (reconstructible), not both"))
	case !hasAt && !hasSrc:
		f.Fail(fmt.Errorf("needs \"at\" (resident at registration) or \"source\" (reconstructible)"))
	}
	o.at, o.source = at, src
}

func parseHandle(o *Op, f *jsonline.Fields) { o.handle = f.Str("handle") }

func parseHandleAt(o *Op, f *jsonline.Fields) {
	o.handle, o.location = f.Str("handle"), f.Str("location")
}

func parseHandleFromTo(o *Op, f *jsonline.Fields) {
	o.handle, o.from, o.to = f.Str("handle"), f.Str("from"), f.Str("to")
}

func parseReserve(o *Op, f *jsonline.Fields) {
	o.location, o.bytes, o.resName = f.Str("location"), f.Bytes("bytes"), f.Str("name")
}

func parseUnreserve(o *Op, f *jsonline.Fields) { o.resName = f.Str("name") }

func parseFailNext(o *Op, f *jsonline.Fields) {
	o.kind, o.location = f.Str("kind"), f.Str("location")
}

func (r *Runner) execRegister(ctx context.Context, o Op, _ *Result) (bool, error) {
	var mode system.ReplicaMode
	switch o.replica {
	case "", "exclusive":
		mode = system.Exclusive
	case "replicable":
		mode = system.Replicable
	default:
		// The replica mode is a field after the name and bytes: the
		// runtime checks them in order. When they pass, it would refuse
		// the mode and change nothing, so the replay says so itself, in
		// the script's words; otherwise the runtime reports the first
		// problem (and changes nothing).
		first, err := r.nameAndBytesPass(ctx, o)
		if err != nil {
			return false, err
		}
		if first {
			return false, invalid("value %q: unknown replica mode %q (use exclusive or replicable)", o.handle, o.replica)
		}
		mode = system.ReplicaMode(-1)
	}
	v := system.Value{Name: o.handle, Bytes: o.bytes, Mode: mode, At: o.at, Source: o.source}
	if o.source != "" {
		v.Loader = Loader(o.handle)
	} else if o.bytes > 0 && o.bytes <= BufferLimit {
		// Values up to the replay's buffer limit start with their
		// deterministic bytes; larger ones start zero-filled, so that a
		// replay never holds more than BufferLimit of real memory per
		// buffer (the data of a registration included).
		v.Data = make([]byte, o.bytes)
		Fill(o.handle, 0, v.Data)
	}
	h, err := r.sys.Register(ctx, v)
	if err != nil {
		return true, err
	}
	r.handles[o.handle] = h
	return true, nil
}

// nameAndBytesPass reports whether a registration's fields before its
// replica mode pass the runtime's checks: a name that is not empty and
// not a live value's, and positive bytes.
func (r *Runner) nameAndBytesPass(ctx context.Context, o Op) (bool, error) {
	if o.handle == "" || o.bytes <= 0 {
		return false, nil
	}
	_, err := r.sys.Lookup(ctx, o.handle)
	var ie *system.InvalidInputError
	switch {
	case err == nil:
		return false, nil // a duplicate name
	case errors.As(err, &ie):
		return true, nil // no live value has the name
	}
	return false, err
}

func (r *Runner) execPlace(ctx context.Context, o Op, _ *Result) (bool, error) {
	h, err := r.handle(o.handle)
	if err != nil {
		return false, err
	}
	return true, r.sys.Place(ctx, h, o.location)
}

func (r *Runner) execEvict(ctx context.Context, o Op, _ *Result) (bool, error) {
	h, err := r.handle(o.handle)
	if err != nil {
		return false, err
	}
	return true, r.sys.Evict(ctx, h, o.location)
}

func (r *Runner) execCopy(ctx context.Context, o Op, _ *Result) (bool, error) {
	h, err := r.handle(o.handle)
	if err != nil {
		return false, err
	}
	return true, r.sys.Copy(ctx, h, o.from, o.to)
}

func (r *Runner) execMove(ctx context.Context, o Op, _ *Result) (bool, error) {
	h, err := r.handle(o.handle)
	if err != nil {
		return false, err
	}
	return true, r.sys.Move(ctx, h, o.from, o.to)
}

func (r *Runner) execDiscard(ctx context.Context, o Op, _ *Result) (bool, error) {
	h, err := r.handle(o.handle)
	if err != nil {
		return false, err
	}
	if err := r.sys.Discard(ctx, h); err != nil {
		return true, err
	}
	r.finishHandle(o.handle, uint64(h.ID))
	return true, nil
}

func (r *Runner) execReserve(ctx context.Context, o Op, _ *Result) (bool, error) {
	return true, r.sys.Reserve(ctx, o.location, o.resName, o.bytes)
}

func (r *Runner) execUnreserve(ctx context.Context, o Op, _ *Result) (bool, error) {
	name := o.resName
	if err := r.scopeReservation(name); err != nil {
		// The runtime would refuse it and change nothing: a scope's
		// reservation is released when the scope exits.
		return false, err
	}
	return true, r.sys.Unreserve(ctx, name)
}

func (r *Runner) execSnapshot(ctx context.Context, _ Op, res *Result) (bool, error) {
	s, err := r.sys.Snapshot(ctx)
	if err != nil {
		return true, err
	}
	res.Snapshot = r.Snapshot(s)
	return true, nil
}

func (r *Runner) execTrace(ctx context.Context, _ Op, res *Result) (bool, error) {
	t, err := r.sys.Trace(ctx)
	if err != nil {
		return true, err
	}
	ts := r.Transitions(t)
	res.Trace = &ts
	return true, nil
}

func (r *Runner) execFailNext(_ context.Context, o Op, _ *Result) (bool, error) {
	kind, err := cuda.ParseFaultKind(o.kind)
	if err != nil {
		return false, invalid("unknown fault kind %q (use alloc, copy or reconstruct)", o.kind)
	}
	if _, err := cuda.ParseLocationName(o.location); err != nil {
		return false, invalid("malformed location %q", o.location)
	}
	if !r.locations[o.location] {
		return false, &system.UnavailableError{Location: o.location, Detail: "location is not configured", Reason: system.UnavailableLocation}
	}
	faultsOf(r.sys).Arm(kind, o.location)
	return false, nil
}
