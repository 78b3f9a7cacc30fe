package checkharness

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var testChecker = Checker{SeedEnv: "CHECKHARNESS_TEST_SEED", Pattern: "TestX/model", Package: "./x/", Seeds: 3, Base: 10, Stride: 7}

func TestLoopRunsTheBoundedSeeds(t *testing.T) {
	t.Setenv(SoakEnv, "")
	t.Setenv(testChecker.SeedEnv, "")
	var seeds []uint64
	s := testChecker.Loop(t, func(seed uint64) bool { seeds = append(seeds, seed); return true })
	require.Equal(t, []uint64{10, 17, 24}, seeds)
	assert.Equal(t, 3, s.Runs)
	assert.False(t, s.Failed)
}

func TestLoopReplaysTheSeedItsVariableNames(t *testing.T) {
	t.Setenv(testChecker.SeedEnv, "42")
	var seeds []uint64
	s := testChecker.Loop(t, func(seed uint64) bool { seeds = append(seeds, seed); return true })
	require.Equal(t, []uint64{42}, seeds)
	assert.Equal(t, uint64(42), s.First)
}

func TestLoopStopsAtTheFirstFailingSeed(t *testing.T) {
	t.Setenv(SoakEnv, "")
	t.Setenv(testChecker.SeedEnv, "")
	var seeds []uint64
	s := testChecker.Loop(t, func(seed uint64) bool { seeds = append(seeds, seed); return seed != 17 })
	require.Equal(t, []uint64{10, 17}, seeds)
	assert.True(t, s.Failed)
}

func TestReplayIsTheCommand(t *testing.T) {
	assert.Equal(t, "CHECKHARNESS_TEST_SEED=5 go test -race -count=1 -run 'TestX/model' ./x/", testChecker.Replay(5))
}

func TestRecorderKeepsTheLatestSteps(t *testing.T) {
	var r Recorder
	for i := range keptSteps + 3 {
		r.Note("step %d", i)
	}
	h := r.History()
	require.Len(t, h, keptSteps)
	assert.Equal(t, "step 3", h[0])
	assert.Equal(t, fmt.Sprintf("step %d", keptSteps+2), h[keptSteps-1])
	for i := range keptProblems + 5 {
		r.Fail("problem %d", i)
	}
	n, problems := r.Failed()
	assert.Equal(t, keptProblems+5, n)
	assert.Len(t, problems, keptProblems)
	assert.True(t, (&Recorder{}).Report(t, testChecker, "model", 1), "no violation: no report")
}
