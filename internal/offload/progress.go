package offload

import (
	"fmt"
	"io"
	"math"
	"sync/atomic"
	"time"

	"github.com/residency-go/residency/system"
)

// Bounds of the time a run replays.
const (
	// MaxWait bounds the wall time a run waits for the trace: the span
	// from the first arrival to the last admitted request's end, divided
	// by the speed. A longer run is refused before it starts.
	MaxWait = 24 * time.Hour
	// MaxTraceSpan bounds that span in trace time (a serving trace spans
	// hours or days; a longer one has a wrong timestamp, and its times
	// would not fit the clock's arithmetic).
	MaxTraceSpan = 366 * 24 * time.Hour
	// defaultProgressEvery is the pause between two progress lines.
	defaultProgressEvery = 5 * time.Second
)

// limits are the row size and the KV one request may hold, scaled like
// the budgets (see start).
func (cfg Config) limits() (rowBytes, maxRequestBytes int64) {
	scale := int64(RealBytesPerToken) / cfg.BytesPerToken
	return BlockTokens * cfg.BytesPerToken, 16 << 30 / scale
}

// admitted reports whether a request of r's tokens fits what one request
// may hold (a server refuses it otherwise), and its number of blocks.
func admitted(r Row, rowBytes, maxRequestBytes int64) (allBlocks int64, ok bool) {
	allBlocks = (r.Context + r.Gen + BlockTokens - 1) / BlockTokens
	return allBlocks, allBlocks*rowBytes <= maxRequestBytes
}

// spanSeconds is the trace time, in seconds, from the first arrival to
// the end of the last admitted request (its arrival plus its decode),
// computed without the saturation of time.Time.Sub.
func (cfg Config) spanSeconds(rows []Row) float64 {
	rowBytes, maxReq := cfg.limits()
	t0 := rows[0].At
	end := 0.0
	for _, r := range rows {
		s := float64(r.At.Unix()-t0.Unix()) + float64(r.At.Nanosecond()-t0.Nanosecond())/1e9
		if _, ok := admitted(r, rowBytes, maxReq); ok {
			s += float64(r.Gen) * decodePerToken.Seconds()
		}
		end = max(end, s)
	}
	return end
}

// checkSpan refuses rows whose replay would span more than MaxTraceSpan
// of trace time or make the run wait longer than MaxWait at cfg.Speed.
func (cfg Config) checkSpan(rows []Row) error {
	span := cfg.spanSeconds(rows)
	if span > MaxTraceSpan.Seconds() {
		return &system.InvalidInputError{Message: fmt.Sprintf(
			"offload: the trace spans %.0f s (%.1f days) from its first arrival to its last request's end, more than the %.0f days a trace may span: check its timestamps",
			span, span/86400, MaxTraceSpan.Hours()/24)}
	}
	if wait := span / cfg.Speed; wait > MaxWait.Seconds() || math.IsInf(wait, 0) {
		return &system.InvalidInputError{Message: fmt.Sprintf(
			"offload: the trace spans %.0f s; at speed %g the run would wait %.3g s, more than the %.0f h a run may wait: raise the speed, or replay fewer requests",
			span, cfg.Speed, wait, MaxWait.Hours())}
	}
	return nil
}

// progress prints what the run has replayed to cfg.Progress: one line
// when it starts, then one every cfg.ProgressEvery until stop is called.
type progress struct {
	w       io.Writer
	arrived atomic.Int64 // requests whose arrival time has come
	stop    chan struct{}
	done    chan struct{}
}

// startProgress prints the opening line and starts the ticker; with no
// cfg.Progress it does nothing.
func (o *runner) startProgress(requests int, span float64) *progress {
	p := &progress{w: o.cfg.Progress, stop: make(chan struct{}), done: make(chan struct{})}
	if p.w == nil {
		close(p.done)
		return p
	}
	fmt.Fprintf(p.w, "offload: replaying %d requests: %.0f s of trace time at speed %g, about %.1f s\n",
		requests, span, o.cfg.Speed, span/o.cfg.Speed)
	every := o.cfg.ProgressEvery
	if every <= 0 {
		every = defaultProgressEvery
	}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-tick.C:
				fmt.Fprintf(p.w, "offload: %.0f s of %.0f s of trace time, %d of %d requests arrived, %.0f s waited\n",
					min(o.traceNow().Seconds(), span), span, p.arrived.Load(), requests, time.Since(o.start).Seconds())
			}
		}
	}()
	return p
}

// end stops the ticker and waits for it.
func (p *progress) end() {
	select {
	case <-p.done:
	default:
		close(p.stop)
		<-p.done
	}
}
