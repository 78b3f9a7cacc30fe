package actors

import (
	"context"
	"sync"
	"time"
)

// deadlineCtx is a context with a deadline that makes its timer only when
// somebody waits on Done. A location actor gives one to every allocation;
// most backends (the soft one among them) only ask Err, so an allocation
// then costs no timer. It honours the context contract: Err is nil until
// Done is closed (a call to Err that finds the deadline passed or the
// parent ended closes Done first), and Err never changes once non-nil.
// release must be called when the allocation returned.
type deadlineCtx struct {
	parent   context.Context
	deadline time.Time

	mu         sync.Mutex
	done       chan struct{} // made on first Done, or closed on first end
	err        error
	timer      *time.Timer
	stopParent func() bool
}

// withDeadline returns a context of parent that ends at deadline (or when
// parent ends), and its release.
func withDeadline(parent context.Context, deadline time.Time) (*deadlineCtx, func()) {
	c := &deadlineCtx{parent: parent, deadline: deadline}
	return c, c.release
}

func (c *deadlineCtx) Deadline() (time.Time, bool) {
	if d, ok := c.parent.Deadline(); ok && d.Before(c.deadline) {
		return d, true
	}
	return c.deadline, true
}

func (c *deadlineCtx) Value(key any) any { return c.parent.Value(key) }

func (c *deadlineCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		if err := c.parent.Err(); err != nil {
			c.endLocked(err)
		} else if !time.Now().Before(c.deadline) {
			c.endLocked(context.DeadlineExceeded)
		}
	}
	return c.err
}

func (c *deadlineCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
		if c.err != nil {
			close(c.done)
			return c.done
		}
		c.timer = time.AfterFunc(time.Until(c.deadline), func() { c.end(context.DeadlineExceeded) })
		c.stopParent = context.AfterFunc(c.parent, func() { c.end(c.parent.Err()) })
	}
	return c.done
}

func (c *deadlineCtx) end(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.endLocked(err)
	}
}

// endLocked ends the context with err (c.err is nil; c.mu held).
func (c *deadlineCtx) endLocked(err error) {
	c.err = err
	if c.done == nil {
		c.done = closedChan
	} else {
		close(c.done)
	}
}

// release stops the timer and the watch on the parent, if Done made them.
func (c *deadlineCtx) release() {
	c.mu.Lock()
	t, stop := c.timer, c.stopParent
	c.timer, c.stopParent = nil, nil
	c.mu.Unlock()
	if t != nil {
		t.Stop()
	}
	if stop != nil {
		stop()
	}
}

// closedChan is the Done of a context that ended before anybody asked.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (c *deadlineCtx) String() string { return "actors.deadlineCtx" }
