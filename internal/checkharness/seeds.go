// Package checkharness is what the randomized model-based checkers share:
// the seed loop (a bounded default run, RESIDENCY_SOAK to run seeds for a
// duration, an environment variable naming one seed to replay), a
// recorder of violations and of the latest steps that prints them with
// the seed and the command that replays it, the measure of how long the
// process was kept from running (Lag), and the goroutine check at the end
// of a round. A checker keeps its model and its operations; the harness
// knows nothing of the runtime, so checkers inside package system can use
// it too.
package checkharness

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"
)

// SoakEnv names the environment variable holding the soak duration (a Go
// duration): while it has not passed since the loop began, Loop runs
// more seeds.
const SoakEnv = "RESIDENCY_SOAK"

// Soak returns the soak duration, 0 when SoakEnv is unset. A value that is
// not a Go duration fails t.
func Soak(t testing.TB) time.Duration {
	t.Helper()
	s := os.Getenv(SoakEnv)
	if s == "" {
		return 0
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("%s=%q: want a Go duration: %v", SoakEnv, s, err)
	}
	return d
}

// Checker names a checker for its seed loop and its replay command.
type Checker struct {
	// SeedEnv is the environment variable naming one seed to replay
	// alone (RESIDENCY_CACHE_SEED).
	SeedEnv string
	// Pattern is the -run pattern that replays a seed (TestCacheChecker/model).
	Pattern string
	// Package is the package to test, as `go test` takes it (./tests/).
	Package string
	// Seeds is how many seeds the bounded default run runs.
	Seeds int
	// Base is the first seed of the bounded run; 0 takes it from the
	// clock. Under a soak a non-zero Base is mixed with the clock, so a
	// soak runs seeds the default run does not.
	Base uint64
	// Stride is the distance between consecutive seeds (0: 1).
	Stride uint64
}

// Replay returns the command that replays seed.
func (c Checker) Replay(seed uint64) string {
	return fmt.Sprintf("%s=%d go test -race -count=1 -run '%s' %s", c.SeedEnv, seed, c.Pattern, c.Package)
}

// Replayed returns the seed SeedEnv names and true, or false when it is
// unset. A value that is not a uint64 fails t.
func (c Checker) Replayed(t testing.TB) (uint64, bool) {
	t.Helper()
	s := os.Getenv(c.SeedEnv)
	if s == "" {
		return 0, false
	}
	seed, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatalf("%s=%q: want a seed (a uint64): %v", c.SeedEnv, s, err)
	}
	return seed, true
}

// Summary is what a seed loop ran.
type Summary struct {
	Runs    int           // seeds run
	First   uint64        // the first seed
	Elapsed time.Duration // the loop's duration
	Failed  bool          // a seed failed: the loop stopped there
}

// Loop runs run once per seed: the seed SeedEnv names alone, or else
// Seeds seeds, and more while the soak has not passed. It stops at the
// first seed for which run returns false or after which t has failed,
// and logs the seed and the command that replays it, also when run stops
// the test (t.FailNow).
func (c Checker) Loop(t testing.TB, run func(seed uint64) bool) Summary {
	t.Helper()
	began := time.Now()
	if seed, ok := c.Replayed(t); ok {
		s := Summary{Runs: 1, First: seed, Failed: !c.one(t, seed, run)}
		s.Elapsed = time.Since(began)
		return s
	}
	soak := Soak(t)
	first := c.Base
	switch {
	case first == 0:
		first = uint64(began.UnixNano())
	case soak > 0:
		first ^= uint64(began.UnixNano())
	}
	stride := max(c.Stride, 1)
	s := Summary{First: first}
	for i := 0; i < c.Seeds || time.Since(began) < soak; i++ {
		seed := first + uint64(i)*stride
		s.Runs++
		if !c.one(t, seed, run) {
			s.Failed = true
			break
		}
	}
	s.Elapsed = time.Since(began)
	return s
}

// one runs one seed and says whether it passed; a seed that failed, by
// returning false, by failing t, or by stopping the test (t.FailNow) is
// logged with the command that replays it.
func (c Checker) one(t testing.TB, seed uint64, run func(seed uint64) bool) (passed bool) {
	t.Helper()
	returned := false
	defer func() {
		if !returned || !passed {
			t.Logf("seed %d failed; replay: %s", seed, c.Replay(seed))
		}
	}()
	passed = run(seed) && !t.Failed()
	returned = true
	return passed
}

// String is the summary for a test's log.
func (s Summary) String() string {
	return fmt.Sprintf("%d seeds from %d in %v", s.Runs, s.First, s.Elapsed.Round(time.Millisecond))
}
