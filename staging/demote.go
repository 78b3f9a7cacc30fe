package staging

import (
	"context"
	"sync"
	"time"

	"github.com/residency-go/residency/actors"
	"github.com/residency-go/residency/cuda"
)

// Demotions: the runtime's spill path through the pipeline.
//
// When the runtime demotes a value from the pipeline's Device to its
// Pinned location (a plan's reclaim action with To: docs/semantics.md,
// "Spill"), the copy goes through the pipeline's copy queue at the lowest
// priority, below every write task's copy stage, and runs on the
// pipeline's landing stream (the clone → host stream that only the copy
// queue uses), never on the stream of the steps' device→host copies. The
// runtime's ledger has decided and charged the demotion as a move before
// the copy is handed over, and the runtime allocates and frees the
// buffers: the pipeline only performs the copy and reports its outcome.
//
// A pipeline serves demotions when its Runtime is also a [DemotionServer]
// (*system.System is) and it is not eager: New registers it for the route
// Device → Pinned, Close unregisters it. A pipeline that is closing or
// has failed declines the demotions handed to it, and so does Close for
// those still waiting in the copy queue, and so does the pipeline for one
// that waited longer than Config.DemotionMaxWait behind write tasks: the
// runtime then copies itself, as it does with no pipeline. A demotion copy that fails is reported to
// the runtime, which drops the value (the pipeline stays healthy: a
// demotion is not a write task). Stats counts them.

// DemotionServer is the optional part of a [Runtime] through which a
// pipeline carries out the runtime's demotions from its Device to its
// Pinned location: ServeDemotions registers a copier for the route from →
// to and returns the call that unregisters it. *system.System satisfies
// it.
type DemotionServer interface {
	ServeDemotions(from, to string, c actors.DemotionCopier) (stop func(), err error)
}

// DefaultDemotionMaxWait is Config.DemotionMaxWait's default.
const DefaultDemotionMaxWait = 250 * time.Millisecond

// prioDemote: a demotion copy, below every write task (see prioLow).
const prioDemote int8 = 0

// demoteJob is one demotion copy on the copy queue.
type demoteJob struct {
	d    actors.Demotion
	done chan struct{} // closed once served and err are set
	// served: the pipeline ran the copy (false: declined before it ran).
	served bool
	err    error
}

// demoteState is the pipeline's demotion bookkeeping, guarded by p.mu.
type demoteState struct {
	stop   func()                  // unregisters the pipeline (nil: not serving)
	queued map[*demoteJob]struct{} // on the copy queue, not started
	wg     sync.WaitGroup          // demotion copies running (Close waits for them)
	counts demoteCounts
}

type demoteCounts struct {
	done, failed, declined, bytes int64
}

// demoter is the pipeline's actors.DemotionCopier.
type demoter struct{ p *Pipeline }

// serveDemotions registers p with its runtime, when the runtime serves
// demotions and p has a copy queue. A runtime that refuses the route
// (Device or Pinned is not one of its locations) leaves p without
// demotions, which is logged.
func (p *Pipeline) serveDemotions() {
	ds, ok := p.rt.(DemotionServer)
	p.demo.queued = map[*demoteJob]struct{}{}
	if !ok || p.cfg.Eager {
		return
	}
	stop, err := ds.ServeDemotions(p.cfg.Device, p.cfg.Pinned, demoter{p})
	if err != nil {
		p.log.Warn().Err(err).Msg("the runtime does not hand this pipeline its demotions")
		return
	}
	p.mu.Lock()
	p.demo.stop = stop
	p.mu.Unlock()
}

