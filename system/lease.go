package system

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/residency-go/residency/actors"
	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/messages"
)

var runtimeGosched = runtime.Gosched

// Lease protects one resident materialization while the caller uses it.
// Release it when done; record the events of every stream that reads the
// buffer before releasing, so the bytes stay protected until those
// streams have finished.
type Lease struct {
	sys      *System
	id       LeaseID
	handle   Handle
	location string
	released atomic.Bool
}

// Acquire takes a lease on h's resident materialization at loc. It never
// places: an absent endpoint is an [*UnavailableError].
//
// Acquire runs on the caller's goroutine: it takes its turn in the
// runtime's single order of operations without sending a message. While
// the runtime is busy with another operation it waits for its turn until
// ctx ends; it then returns ctx's error and has taken nothing.
func (s *System) Acquire(ctx context.Context, h Handle, loc string) (_ *Lease, err error) {
	defer func() { s.stats.admission(ctx, opAcquire, err) }()
	// A direct call on this goroutine; as a message only when the
	// supervisor refused to run it (shutting down, stopped or suspended:
	// see actors.Engine.AcquireDirect), which answers as for any request.
	if rep, ok, err := s.acquireDirect(ctx, h, loc); err != nil {
		return nil, err
	} else if ok {
		if rep.Err != nil {
			return nil, s.noteFatal(rep.Err)
		}
		return &Lease{sys: s, id: rep.Lease, handle: h, location: loc}, nil
	}
	sl, err := s.sendVia(ctx, func(sl *replySlot) any {
		sl.acquire = actors.AcquireRequest{Acquire: messages.Acquire{Handle: h, Location: loc, ReplyTo: sl.pid}, Reply: &sl.leaseReply, Sink: sl}
		return &sl.acquire
	})
	if err != nil {
		return nil, err
	}
	r, err := s.await(ctx, sl, s.releaseLateFn, true)
	if err != nil {
		return nil, err
	}
	rep := *r.(*messages.LeaseReply) // the slot's own storage: read it before the slot goes back
	s.slots.put(sl)
	if rep.Err != nil {
		return nil, rep.Err
	}
	return &Lease{sys: s, id: rep.Lease, handle: h, location: loc}, nil
}

// acquireDirect runs an acquire as a direct call (see
// actors.Engine.AcquireDirect). ran false: it did not run, and the
// request must be sent as a message. err: the call was refused (closed,
// fatal stop, ctx done) or ctx ended while it waited. Unlike a send it
// needs no inflight count: a direct call that passed the closed check
// but comes after Close's Shutdown request does not run (the supervisor
// refuses direct calls from then on), and its send is refused as closed.
func (s *System) acquireDirect(ctx context.Context, h Handle, loc string) (rep messages.LeaseReply, ran bool, err error) {
	if err := s.refusal(ctx); err != nil {
		return rep, false, err
	}
	return s.eng.AcquireDirect(ctx, h, loc)
}

// releaseDirect runs a release as a direct call (see acquireDirect).
func (s *System) releaseDirect(ctx context.Context, id LeaseID) (rep messages.Reply, ran bool, err error) {
	if err := s.refusal(ctx); err != nil {
		return rep, false, err
	}
	return s.eng.ReleaseDirect(ctx, id)
}

// noteFatal returns err, and makes a *FatalError in it every later
// call's error too.
func (s *System) noteFatal(err error) error {
	var fe *FatalError
	if errors.As(err, &fe) {
		s.fatal.CompareAndSwap(nil, fe)
	}
	return err
}

// releaseLate releases a lease or hold granted to a caller who stopped
// waiting for it.
func (s *System) releaseLate(m any) {
	switch r := m.(type) {
	case *messages.LeaseReply:
		if r.Err == nil {
			s.root.Send(s.sup, &messages.Release{Lease: r.Lease})
		}
	case *messages.HoldReply:
		if r.Err == nil {
			s.root.Send(s.sup, &messages.Unhold{Hold: r.Hold})
		}
	}
}

// ID returns the lease id.
func (l *Lease) ID() LeaseID { return l.id }

// Handle returns the leased value.
func (l *Lease) Handle() Handle { return l.handle }

// Location returns the leased location.
func (l *Lease) Location() string { return l.location }

// Buffer returns the device buffer of the leased materialization. It is
// valid while the lease (or an event recorded on it) protects it.
func (l *Lease) Buffer() cuda.Buffer {
	b, _ := l.sys.eng.Buffers.Get(messages.BufferKey{Value: l.handle.ID, Location: l.location})
	return b
}

// Read copies the leased bytes to a new host slice.
func (l *Lease) Read(ctx context.Context) ([]byte, error) {
	if l.released.Load() {
		return nil, &budget.InvalidInputError{Message: fmt.Sprintf("lease %d was released", l.id)}
	}
	b := l.Buffer()
	if b == nil {
		return nil, fmt.Errorf("residency: no buffer for %s at %s", l.handle.Name, l.location)
	}
	return l.sys.backend.Read(ctx, b)
}

