package staging

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/residency-go/residency/budget"
)

// ticket is one reservation of GPU bytes for one device clone (or of host
// bytes for one landing buffer): a named reservation on the runtime's
// location, released exactly once.
type ticket struct {
	name     string
	bytes    int64
	gpu      bool // counts against the GPU-byte budget
	released atomic.Bool
}

// gpuBudget is the GPU-byte budget of device clones. Every ticket is a
// named reservation on the runtime's device location, so clones share that
// location's budget with resident values and show in its snapshot; on top,
// the pipeline's own cap (Config.CloneBudgetBytes) bounds them. Safe for
// concurrent use.
type gpuBudget struct {
	rt     Runtime
	loc    string
	prefix string
	cap    int64
	// flush escalates the oldest deferred task (budget pressure); false
	// when no deferred task is left.
	flush func() bool

	seq atomic.Uint64

	mu      sync.Mutex
	used    int64
	peak    int64
	changed chan struct{} // closed and replaced on every release and on poke
	failure error         // set by fail: reserve returns it
	drops   map[string]int64
	flushes int64
}

func newGPUBudget(rt Runtime, loc, prefix string, capBytes int64) *gpuBudget {
	return &gpuBudget{rt: rt, loc: loc, prefix: prefix, cap: capBytes, changed: make(chan struct{}), drops: map[string]int64{}}
}

// signalLocked wakes every waiting reserve. b.mu must be held.
func (b *gpuBudget) signalLocked() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// poke wakes waiting reserves so they look again (a deferred task appeared
// that a flush could take).
func (b *gpuBudget) poke() {
	b.mu.Lock()
	b.signalLocked()
	b.mu.Unlock()
}

// fail makes every waiting and later reserve return err.
func (b *gpuBudget) fail(err error) {
	b.mu.Lock()
	if b.failure == nil {
		b.failure = err
	}
	b.signalLocked()
	b.mu.Unlock()
}

// reserve takes n bytes of the budget. With wait, a full budget (the
// pipeline's cap, or the location's budget in the runtime) flushes the
// deferred task with the oldest enqueue time and waits for a release,
// again and again, until the bytes fit, ctx ends, or nothing of the
// pipeline's is left to free (then the location's *budget.BudgetError).
// Without wait (try-reserve) a full budget fails at once with a
// *DropError, counted by reason.
func (b *gpuBudget) reserve(ctx context.Context, n int64, wait bool) (*ticket, error) {
	if n > b.cap {
		return nil, fmt.Errorf("%w: a device clone of %d bytes exceeds the whole GPU-byte budget (%d)", ErrConfig, n, b.cap)
	}
	for {
		b.mu.Lock()
		if b.failure != nil {
			err := b.failure
			b.mu.Unlock()
			return nil, err
		}
		var refused error
		if b.used+n <= b.cap {
			b.used += n
			b.mu.Unlock()
			t := &ticket{name: fmt.Sprintf("%s/clone/%d", b.prefix, b.seq.Add(1)), bytes: n, gpu: true}
			err := b.rt.Reserve(ctx, b.loc, t.name, n)
			if err == nil {
				b.mu.Lock()
				b.peak = max(b.peak, b.used)
				b.mu.Unlock()
				return t, nil
			}
			b.mu.Lock()
			b.used -= n
			b.signalLocked()
			var be *budget.BudgetError
			if !errors.As(err, &be) {
				b.mu.Unlock()
				return nil, err
			}
			if !wait {
				b.drops[DropLocation]++
				b.mu.Unlock()
				return nil, &DropError{Reason: DropLocation, Requested: n, Err: err}
			}
			refused = err
		} else if !wait {
			b.drops[DropBudget]++
			b.mu.Unlock()
			return nil, &DropError{Reason: DropBudget, Requested: n}
		}
		ch, used := b.changed, b.used
		b.mu.Unlock()

		flushed := b.flush()
		if flushed {
			b.mu.Lock()
			b.flushes++
			b.mu.Unlock()
		} else if used == 0 {
			// Nothing of ours holds bytes or could be flushed: the location
			// is full of others' bytes.
			return nil, refused
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// release returns t's bytes: first to the runtime's location, then to the
// pipeline's cap, waking waiting reserves. A second release of a ticket is a
// bug and returns an error.
func (b *gpuBudget) release(ctx context.Context, t *ticket) error {
	if t.released.Swap(true) {
		return fmt.Errorf("staging: ticket %s released twice", t.name)
	}
	err := b.rt.Unreserve(ctx, t.name)
	if t.gpu {
		b.mu.Lock()
		b.used -= t.bytes
		b.signalLocked()
		b.mu.Unlock()
	}
	return err
}

type budgetState struct {
	used, peak, flushes int64
	drops               map[string]int64
}

func (b *gpuBudget) state() budgetState {
	b.mu.Lock()
	defer b.mu.Unlock()
	d := make(map[string]int64, len(b.drops))
	for k, v := range b.drops {
		d[k] = v
	}
	return budgetState{used: b.used, peak: b.peak, flushes: b.flushes, drops: d}
}