// CopyDemotion puts d's copy on the copy queue at the lowest priority and
// waits for it (see actors.DemotionCopier). It declines (false) when the
// pipeline is closing or has failed.
func (c demoter) CopyDemotion(ctx context.Context, d actors.Demotion) (bool, error) {
	p := c.p
	j := &demoteJob{d: d, done: make(chan struct{})}
	p.mu.Lock()
	if p.closing || p.failure != nil {
		p.demo.counts.declined++
		p.mu.Unlock()
		return false, nil
	}
	if err := ctx.Err(); err != nil {
		p.demo.counts.failed++
		p.mu.Unlock()
		return true, err
	}
	p.demo.queued[j] = struct{}{}
	// Pushed under p.mu: a job counted as queued is on the queue (Close
	// and Stats see the same thing), and the queue's first look at it
	// (under p.mu) comes after.
	p.sys.sendDemotion(j)
	p.mu.Unlock()
	var late <-chan time.Time
	if wait := p.demotionMaxWait(); wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		late = t.C
	}
	select {
	case <-j.done:
		return j.served, j.err
	case <-ctx.Done():
	case <-late:
	}
	p.mu.Lock()
	if _, ok := p.demo.queued[j]; ok { // not started: it never will be
		delete(p.demo.queued, j)
		if ctx.Err() == nil { // waited too long behind write tasks
			p.demo.counts.declined++
			p.mu.Unlock()
			return false, nil
		}
		p.demo.counts.failed++
		p.mu.Unlock()
		return true, ctx.Err()
	}
	p.mu.Unlock()
	<-j.done // started (or declined by Close): its copy ends on its own
	return j.served, j.err
}

// demotionMaxWait is the bound of a demotion's wait on the copy queue
// (≤ 0: none).
func (p *Pipeline) demotionMaxWait() time.Duration {
	switch w := p.cfg.DemotionMaxWait; {
	case w == 0:
		return DefaultDemotionMaxWait
	case w < 0:
		return 0
	default:
		return w
	}
}

// runDemotion is the copy queue's turn for j: unless it was declined or
// given up meanwhile, it copies on the landing stream and waits for the
// copy whatever happens (the runtime frees the buffers once it returns).
func (p *Pipeline) runDemotion(j *demoteJob) {
	p.mu.Lock()
	if _, ok := p.demo.queued[j]; !ok {
		p.mu.Unlock()
		return
	}
	delete(p.demo.queued, j)
	p.demo.wg.Add(1) // under p.mu, before Close declines the queue: before its Wait
	p.mu.Unlock()
	defer p.demo.wg.Done()

	err := p.demotionCopy(j.d.Dst, j.d.Src)

	p.mu.Lock()
	if err != nil {
		p.demo.counts.failed++
	} else {
		p.demo.counts.done++
		p.demo.counts.bytes += j.d.Bytes
	}
	p.mu.Unlock()
	if err != nil {
		p.log.Debug().Err(err).Str("value", j.d.Value).Msg("demotion copy failed")
	}
	if f := p.cfg.OnDemotion; f != nil {
		f(j.d.Value, j.d.Bytes, err)
	}
	j.served, j.err = true, err
	close(j.done)
}

// demotionCopy enqueues dst←src on the landing stream and waits for it to
// end, not for a context: neither buffer may be freed under the copy.
func (p *Pipeline) demotionCopy(dst, src cuda.Buffer) error {
	ev, err := p.land.copyAfter(dst, src, nil)
	if err != nil {
		return err
	}
	<-ev.Done()
	return ev.Err()
}

// stopDemotions (Close, once closing is set) unregisters the pipeline
// and declines the demotions still waiting on the copy queue: the runtime
// copies them itself. A demotion copy already running is seen through by
// the copy queue; Close waits for it (p.demo.wg) before it closes the
// streams.
func (p *Pipeline) stopDemotions() {
	p.mu.Lock()
	stop := p.demo.stop
	p.demo.stop = nil
	var declined []*demoteJob
	for j := range p.demo.queued {
		declined = append(declined, j)
	}
	clear(p.demo.queued)
	p.demo.counts.declined += int64(len(declined))
	p.mu.Unlock()
	if stop != nil {
		stop()
	}
	for _, j := range declined {
		close(j.done) // served false
	}
}
