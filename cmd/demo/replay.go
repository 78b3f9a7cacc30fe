package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"time"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/system"
)

// replayManagerID is the manager id of every replay runtime, so that the
// output of a script is the same on every run.
const replayManagerID = "replay"

// opTimeout bounds one op: a runtime that stops answering fails the op
// (type "Error") instead of hanging a user's CI.
const opTimeout = time.Minute

// replayMain implements `demo replay [--json] FILE`.
func replayMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print one JSON object per op instead of a table")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: demo replay [--json] FILE   (FILE may be - for standard input)")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return 2
	}
	path := fs.Arg(0)
	var in io.Reader
	if path == "-" {
		in = os.Stdin
	} else {
		f, err := os.Open(path)
		if err != nil {
			fmt.Fprintf(stderr, "demo replay: %v\n", err)
			return 2
		}
		defer f.Close()
		in = f
	}
	ops, err := parseScript(in)
	if err != nil {
		fmt.Fprintf(stderr, "demo replay: %s: %v\n", path, err)
		return 2
	}
	var out resultWriter
	if *asJSON {
		out = &jsonWriter{w: stdout}
	} else {
		out = newTableWriter(stdout)
	}
	return replay(ctx, path, ops, out, stderr)
}

// replay runs a validated script against a fresh runtime, writing one
// result per op. It returns the exit status: 0 when every expectation
// held, 1 otherwise, 2 when the runtime refused the start op.
func replay(ctx context.Context, path string, ops []op, out resultWriter, stderr io.Writer) int {
	start := ops[0]
	opts := system.Options{ManagerID: replayManagerID}
	for _, l := range start.locations {
		if l.hasBudget {
			opts.Locations = append(opts.Locations, system.Limit(l.name, l.budget))
		} else {
			opts.Locations = append(opts.Locations, system.NoLimit(l.name))
		}
	}
	if start.trace != nil {
		if *start.trace == 0 {
			opts.DisableTrace = true
		} else {
			opts.TraceCapacity = int(*start.trace)
		}
	}
	if start.stateLimit != nil {
		opts.StateLimit = int(*start.stateLimit)
	}
	names := make([]string, len(start.locations))
	for i, l := range start.locations {
		names[i] = l.name
	}
	backend, err := newReplayBackend(names)
	if err != nil {
		fmt.Fprintf(stderr, "demo replay: %s: line %d: bad start: %v\n", path, start.line, err)
		return 2
	}
	defer backend.Close()
	opts.Backend = backend
	sys, err := system.Start(ctx, opts)
	if err != nil {
		fmt.Fprintf(stderr, "demo replay: %s: line %d: bad start: %v\n", path, start.line, err)
		return 2
	}
	r := newRunner(sys, start.locations)
	failed := 0
	for i, o := range ops {
		var res result
		if i == 0 {
			res = result{Line: o.line, Op: o.name, OK: true}
			res.StateVersion = r.version(ctx)
		} else {
			res = r.run(ctx, o)
		}
		if o.expect != "" {
			res.expectation = o.expect
			if !matches(o.expect, &res) {
				failed++
				got := "ok"
				if !res.OK {
					got = res.Error.Type + ": " + res.Error.Message
				}
				fmt.Fprintf(stderr, "demo replay: %s: line %d: %s: expected %s, got %s\n", path, o.line, o.name, o.expect, got)
			}
		}
		if err := out.write(&res); err != nil {
			fmt.Fprintf(stderr, "demo replay: writing output: %v\n", err)
			_ = sys.Close(context.Background())
			return 1
		}
	}
	if err := out.flush(); err != nil {
		fmt.Fprintf(stderr, "demo replay: writing output: %v\n", err)
		failed++
	}
	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
	defer cancel()
	if err := sys.Close(closeCtx); err != nil {
		var oe *system.OutstandingError
		if errors.As(err, &oe) {
			// Scripts may end with leases or holds still taken; Close
			// releases them. Say so, but it is not a failure.
			fmt.Fprintf(stderr, "demo replay: note: %v\n", err)
		} else {
			fmt.Fprintf(stderr, "demo replay: closing the runtime: %v\n", err)
			failed++
		}
	}
	if failed > 0 {
		fmt.Fprintf(stderr, "demo replay: %s: %d failed expectation(s)\n", path, failed)
		return 1
	}
	return 0
}

// runner holds a replay's runtime and the script-level names.
type runner struct {
	sys       *system.System
	locations map[string]bool
	handles   map[string]system.Handle
	leases    map[string]*system.Lease
	holds     map[string]*system.Hold
	events    map[string]*scriptEvent
	decisions map[string]system.Decision
	scopes    map[string]*system.Scope
}

type scriptEvent struct {
	ev        *system.ManualEvent
	id        system.EventID
	completed bool
}

func newRunner(sys *system.System, locs []locationSpec) *runner {
	r := &runner{
		sys: sys, locations: map[string]bool{},
		handles: map[string]system.Handle{}, leases: map[string]*system.Lease{},
		holds: map[string]*system.Hold{}, events: map[string]*scriptEvent{},
		decisions: map[string]system.Decision{}, scopes: map[string]*system.Scope{},
	}
	for _, l := range locs {
		r.locations[l.name] = true
	}
	return r
}