// RecordEvent records a consumer event (typically recorded on a stream
// that reads the buffer): the materialization stays protected until the
// event completes and the runtime has reaped it, even after Release.
// Recording on a released lease, or a nil event, is an [*InvalidInputError].
// If ctx ends after the request was sent, the call returns ctx.Err() but
// the runtime still records the event (when the lease allows it) and reaps
// it once it completes: the protection never outlives the event.
func (l *Lease) RecordEvent(ctx context.Context, ev cuda.Event) (EventID, error) {
	s := l.sys
	if ev == nil {
		return 0, &budget.InvalidInputError{Message: fmt.Sprintf("lease %d: cannot record a nil event", l.id)}
	}
	key := s.eventSeq.Add(1)
	s.eng.StoreEvent(key, ev)
	// Once sent, the event belongs to the runtime even if ctx ends before
	// the reply: the supervisor either records it (and a watcher reaps it
	// when it completes) or drops it. Dropping it here after sending would
	// leave a recorded event nobody watches, protecting the bytes forever.
	r, err := s.callOwned(ctx, func(p *actor.PID) any {
		return &messages.RecordEvent{Lease: l.id, EventKey: key, ReplyTo: p}
	}, nil, func() { s.eng.DropEvent(key) })
	if err != nil {
		return 0, err
	}
	rep := r.(*messages.EventReply)
	return rep.Event, rep.Err
}

// Release releases the lease. Releasing twice is an [*InvalidInputError].
// Like Acquire it waits for its turn until ctx ends; it then returns
// ctx's error and the lease is still held (release it again). (While the
// runtime is closing, a release is sent as a message instead and is
// answered with [ErrClosed]; Close releases what is left.)
func (l *Lease) Release(ctx context.Context) error {
	s := l.sys
	if rep, ok, err := s.releaseDirect(ctx, l.id); err != nil {
		return err
	} else if ok {
		if rep.Err != nil {
			return s.noteFatal(rep.Err)
		}
		l.released.Store(true)
		return nil
	}
	sl, err := s.sendVia(ctx, func(sl *replySlot) any {
		sl.release = actors.ReleaseRequest{Release: messages.Release{Lease: l.id, ReplyTo: sl.pid}, Reply: &sl.reply, Sink: sl}
		return &sl.release
	})
	if err != nil {
		return err
	}
	r, err := s.await(ctx, sl, nil, true)
	if err != nil {
		return err
	}
	e := r.(*messages.Reply).Err // the slot's own storage: read it before the slot goes back
	s.slots.put(sl)
	if e != nil {
		return e
	}
	l.released.Store(true)
	return nil
}

// ReleaseByID releases a lease by id (for tools that keep ids, not *Lease),
// as [Lease.Release] does.
func (s *System) ReleaseByID(ctx context.Context, id LeaseID) error {
	if rep, ok, err := s.releaseDirect(ctx, id); err != nil {
		return err
	} else if ok {
		return s.noteFatal(rep.Err)
	}
	return s.callErr(ctx, func(p *actor.PID) any { return &messages.Release{Lease: id, ReplyTo: p} })
}

// WaitReaped returns once event id is no longer pending: its device event
// completed and the runtime reaped it (or it was never recorded).
func (s *System) WaitReaped(ctx context.Context, id EventID) error {
	return s.callErr(ctx, func(p *actor.PID) any { return &messages.AwaitReap{Event: id, ReplyTo: p} })
}

// Hold protects one resident materialization until released.
type Hold struct {
	sys *System
	id  budget.HoldID
}

// Hold takes a hold on h's resident materialization at loc.
func (s *System) Hold(ctx context.Context, h Handle, loc string) (_ *Hold, err error) {
	defer func() { s.stats.admission(ctx, opHold, err) }()
	r, err := s.call(ctx, func(p *actor.PID) any { return &messages.Hold{Handle: h, Location: loc, ReplyTo: p} }, s.releaseLateFn)
	if err != nil {
		return nil, err
	}
	rep := r.(*messages.HoldReply)
	if rep.Err != nil {
		return nil, rep.Err
	}
	return &Hold{sys: s, id: rep.Hold}, nil
}

// ID returns the hold id.
func (h *Hold) ID() budget.HoldID { return h.id }

// Release releases the hold. Twice: [*InvalidInputError].
func (h *Hold) Release(ctx context.Context) error {
	return h.sys.callErr(ctx, func(p *actor.PID) any { return &messages.Unhold{Hold: h.id, ReplyTo: p} })
}

// Read acquires a lease on (h, loc), reads the bytes and releases it.
func (s *System) Read(ctx context.Context, h Handle, loc string) ([]byte, error) {
	l, err := s.Acquire(ctx, h, loc)
	if err != nil {
		return nil, err
	}
	data, rerr := l.Read(ctx)
	if err := l.Release(context.WithoutCancel(ctx)); err != nil && rerr == nil {
		rerr = err
	}
	return data, rerr
}

// ManualEvent is a consumer event completed by the application (for
// work the backend does not see, and for tools such as the replay CLI).
type ManualEvent struct {
	done chan struct{}
	once atomicOnce
}

type atomicOnce struct{ v atomic.Bool }

// NewManualEvent returns an incomplete event.
func NewManualEvent() *ManualEvent { return &ManualEvent{done: make(chan struct{})} }

// Complete completes the event (idempotent).
func (e *ManualEvent) Complete() {
	if e.once.v.CompareAndSwap(false, true) {
		close(e.done)
	}
}

// Done is closed when the event completes.
func (e *ManualEvent) Done() <-chan struct{} { return e.done }

// Err is always nil.
func (e *ManualEvent) Err() error { return nil }

// Query reports completion.
func (e *ManualEvent) Query() bool { return e.once.v.Load() }

// Wait waits for completion or ctx.
func (e *ManualEvent) Wait(ctx context.Context) error {
	select {
	case <-e.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

var _ cuda.Event = (*ManualEvent)(nil)
