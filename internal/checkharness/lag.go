package checkharness

// How long the process itself was kept from running, for a checker's rule
// "every call done within its context": a call that returns late by no
// more than that, plus the checker's grace, is not blamed for it.

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Lag measures two kinds of stall while a checker run lasts:
//
//   - probes: how late goroutines that only sleep wake up (a
//     stop-the-world pause, the process off the CPUs). One thread of the
//     process can stall while the others run (it waits for a CPU on a
//     machine with more runnable threads than cores): every goroutine
//     queued on its processor waits with it — a caller, the timer
//     goroutine that cancels a caller's context, the holder of a lock a
//     caller waits for — and so does a probe whose timer is there, but
//     not one on another processor. So there are several probes, each
//     re-arming its timer wherever it ran last.
//   - threads: how long the OS kept each of the process's threads
//     runnable but off a CPU (Linux: run_delay in
//     /proc/self/task/*/schedstat), which sees a thread waiting for a
//     CPU whether or not a probe was there (not one blocked in the
//     kernel: only a probe sees that).
//
// A stall that ends when the call returns is seen only by the samples
// taken after it: Worst waits for them.
type Lag struct {
	mu      sync.Mutex
	cond    *sync.Cond    // signalled at every sample and at stop
	samples [][]lagSample // by probe, oldest first
	threads []threadSample
	// noThreads: the run-queue delays cannot be read (not Linux).
	noThreads bool
	stopped   bool
	// waiting, if set, is called (without mu) when Worst starts waiting
	// for the samples after the call (tests).
	waiting func()
}

type lagSample struct {
	at  time.Time
	lag time.Duration
}

// threadSample is the cumulative run-queue delay of each thread (by
// thread id) at one moment.
type threadSample struct {
	at    time.Time
	delay map[int]time.Duration
}

// NewLag returns a Lag with probes probes (Run starts them).
func NewLag(probes int) *Lag {
	l := &Lag{samples: make([][]lagSample, probes)}
	l.cond = sync.NewCond(&l.mu)
	return l
}

// Run samples until stop is closed: each probe every 2 ms, the threads'
// run-queue delays every 20 ms.
func (l *Lag) Run(stop <-chan struct{}) {
	var wg sync.WaitGroup
	for i := range l.samples {
		wg.Go(func() { l.probe(i, stop) })
	}
	wg.Go(func() { l.readThreads(stop) })
	wg.Wait()
	l.mu.Lock()
	l.stopped = true
	l.cond.Broadcast()
	l.mu.Unlock()
}

func (l *Lag) probe(i int, stop <-chan struct{}) {
	const tick = 2 * time.Millisecond
	t := time.NewTimer(tick)
	defer t.Stop()
	want := time.Now().Add(tick)
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			// The time the timer channel carries is when the timer was
			// due, not when this goroutine ran: a stalled process would
			// show no lag. Read the clock here instead.
			now := time.Now()
			l.addProbe(i, now, now.Sub(want))
			want = time.Now().Add(tick)
			t.Reset(tick)
		}
	}
}

func (l *Lag) readThreads(stop <-chan struct{}) {
	d, ok := threadDelays()
	if !ok {
		l.mu.Lock()
		l.noThreads = true
		l.cond.Broadcast()
		l.mu.Unlock()
		return
	}
	l.addThreads(time.Now(), d)
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			if d, ok := threadDelays(); ok {
				l.addThreads(time.Now(), d)
			}
		}
	}
}

// threadDelays reads the run-queue delay of every thread of the process.
func threadDelays() (map[int]time.Duration, bool) {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil, false
	}
	d := make(map[int]time.Duration, len(ents))
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/self/task/" + e.Name() + "/schedstat")
		if err != nil {
			continue // the thread exited
		}
		// "time on a CPU, time runnable waiting for one, time slices", in ns.
		f := strings.Fields(string(b))
		if len(f) < 2 {
			return nil, false
		}
		n, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			return nil, false
		}
		d[tid] = time.Duration(n)
	}
	return d, len(d) > 0
}

func (l *Lag) addProbe(i int, at time.Time, lag time.Duration) {
	l.mu.Lock()
	l.samples[i] = append(l.samples[i], lagSample{at, lag})
	l.cond.Broadcast()
	l.mu.Unlock()
}

func (l *Lag) addThreads(at time.Time, delay map[int]time.Duration) {
	l.mu.Lock()
	l.threads = append(l.threads, threadSample{at, delay})
	l.cond.Broadcast()
	l.mu.Unlock()
}

