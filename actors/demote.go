package actors

import (
	"context"
	"fmt"
	"sync"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/messages"
)

// How a demotion runs.
//
// A demotion (a plan's reclaim action with To) is admitted by the ledger
// as a move: the destination charged from admission, the source until
// completion. The supervisor sends its copy effect to the value's actor
// as a [demoteTransfer], which allocates the destination buffer as for
// any copy. Then, when a [DemotionCopier] serves the route From → To
// (a staging pipeline serving device cuda:N registers itself for
// cuda:N → its pinned location, see [Engine.ServeDemotions]), the copy is
// handed to it; otherwise, or when the copier declines, the value actor
// copies on the destination's stream as for a move. Either way the
// outcome comes back to the supervisor as the step's TransferDone: done,
// the run completes the move; failed, [budget.Run.FailStep] drops the
// value instead. Only the copy changes hands: the ledger's charges, the
// buffers and their freeing stay the value actor's and the supervisor's.

// Demotion is one demotion copy handed to a [DemotionCopier]: Src (the
// value's buffer at From) into Dst (its freshly allocated buffer at To),
// Bytes long. The copier must not keep either buffer after it returns.
type Demotion struct {
	Value    string // the value's name
	From, To string
	Bytes    int64
	Src, Dst cuda.Buffer
}

// DemotionCopier carries out demotion copies for a route (From → To), on
// behalf of the value actors.
type DemotionCopier interface {
	// CopyDemotion copies d.Src into d.Dst and returns once the copy has
	// ended, with its outcome (served true). It returns served false,
	// having touched neither buffer, when it declines the copy (it is
	// closing, say): the value actor then copies itself. When ctx ends
	// before the copy started, it returns served true and ctx's error
	// without starting it; once started, the copy is waited for even if
	// ctx ends (neither buffer may be freed under a copy in flight).
	CopyDemotion(ctx context.Context, d Demotion) (served bool, err error)
}

// demoteTransfer is the copy effect of a demotion step (sent to the
// value actor instead of a plain DoTransfer).
type demoteTransfer struct{ *messages.DoTransfer }

// demotionRoutes holds the registered copiers, by route. Several may
// serve one route (two pipelines on one device): the earliest registered
// that is still registered serves it. The zero value is ready to use.
type demotionRoutes struct {
	mu     sync.Mutex
	next   uint64
	routes map[[2]string][]demotionEntry
}

type demotionEntry struct {
	id uint64
	c  DemotionCopier
}

// ServeDemotions registers c to carry out the copies of demotions from
// from to to; stop unregisters it (idempotent). A demotion whose copy c
// has started is not affected by stop: c must see it through. Errors
// ([*budget.InvalidInputError], nothing registered): a nil copier, a
// location that is not configured, from equal to to.
func (e *Engine) ServeDemotions(from, to string, c DemotionCopier) (stop func(), err error) {
	switch {
	case c == nil:
		return nil, &budget.InvalidInputError{Message: "demotion copier is nil"}
	case e.locations[from] == nil:
		return nil, &budget.InvalidInputError{Message: fmt.Sprintf("demotion route %s → %s: %s is not a configured location", from, to, from)}
	case e.locations[to] == nil:
		return nil, &budget.InvalidInputError{Message: fmt.Sprintf("demotion route %s → %s: %s is not a configured location", from, to, to)}
	case from == to:
		return nil, &budget.InvalidInputError{Message: fmt.Sprintf("demotion route %s → %s: both ends are the same location", from, to)}
	}
	r := &e.demoters
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.routes == nil {
		r.routes = map[[2]string][]demotionEntry{}
	}
	r.next++
	id, key := r.next, [2]string{from, to}
	r.routes[key] = append(r.routes[key], demotionEntry{id: id, c: c})
	var once sync.Once
	return func() { once.Do(func() { r.remove(key, id) }) }, nil
}

func (r *demotionRoutes) remove(key [2]string, id uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	list := r.routes[key]
	for i, en := range list {
		if en.id == id {
			list = append(list[:i:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(r.routes, key)
		return
	}
	r.routes[key] = list
}

// copier returns the copier serving from → to, or nil.
func (r *demotionRoutes) copier(from, to string) DemotionCopier {
	r.mu.Lock()
	defer r.mu.Unlock()
	if list := r.routes[[2]string{from, to}]; len(list) > 0 {
		return list[0].c
	}
	return nil
}

// demoteCopy carries out a demotion's copy dst←src: through the copier
// serving the route, or on the destination's stream when none serves it
// or the copier declines.
func (a *valueActor) demoteCopy(ctx context.Context, e budget.Effect, dst, src cuda.Buffer) error {
	if c := a.eng.demoters.copier(e.From, e.Location); c != nil {
		served, err := c.CopyDemotion(ctx, Demotion{Value: e.Handle.Name, From: e.From, To: e.Location, Bytes: e.Bytes, Src: src, Dst: dst})
		if served {
			return err
		}
	}
	return a.copy(ctx, dst, src)
}

// dispatchDemotion sends the effects of a pending reclaim step (a
// demotion: a move) as dispatch does, its copy as a demoteTransfer.
func (s *supervisor) dispatchDemotion(adm budget.Admission) {
	for _, e := range adm.Effects {
		if e.Kind == budget.EffectCopy {
			s.sendTransfer(&messages.DoTransfer{Admission: adm.ID, Effect: e}, true)
			continue
		}
		s.dispatch([]budget.Effect{e}, adm.ID, nil)
	}
}
