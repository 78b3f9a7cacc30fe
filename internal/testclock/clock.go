// Package testclock is the clock of the project's keep-alive tests: a
// cache.Clock that moves only when a test advances it. No user of the
// module can import it.
package testclock

import (
	"sync"
	"time"

	"github.com/residency-go/residency/system/cache"
)

// Clock is a cache.Clock that moves only when a test advances it, so no
// test sleeps for a keep-alive to expire. Advance runs the callbacks of
// the timers it passes, in time order, on the caller's goroutine.
type Clock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*clockTimer
}

type clockTimer struct {
	c     *Clock
	at    time.Time
	f     func()
	state int // 0 pending, 1 fired, 2 stopped
}

// New returns a Clock reading start.
func New(start time.Time) *Clock { return &Clock{now: start} }

// Now is the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc arranges for f to run when the clock is advanced past d.
func (c *Clock) AfterFunc(d time.Duration, f func()) cache.ClockTimer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &clockTimer{c: c, at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return t
}

// Stop cancels the timer: false when it fired or was stopped already.
func (t *clockTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	if t.state != 0 {
		return false
	}
	t.state = 2
	return true
}

// Advance moves the clock by d, running every timer due on the way (and
// those they set that fall due within d).
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	c.mu.Unlock()
	for {
		c.mu.Lock()
		var next *clockTimer
		for _, t := range c.timers {
			if t.state == 0 && !t.at.After(end) && (next == nil || t.at.Before(next.at)) {
				next = t
			}
		}
		if next == nil {
			c.now = end
			c.mu.Unlock()
			return
		}
		if next.at.After(c.now) {
			c.now = next.at
		}
		next.state = 1
		c.mu.Unlock()
		next.f()
	}
}

// Pending counts the timers neither fired nor stopped.
func (c *Clock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, t := range c.timers {
		if t.state == 0 {
			n++
		}
	}
	return n
}
