package system

import "fmt"

// The loader cache's errors (package system/cache). They live here, with
// every other error of the runtime, so that [ErrorClass] classifies them
// in one place.

// ErrCacheClosed is returned by calls on a closed loader cache (the
// runtime may still be running): loads and evictions after the cache's
// Close, and a load that Close interrupted. errors.Is(err, [ErrClosed])
// also holds.
var ErrCacheClosed error = cacheClosedError{}

type cacheClosedError struct{}

func (cacheClosedError) Error() string { return "residency: cache is closed" }

// Is matches [ErrClosed].
func (cacheClosedError) Is(target error) bool { return target == ErrClosed }

// CacheBusyError is a loader cache's refusal that may succeed later: a
// load or a memory budget reservation found the location's budget short
// and nothing of the cache idle to evict (every entry leased, pinned, kept
// alive, not idle or loading, or the bytes held by other charges), or the
// cache's Evict found the entry in use or loading. It matches errors.Is(err, [ErrBusy])
// and is never a [*BudgetError] (a request larger than the whole budget
// is one).
type CacheBusyError struct {
	// Key is the key being loaded or evicted ("" for a memory budget
	// reservation).
	Key      string
	Location string
	// Refusal is the ledger's refusal that found no victim, with the
	// location's figures at that moment (nil for Evict and for the entry
	// cap).
	Refusal *BudgetError
	// MaxEntries is set when the refusal is the cache's entry cap
	// (cache.Options.MaxEntries): every entry is held, not idle or
	// loading, and a new key would exceed it.
	MaxEntries int
	// Waiters is set when a load that needs room and does not wait is
	// refused because that many callers already wait for room at
	// Location ahead of it (of its class or higher): it does not take
	// room they wait for. Wait ([WaitForRoom]) to queue behind them.
	Waiters int
}

func (e *CacheBusyError) Error() string {
	what := "memory budget reservation"
	if e.Key != "" {
		what = fmt.Sprintf("key %q", e.Key)
	}
	if e.MaxEntries > 0 {
		return fmt.Sprintf("residency cache busy: %s at %s: the cache holds its cap of %d entries and none is idle to evict", what, e.Location, e.MaxEntries)
	}
	if e.Waiters > 0 {
		return fmt.Sprintf("residency cache busy: %s needs room at %s, where %d callers already wait for room ahead of it", what, e.Location, e.Waiters)
	}
	if e.Refusal == nil {
		return fmt.Sprintf("residency cache busy: %s at %s is leased, pinned, kept alive, not idle or loading", what, e.Location)
	}
	r := e.Refusal
	if r.Shared != "" {
		return fmt.Sprintf("residency cache busy: %s needs %d bytes at %s (shared budget %q: %d, charged %d) and nothing idle is left to evict",
			what, r.RequestedBytes, r.Location, r.Shared, r.SharedBytes, r.SharedUsedBytes)
	}
	return fmt.Sprintf("residency cache busy: %s needs %d bytes at %s (budget %d, used %d, reserved %d) and nothing idle is left to evict",
		what, r.RequestedBytes, r.Location, r.BudgetBytes, r.UsedBytes, r.ReservedBytes)
}

// Is matches [ErrBusy].
func (e *CacheBusyError) Is(target error) bool { return target == ErrBusy }

// CacheLoadError is a failed load: the loader returned an error (Cause),
// panicked (Panic and Stack), or reported resident bytes ≤ 0 or above its
// peak (Cause, an [*InvalidInputError]). The load's reservation was
// released; every caller that shared the load got this error, and the
// next Load of the key runs the loader again. Unwrap returns Cause.
type CacheLoadError struct {
	Key   string
	Cause error
	Panic any
	Stack string
}

func (e *CacheLoadError) Error() string {
	if e.Panic != nil {
		return fmt.Sprintf("residency cache: loader of %q panicked: %v", e.Key, e.Panic)
	}
	return fmt.Sprintf("residency cache: loading %q failed: %v", e.Key, e.Cause)
}

func (e *CacheLoadError) Unwrap() error { return e.Cause }