func (r *runner) version(ctx context.Context) uint64 {
	s, err := r.sys.Snapshot(ctx)
	if err != nil {
		return 0
	}
	return s.StateVersion
}

// run executes one op and builds its result; the state version is read
// from a snapshot taken right after the op.
func (r *runner) run(ctx context.Context, o op) result {
	res := result{Line: o.line, Op: o.name}
	octx, cancel := context.WithTimeout(ctx, opTimeout)
	err := r.exec(octx, o, &res)
	cancel()
	if err != nil {
		res.OK, res.err, res.Error = false, err, errorObject(err)
		res.Explanation, res.Report, res.Decision, res.Snapshot, res.Trace = nil, nil, nil, nil, nil
	} else {
		res.OK = true
	}
	if res.Snapshot != nil {
		res.StateVersion = res.Snapshot.StateVersion
	} else {
		res.StateVersion = r.version(ctx)
	}
	return res
}

func invalid(format string, args ...any) error {
	return &system.InvalidInputError{Message: fmt.Sprintf(format, args...)}
}

func (r *runner) handle(name string) (system.Handle, error) {
	h, ok := r.handles[name]
	if !ok {
		return system.Handle{}, invalid("unknown handle %q (register it first)", name)
	}
	return h, nil
}

// fill returns the deterministic content of value name at offset off:
// FNV-1a of the name and the 8-byte block index, so a replay produces the
// same bytes every time and every value has different bytes.
func fill(name string, off int64, dst []byte) {
	var blk [8]byte
	for i := range dst {
		pos := off + int64(i)
		if i == 0 || pos%8 == 0 {
			h := fnv.New64a()
			h.Write([]byte(name))
			var idx [8]byte
			binary.LittleEndian.PutUint64(idx[:], uint64(pos/8))
			h.Write(idx[:])
			binary.LittleEndian.PutUint64(blk[:], h.Sum64())
		}
		dst[i] = blk[pos%8]
	}
}

// deterministicLoader is the loader of a value registered with a source.
func deterministicLoader(name string) cuda.Loader {
	return func(ctx context.Context, dst []byte) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		fill(name, 0, dst)
		return nil
	}
}

