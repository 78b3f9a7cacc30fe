package system

import "errors"

// ErrorKind is the class of an error, as [ErrorClass] finds it: one
// vocabulary for the diagnosis (package system/diagnose), the metrics'
// class label (package system/metrics), the replay CLI's error type and
// the cluster nodes' replies. String gives the stable name the JSON and
// text outputs print.
type ErrorKind uint8

// The classes of error. Each names the [errors.As] target that has it.
const (
	// ErrorOther: none of the classes below ("Error"): a device or
	// loader failure, a context that ended, a stopped or closed runtime.
	ErrorOther ErrorKind = iota
	// ErrorBudget: a [*BudgetError] ("ResidencyBudgetError").
	ErrorBudget
	// ErrorPlan: a [*PlanError] ("ResidencyPlanError").
	ErrorPlan
	// ErrorSearchLimit: a [*SearchLimitError]
	// ("ResidencySearchLimitError"), a special case of a plan error.
	ErrorSearchLimit
	// ErrorStaleState: a [*StaleStateError] ("ResidencyStaleStateError"),
	// a special case of a plan error.
	ErrorStaleState
	// ErrorInUse: an [*InUseError] ("ResidencyInUseError").
	ErrorInUse
	// ErrorUnavailable: an [*UnavailableError]
	// ("ResidencyUnavailableError").
	ErrorUnavailable
	// ErrorPlanExecution: a [*PlanExecutionError]
	// ("ResidencyPlanExecutionError"), a sibling of a plan error.
	ErrorPlanExecution
	// ErrorInvalidInput: an [*InvalidInputError] ("InvalidInput").
	ErrorInvalidInput
	// ErrorCacheBusy: a [*CacheBusyError] ("ResidencyCacheBusyError").
	ErrorCacheBusy
	// ErrorCacheLoad: a [*CacheLoadError] ("ResidencyCacheLoadError").
	ErrorCacheLoad

	numErrorKinds
)

// errorKindNames are the stable names: String's, and the replay output's
// error types.
var errorKindNames = [numErrorKinds]string{
	ErrorOther:         "Error",
	ErrorBudget:        "ResidencyBudgetError",
	ErrorPlan:          "ResidencyPlanError",
	ErrorSearchLimit:   "ResidencySearchLimitError",
	ErrorStaleState:    "ResidencyStaleStateError",
	ErrorInUse:         "ResidencyInUseError",
	ErrorUnavailable:   "ResidencyUnavailableError",
	ErrorPlanExecution: "ResidencyPlanExecutionError",
	ErrorInvalidInput:  "InvalidInput",
	ErrorCacheBusy:     "ResidencyCacheBusyError",
	ErrorCacheLoad:     "ResidencyCacheLoadError",
}

// errorKindTypes are the Go type names (without the package), as the
// cluster nodes' replies name them.
var errorKindTypes = [numErrorKinds]string{
	ErrorBudget:        "BudgetError",
	ErrorPlan:          "PlanError",
	ErrorSearchLimit:   "SearchLimitError",
	ErrorStaleState:    "StaleStateError",
	ErrorInUse:         "InUseError",
	ErrorUnavailable:   "UnavailableError",
	ErrorPlanExecution: "PlanExecutionError",
	ErrorInvalidInput:  "InvalidInputError",
	ErrorCacheBusy:     "CacheBusyError",
	ErrorCacheLoad:     "CacheLoadError",
}

// ErrorKinds lists every class, ErrorOther first.
func ErrorKinds() []ErrorKind {
	out := make([]ErrorKind, numErrorKinds)
	for i := range out {
		out[i] = ErrorKind(i)
	}
	return out
}