// covered says whether the samples after to are in (mu held): every
// probe's and the threads' (unless they cannot be read), or sampling has
// stopped.
func (l *Lag) covered(to time.Time) bool {
	if l.stopped {
		return true
	}
	for _, ps := range l.samples {
		if n := len(ps); n == 0 || !ps[n-1].at.After(to) {
			return false
		}
	}
	if l.noThreads {
		return true
	}
	n := len(l.threads)
	return n > 0 && l.threads[n-1].at.After(to)
}

// Worst is the longest the process was kept from running from from to
// to: the probes' largest lag there (including each one's first sample
// after to, which covers a probe asleep at to), or the most run-queue
// delay one thread gathered over the thread samples around [from, to],
// whichever is larger. It waits for the samples after to.
func (l *Lag) Worst(from, to time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.covered(to) && l.waiting != nil {
		h := l.waiting
		l.mu.Unlock()
		h()
		l.mu.Lock()
	}
	for !l.covered(to) {
		l.cond.Wait()
	}
	var w time.Duration
	for _, ps := range l.samples {
		for i := len(ps) - 1; i >= 0; i-- {
			s := ps[i]
			if s.at.Before(from) {
				break
			}
			if s.at.After(to) && i > 0 && ps[i-1].at.After(to) {
				continue // not the first sample after to
			}
			w = max(w, s.lag)
		}
	}
	if len(l.threads) == 0 {
		return w
	}
	// The last thread sample at or before from (else the first one) and
	// the first at or after to (else the last one).
	first, last := 0, len(l.threads)-1
	for i, s := range l.threads {
		if !s.at.After(from) {
			first = i
		}
	}
	for i := len(l.threads) - 1; i >= 0; i-- {
		if !l.threads[i].at.Before(to) {
			last = i
		}
	}
	if last < first {
		last = first
	}
	a, b := l.threads[first].delay, l.threads[last].delay
	for tid, d := range b {
		w = max(w, d-a[tid]) // a thread born meanwhile: all its delay
	}
	return w
}

// ContextEnd returns when ctx's Done channel was seen closed (zero
// while ctx has not ended), and stop, to be called once the call is
// over. It is not ctx's deadline: a context ends when its timer's
// goroutine cancels it, and that goroutine can wait for a CPU like any
// other; a call cannot return on a context that has not ended yet. The
// time is read by a goroutine that waits for Done, so a late reading can
// only spare a call, never blame it.
func ContextEnd(ctx context.Context) (ended func() time.Time, stop func() bool) {
	var at time.Time
	seen := make(chan struct{})
	stop = context.AfterFunc(ctx, func() {
		at = time.Now()
		close(seen)
	})
	return func() time.Time {
		if ctx.Err() == nil {
			return time.Time{}
		}
		<-seen // Done is closed: its reader runs (or has run)
		return at
	}, stop
}

// Overruns sums the calls that returned late after their context ended:
// how many, and the largest overrun net of the stall meanwhile. Safe for
// concurrent use; its zero value is ready.
type Overruns struct {
	mu    sync.Mutex
	calls int
	net   time.Duration // the largest overrun net of the stall,
	late  time.Duration // that call's overrun,
	stall time.Duration // and the stall during it
}

// Add records a call that returned late after its context ended, with the
// stall meanwhile.
func (o *Overruns) Add(late, stall time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.calls++
	if net := late - stall; o.calls == 1 || net > o.net {
		o.net, o.late, o.stall = net, late, stall
	}
}

// Merge adds the calls p recorded.
func (o *Overruns) Merge(p *Overruns) {
	p.mu.Lock()
	calls, net, late, stall := p.calls, p.net, p.late, p.stall
	p.mu.Unlock()
	if calls == 0 {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.calls == 0 || net > o.net {
		o.net, o.late, o.stall = net, late, stall
	}
	o.calls += calls
}

// Calls returns how many late calls were recorded.
func (o *Overruns) Calls() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.calls
}

// String is the figures for a test's log, over: the threshold that made
// a call late.
func (o *Overruns) String(over time.Duration) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return fmt.Sprintf("%d calls returned over %v after their contexts ended; the largest overrun net of the stall meanwhile: %v (%v late, %v stall)",
		o.calls, over, o.net.Round(time.Millisecond), o.late.Round(time.Millisecond), o.stall.Round(time.Millisecond))
}
