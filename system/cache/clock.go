package cache

import "time"

// Clock is the time source of a [Cache]'s keep-alive ([Options].Clock):
// the time of each use, and a timer for the earliest expiry. The cache
// never polls: it checks expiries on its own operations and when the
// timer fires. Tests pass a fake clock that they advance.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// AfterFunc calls f in its own goroutine once d has passed, unless
	// the returned timer is stopped first (as time.AfterFunc).
	AfterFunc(d time.Duration, f func()) ClockTimer
}

// ClockTimer is a timer made by [Clock.AfterFunc].
type ClockTimer interface {
	// Stop prevents the call if it has not started; it reports whether it
	// did (as time.Timer.Stop).
	Stop() bool
}

// RealClock is the process's clock (package time): the default [Clock].
type RealClock struct{}

// realBase is the time RealClock counts from: read once, as the package
// is initialized, with its wall and monotonic readings.
var realBase = time.Now()

// Now returns the current time: the wall time when the package was
// initialized plus the monotonic time elapsed since. That is one read of
// the monotonic clock where time.Now reads two clocks (a cache reads the
// time on every hit and every release). Its monotonic reading is
// time.Now's; its wall reading does not follow steps of the system's
// wall clock made after the package was initialized.
func (RealClock) Now() time.Time { return realBase.Add(time.Since(realBase)) }

// AfterFunc is time.AfterFunc.
func (RealClock) AfterFunc(d time.Duration, f func()) ClockTimer { return time.AfterFunc(d, f) }
