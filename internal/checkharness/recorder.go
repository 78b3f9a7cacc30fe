package checkharness

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// keptProblems and keptSteps bound what a Recorder keeps to print.
const (
	keptProblems = 25
	keptSteps    = 64
)

// Recorder collects a round's violations, counted all and kept up to 25,
// and the latest 64 steps the checker noted: the history printed with a
// failure. Safe for concurrent use; its zero value is ready.
type Recorder struct {
	mu       sync.Mutex
	count    int
	problems []string
	steps    []string // a ring of the latest steps
	next     int      // where the next step goes once the ring is full
}

// Fail records a violation.
func (r *Recorder) Fail(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.count++
	if len(r.problems) < keptProblems {
		r.problems = append(r.problems, fmt.Sprintf(format, args...))
	}
}

// Note records a step of the history.
func (r *Recorder) Note(format string, args ...any) {
	s := fmt.Sprintf(format, args...)
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.steps) < keptSteps {
		r.steps = append(r.steps, s)
		return
	}
	r.steps[r.next] = s
	r.next = (r.next + 1) % keptSteps
}

// Failed returns how many violations were recorded and the kept ones.
func (r *Recorder) Failed() (int, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.count, append([]string(nil), r.problems...)
}

// History returns the latest steps noted, oldest first.
func (r *Recorder) History() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append(append([]string(nil), r.steps[r.next:]...), r.steps[:r.next]...)
}

// Report fails t with the violations, the history and the command that
// replays seed, and returns false; it returns true when none was
// recorded. what names the part of the checker that ran.
func (r *Recorder) Report(t testing.TB, c Checker, what string, seed uint64) bool {
	t.Helper()
	n, problems := r.Failed()
	if n == 0 {
		return true
	}
	msg := fmt.Sprintf("%s, seed %d: %d violations (replay: %s):\n  %s", what, seed, n, c.Replay(seed), strings.Join(problems, "\n  "))
	if h := r.History(); len(h) > 0 {
		msg += "\nlatest steps:\n  " + strings.Join(h, "\n  ")
	}
	t.Error(msg)
	return false
}

// Leaks returns an error naming the goroutines left running beyond the
// test's own, nil when there are none (checked at the end of a round,
// after everything it started has been let go). A goroutine that ends by
// itself within leakGrace is not a leak: protoactor's dead-letter
// throttle, for one, keeps a timer goroutine for a second after a
// message reaches a stopped actor, longer than goleak's own retries wait.
func Leaks() error {
	deadline := time.Now().Add(leakGrace)
	for {
		err := goleak.Find()
		if err == nil || time.Now().After(deadline) {
			return err
		}
	}
}

// leakGrace is how long Leaks lets goroutines end by themselves.
const leakGrace = 5 * time.Second