// String is the class's stable name: "ResidencyBudgetError",
// "ResidencyPlanError", "ResidencySearchLimitError",
// "ResidencyStaleStateError", "ResidencyInUseError",
// "ResidencyUnavailableError", "ResidencyPlanExecutionError",
// "InvalidInput", "ResidencyCacheBusyError", "ResidencyCacheLoadError",
// or "Error" (ErrorOther, and any value out of range).
func (k ErrorKind) String() string {
	if k >= numErrorKinds {
		return errorKindNames[ErrorOther]
	}
	return errorKindNames[k]
}

// TypeName is the Go name of the class's error type without its package
// ("BudgetError", "InvalidInputError", …); "" for ErrorOther.
func (k ErrorKind) TypeName() string {
	if k >= numErrorKinds {
		return ""
	}
	return errorKindTypes[k]
}

// MarshalText writes the class as [ErrorKind.String].
func (k ErrorKind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// ErrorClass returns the class of the outermost classified error in err's
// chain (walked with [errors.Unwrap]), or ErrorOther. The walk goes from
// the outside in, so a [*PlanExecutionError] is classed as such although
// its cause (a [*BudgetError], say) is further down the chain, and a
// [*CacheLoadError] as such whatever its loader returned. A nil err is
// ErrorOther.
//
// This is the one place that lists the errors package system exports:
//
//   - classed by their own type: [*BudgetError], [*PlanError],
//     [*SearchLimitError], [*StaleStateError], [*InUseError],
//     [*UnavailableError], [*PlanExecutionError], [*InvalidInputError],
//     [*CacheBusyError], [*CacheLoadError];
//   - ErrorOther: [*FatalError] (the runtime stopped; every later call
//     returns it), [*ActorCrashError] (an actor panicked; the effect
//     failed), [*AllocTimeoutError] (an allocation did not finish in
//     time; matches context.DeadlineExceeded), [*OutstandingError] (Close
//     released leases, holds or events the application forgot),
//     [*QueueFullError] (the wait queue is full; matches [ErrBusy]),
//     [*WaitersAheadError] (a call that does not wait needs room that
//     earlier waiters wait for; matches [ErrBusy]),
//     [*ChargeBusyError] (a cache entry a plan was dropping was taken in
//     between; matches [ErrBusy]; the cause of a [*PlanExecutionError]),
//     the sentinel [ErrClosed], and, from package system/cluster,
//     *cluster.PlacementError (no node admitted a placement);
//   - the categories for [errors.Is]: [ErrPlan] (plan, search-limit and
//     stale-state errors), [ErrBusy] (in-use errors, unavailable errors
//     with reason UnavailableInFlight, cache-busy errors),
//     [ErrInvalidInput], [ErrDiscarded], [ErrForeign].
func ErrorClass(err error) ErrorKind {
	k, _ := ClassifiedError(err)
	return k
}

// ClassifiedError is [ErrorClass] with the error of err's chain that has
// the class (err itself for ErrorOther), for reading its fields.
//
// An error type of another package takes a class by having a method
// ErrorClass() ErrorKind (package system/diagnose's errors read back from
// evidence files do).
func ClassifiedError(err error) (ErrorKind, error) {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if k := kindOf(e); k != ErrorOther {
			return k, e
		}
	}
	return ErrorOther, err
}

// kindOf is the class of e itself, not of its chain.
func kindOf(e error) ErrorKind {
	switch e.(type) {
	case *BudgetError:
		return ErrorBudget
	case *PlanError:
		return ErrorPlan
	case *SearchLimitError:
		return ErrorSearchLimit
	case *StaleStateError:
		return ErrorStaleState
	case *InUseError:
		return ErrorInUse
	case *UnavailableError:
		return ErrorUnavailable
	case *PlanExecutionError:
		return ErrorPlanExecution
	case *InvalidInputError:
		return ErrorInvalidInput
	case *CacheBusyError:
		return ErrorCacheBusy
	case *CacheLoadError:
		return ErrorCacheLoad
	}
	if c, ok := e.(interface{ ErrorClass() ErrorKind }); ok {
		return c.ErrorClass()
	}
	return ErrorOther
}
