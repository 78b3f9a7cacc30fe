package replay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/residency-go/residency/system"
)

// Options adjust Run.
type Options struct {
	// Hooks are set on the runner before the first op runs.
	Hooks Hooks

	afterExec func() // tests: Runner.afterExec
}

// Summary is what Run reports of a script that ran.
type Summary struct {
	// Ops is the number of ops that ran, start included.
	Ops int
	// Failed are the results whose line's expectation did not hold, in
	// script order.
	Failed []Result
	// Outstanding is Close's note of the leases, holds, cache leases and
	// pins the script left taken (they were released); nil when none.
	// It matches *system.OutstandingError (errors.As). It is not a
	// failure.
	Outstanding error
}

// Run checks the whole script, then runs it on a fresh runtime (see
// Start) and writes one JSON line per op to w as it finishes: the output
// of `demo replay --json`. The script is read into memory first, so that
// a malformed line anywhere runs nothing.
//
// The error is a *ScriptError for a malformed script (nothing ran); the
// runtime's error when it refused to start; ctx's error when ctx ended
// (the results of the ops that finished were written); an error writing
// to w; or Close's error other than what the script left held. Failed
// expectations are not errors: see Summary.Failed.
func Run(ctx context.Context, script io.Reader, w io.Writer, opts Options) (Summary, error) {
	var sum Summary
	data, err := io.ReadAll(script)
	if err != nil {
		return sum, err
	}
	if _, err := Check(ctx, bytes.NewReader(data), nil); err != nil {
		return sum, err
	}
	sr := NewReader(ctx, bytes.NewReader(data), nil)
	start, _, err := sr.Next()
	if err != nil {
		return sum, err
	}
	r, err := Start(ctx, start)
	if err != nil {
		return sum, fmt.Errorf("line %d: bad start: %w", start.Line, err)
	}
	r.SetHooks(opts.Hooks)
	r.afterExec = opts.afterExec
	out := NewJSONWriter(w)
	runErr := runOps(ctx, r, sr, start, out, &sum)
	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
	defer cancel()
	cerr := r.Close(closeCtx)
	var oe *system.OutstandingError
	switch {
	case errors.As(cerr, &oe):
		sum.Outstanding = cerr
	case cerr != nil && runErr == nil:
		runErr = fmt.Errorf("closing the runtime: %w", cerr)
	}
	return sum, runErr
}

// runOps runs the ops after start, writing each result.
func runOps(ctx context.Context, r *Runner, sr *Reader, start Op, out *JSONWriter, sum *Summary) error {
	for o, ok := start, true; ok; {
		res := Result{Line: o.Line, Op: o.Name, OK: true}
		if sum.Ops > 0 {
			res = r.Do(ctx, o)
		}
		if ctx.Err() != nil && res.err != nil && isContextError(res.err) {
			return res.err // cut short: no result to show
		}
		sum.Ops++
		if o.Expect != "" {
			res.Expect = o.Expect
			if !Matches(o.Expect, &res) {
				sum.Failed = append(sum.Failed, res)
			}
		}
		if err := out.Write(&res); err != nil {
			return err
		}
		var err error
		if o, ok, err = sr.Next(); err != nil {
			return err
		}
	}
	return out.Flush()
}
