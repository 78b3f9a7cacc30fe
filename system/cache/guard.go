package cache

import (
	"context"
	"errors"
	"runtime"
	"runtime/debug"
	"weak"

	"github.com/residency-go/residency/system"
)

// errGoexit is the panic value reported for application code that called
// runtime.Goexit (t.FailNow in a test's loader or Demote) instead of
// returning.
var errGoexit = errors.New("called runtime.Goexit instead of returning (t.FailNow or t.SkipNow in a test?)")

// guarded runs fn, application code, on a goroutine of its own and waits
// for it. A panic is recovered (panicked true, with the value and the
// goroutine's stack); a runtime.Goexit ends only that goroutine and is
// reported like a panic whose value is errGoexit. Either way the caller
// carries on and settles what fn was for.
func guarded(fn func()) (panicked bool, value any, stack string) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		returned := false
		defer func() {
			if r := recover(); r != nil {
				panicked, value, stack = true, r, string(debug.Stack())
			} else if !returned {
				panicked, value, stack = true, errGoexit, string(debug.Stack())
			}
		}()
		fn()
		returned = true
	}()
	<-done
	return panicked, value, stack
}

// closeOnRuntimeClose registers c's Close with sys (system.System.OnClose):
// closing the runtime closes the cache first. The registration holds c
// weakly and goes when c is garbage.
func closeOnRuntimeClose(sys *system.System, c *Cache) {
	w := weak.Make(c)
	unregister := sys.OnClose("cache "+c.owner, func(ctx context.Context) error {
		if c := w.Value(); c != nil {
			return c.Close(ctx)
		}
		return nil
	})
	runtime.AddCleanup(c, func(f func()) { f() }, unregister)
}
