package diagnose

import (
	"context"
	"errors"

	"github.com/residency-go/residency/system"
)

// Capture takes the evidence of a failure that just happened on sys: a
// snapshot and the trace that form one state view (the trace ends at the
// snapshot's version), with err and the call op that failed. Call it
// right after the failing call returns, before any cleanup: releasing a
// lease, exiting a scope or retrying changes the very state the diagnosis
// must read.
//
// The two are read one after the other; when another caller commits in
// between, Capture reads both again (a few times at most). If they still
// differ, it returns what it read and [Diagnose] reports that the snapshot
// and trace are not one view. With the trace disabled the trace is empty.
// After Close the snapshot is the final one and the trace is empty. Errors:
// ctx's, or the runtime's ([*system.FatalError]).
func Capture(ctx context.Context, sys *system.System, err error, op Operation) (Evidence, error) {
	ev := Evidence{Err: err, Op: op}
	for attempt := 0; attempt < 4; attempt++ {
		snap, serr := sys.Snapshot(ctx)
		if serr != nil {
			return ev, serr
		}
		ev.Snapshot = snap
		tr, terr := sys.Trace(ctx)
		if errors.Is(terr, system.ErrClosed) {
			ev.Trace = nil // closed: the final snapshot, no trace
			return ev, nil
		}
		if terr != nil {
			return ev, terr
		}
		ev.Trace = tr
		if len(tr) == 0 || tr[len(tr)-1].Version == snap.StateVersion {
			return ev, nil
		}
	}
	return ev, nil
}