func (r *runner) exec(ctx context.Context, o op, res *result) error {
	switch o.name {
	case "register":
		var mode system.ReplicaMode
		switch o.replica {
		case "", "exclusive":
			mode = system.Exclusive
		case "replicable":
			mode = system.Replicable
		default:
			return invalid("unknown replica mode %q (use exclusive or replicable)", o.replica)
		}
		v := system.Value{Name: o.handle, Bytes: o.bytes, Mode: mode, At: o.at, Source: o.source}
		if o.source != "" {
			v.Loader = deterministicLoader(o.handle)
		} else if o.bytes > 0 && o.bytes <= 1<<30 {
			v.Data = make([]byte, o.bytes)
			fill(o.handle, 0, v.Data)
		}
		h, err := r.sys.Register(ctx, v)
		if err != nil {
			return err
		}
		r.handles[o.handle] = h
		return nil
	case "place", "evict", "discard", "copy", "move":
		h, err := r.handle(o.handle)
		if err != nil {
			return err
		}
		switch o.name {
		case "place":
			return r.sys.Place(ctx, h, o.location)
		case "evict":
			return r.sys.Evict(ctx, h, o.location)
		case "discard":
			return r.sys.Discard(ctx, h)
		case "copy":
			return r.sys.Copy(ctx, h, o.from, o.to)
		default:
			return r.sys.Move(ctx, h, o.from, o.to)
		}
	case "acquire":
		h, err := r.handle(o.handle)
		if err != nil {
			return err
		}
		if _, dup := r.leases[o.as]; dup {
			return invalid("duplicate lease name %q", o.as)
		}
		l, err := r.sys.Acquire(ctx, h, o.location)
		if err != nil {
			return err
		}
		r.leases[o.as] = l
		return nil
	case "release":
		l, ok := r.leases[o.lease]
		if !ok {
			return invalid("unknown lease %q", o.lease)
		}
		return l.Release(ctx)
	case "record_event":
		l, ok := r.leases[o.lease]
		if !ok {
			return invalid("unknown lease %q", o.lease)
		}
		if _, dup := r.events[o.event]; dup {
			return invalid("duplicate event name %q", o.event)
		}
		ev := system.NewManualEvent()
		id, err := l.RecordEvent(ctx, ev)
		if err != nil {
			return err
		}
		r.events[o.event] = &scriptEvent{ev: ev, id: id}
		return nil
	case "complete_event":
		e, ok := r.events[o.event]
		if !ok {
			return invalid("unknown event %q", o.event)
		}
		if e.completed {
			return invalid("event %q was already completed", o.event)
		}
		e.completed = true
		e.ev.Complete()
		return r.sys.WaitReaped(ctx, e.id)
	case "hold":
		h, err := r.handle(o.handle)
		if err != nil {
			return err
		}
		if _, dup := r.holds[o.as]; dup {
			return invalid("duplicate hold name %q", o.as)
		}
		hd, err := r.sys.Hold(ctx, h, o.location)
		if err != nil {
			return err
		}
		r.holds[o.as] = hd
		return nil
	case "unhold":
		hd, ok := r.holds[o.hold]
		if !ok {
			return invalid("unknown hold %q", o.hold)
		}
		return hd.Release(ctx)
	case "reserve":
		return r.sys.Reserve(ctx, o.location, o.resName, o.bytes)
	case "unreserve":
		return r.sys.Unreserve(ctx, o.resName)
	case "explain":
		p, err := r.plan(o.plan)
		if err != nil {
			return err
		}
		ex, err := r.sys.Explain(ctx, p)
		if err != nil {
			return err
		}
		e := toExplanation(ex)
		res.Explanation = &e
		return nil
	case "execute":
		p, err := r.plan(o.plan)
		if err != nil {
			return err
		}
		rep, err := r.sys.Execute(ctx, p)
		if err != nil {
			return err
		}
		res.Report = toReport(rep)
		return nil
	case "decide":
		if _, dup := r.decisions[o.as]; dup {
			return invalid("duplicate decision name %q", o.as)
		}
		req, err := r.request(o.request)
		if err != nil {
			return err
		}
		d, err := r.sys.Decide(ctx, req)
		if err != nil {
			return err
		}
		r.decisions[o.as] = d
		res.Decision = toDecision(d)
		return nil
	case "enter":
		if _, dup := r.scopes[o.as]; dup {
			return invalid("duplicate scope name %q", o.as)
		}
		var sc *system.Scope
		switch {
		case o.decision != "":
			d, ok := r.decisions[o.decision]
			if !ok {
				return invalid("unknown decision %q", o.decision)
			}
			sc = r.sys.ScopeFor(d)
		default:
			p, err := r.plan(o.plan)
			if err != nil {
				return err
			}
			if o.expectedVersion != nil {
				sc = r.sys.NewScopeExpecting(p, *o.expectedVersion)
			} else {
				sc = r.sys.NewScope(p)
			}
		}
		r.scopes[o.as] = sc
		if err := sc.Enter(ctx); err != nil {
			return err
		}
		res.Report = toReport(sc.Report())
		return nil
	case "exit":
		sc, ok := r.scopes[o.scope]
		if !ok {
			return invalid("unknown scope %q", o.scope)
		}
		return sc.Exit(ctx)
	case "snapshot":
		s, err := r.sys.Snapshot(ctx)
		if err != nil {
			return err
		}
		res.Snapshot = toSnapshot(s)
		return nil
	case "trace":
		t, err := r.sys.Trace(ctx)
		if err != nil {
			return err
		}
		ts := toTransitions(t)
		res.Trace = &ts
		return nil
	case "fail_next":
		kind, err := cuda.ParseFaultKind(o.kind)
		if err != nil {
			return invalid("unknown fault kind %q (use alloc, copy or reconstruct)", o.kind)
		}
		if _, err := cuda.ParseLocationName(o.location); err != nil {
			return invalid("malformed location %q", o.location)
		}
		if !r.locations[o.location] {
			return &system.UnavailableError{Location: o.location, Detail: "location is not configured"}
		}
		r.sys.Faults().Arm(kind, o.location)
		return nil
	}
	return fmt.Errorf("op %q is not implemented", o.name)
}

// plan resolves a script plan's handle names.
func (r *runner) plan(p *planSpec) (system.Plan, error) {
	var out system.Plan
	actions := func(in []actionSpec) ([]system.Action, error) {
		var as []system.Action
		for _, a := range in {
			h, err := r.handle(a.handle)
			if err != nil {
				return nil, err
			}
			as = append(as, system.Action{Handle: h, Location: a.location, From: a.from})
		}
		return as, nil
	}
	var err error
	if out.Reclaim, err = actions(p.reclaim); err != nil {
		return out, err
	}
	out.Reservations = reservations(p.reservations)
	if out.Enter, err = actions(p.enter); err != nil {
		return out, err
	}
	return out, nil
}

func reservations(in []reservationSpec) []system.ReservationSpec {
	var out []system.ReservationSpec
	for _, rs := range in {
		out = append(out, system.ReservationSpec{Name: rs.name, Location: rs.location, Bytes: rs.bytes})
	}
	return out
}

// request resolves a script request's handle names.
func (r *runner) request(q *requestSpec) (system.Request, error) {
	out := system.Request{Name: q.name, Reservations: reservations(q.reservations)}
	for _, req := range q.requirements {
		h, err := r.handle(req.handle)
		if err != nil {
			return out, err
		}
		out.Requirements = append(out.Requirements, system.Requirement{Handle: h, Tiers: req.tiers})
	}
	return out, nil
}

// resultWriter prints results as they come.
type resultWriter interface {
	write(*result) error
	flush() error
}

type jsonWriter struct{ w io.Writer }

func (j *jsonWriter) write(r *result) error {
	b, err := marshal(r)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	_, err = j.w.Write(b)
	return err
}

func (j *jsonWriter) flush() error { return nil }
