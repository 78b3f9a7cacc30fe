package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/internal/offload"
)

const repoTrace = "../../data/AzureLLMInferenceTrace_conv.csv"

// TestOffloadTracePrefix runs demo offload on the first 200 requests of
// the real trace and checks the report's invariants (not its timings).
func TestOffloadTracePrefix(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"offload", "--trace", repoTrace, "--limit", "200", "--speed", "5000", "--json"}, strings.NewReader(""), &out, &errb)
	require.Equal(t, 0, code, errb.String())
	var rep offload.Report
	require.NoError(t, json.Unmarshal(out.Bytes(), &rep), out.String())

	assert.Equal(t, 200, rep.Requests)
	assert.Contains(t, rep.Simulation, "soft backend")
	assert.Equal(t, int64(64), rep.BytesPerToken)
	assert.Equal(t, int64(8192), rep.Scale, "64 B per token stands for 512 KiB")
	assert.Positive(t, rep.Tokens)
	assert.Equal(t, rep.Tokens > 0, rep.KVBytes >= rep.Tokens*rep.BytesPerToken, "blocks round tokens up")
	assert.Positive(t, rep.OffloadedBytes)
	assert.LessOrEqual(t, rep.OffloadedBytes+rep.DroppedBytes, rep.KVBytes)
	assert.GreaterOrEqual(t, rep.TasksOpened, int64(rep.Requests), "one task per request at least")
	assert.Equal(t, rep.TasksOpened, rep.TasksWritten+rep.TasksFailed)
	assert.Zero(t, rep.TasksFailed)
	assert.Equal(t, rep.AppendsRefused, rep.TasksOpened-int64(rep.Requests), "a second write per refused decode save")
	assert.Positive(t, rep.Samples)
	assert.Len(t, rep.Queue, rep.Samples)
	assert.Zero(t, rep.BudgetViolations, "used + reserved ≤ budget at every location on every sample")
	assert.LessOrEqual(t, rep.PeakCloneBytes, rep.CloneBudgetBytes)
	assert.Contains(t, rep.Drops, "gpu-budget")
	assert.Contains(t, rep.Drops, "location-budget")
	for _, b := range rep.Budgets {
		assert.LessOrEqual(t, b.PeakBytes, b.Budget, b.Location)
	}
	// How far behind the trace clock, and the CPU used: figures, not timed.
	assert.GreaterOrEqual(t, rep.BehindSeconds, 0.0)
	assert.LessOrEqual(t, rep.BehindSeconds, rep.WallSeconds)
	assert.GreaterOrEqual(t, rep.LiveAtLastArrival, 0)
	assert.LessOrEqual(t, int64(rep.LiveAtLastArrival), rep.TasksOpened)
	if runtime.GOOS != "windows" && runtime.GOOS != "plan9" && runtime.GOOS != "js" && runtime.GOOS != "wasip1" {
		assert.Positive(t, rep.CPUSeconds, "getrusage is known on unix")
	}
	last := rep.Queue[len(rep.Queue)-1]
	assert.Zero(t, last.Pending+last.Queued+last.Copying+last.HostReady, "the last sample is after Close")
	assert.Zero(t, last.CloneBytes)
}

// TestOffloadText: the text report says what it simulates and scales.
func TestOffloadText(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"offload", "--trace", repoTrace, "--limit", "50", "--speed", "5000"}, strings.NewReader(""), &out, &errb)
	require.Equal(t, 0, code, errb.String())
	for _, want := range []string{"KV-cache offload of 50 requests", "simulation: soft backend", "standing for 512 KiB per token of a 7B fp16 model",
		"budget flushes", "queue depth", "behind the trace clock at the end: ", "process CPU time ", "budget violations (used + reserved > budget, any location, any sample): 0"} {
		assert.Contains(t, out.String(), want)
	}
}

// TestOffloadArgs: bad flags and traces exit 2 with a message.
func TestOffloadArgs(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.csv")
	require.NoError(t, os.WriteFile(bad, []byte("when,ctx,gen\n1,2,3\n"), 0o644))
	back := filepath.Join(dir, "back.csv")
	require.NoError(t, os.WriteFile(back, []byte("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,1,1\n2023-11-16 18:15:45.0,1,1\n"), 0o644))
	for _, args := range [][]string{
		{"offload", "--speed", "0"},
		{"offload", "--bytes-per-token", "0"},
		{"offload", "extra"},
		{"offload", "--trace", filepath.Join(dir, "missing.csv")},
		{"offload", "--trace", bad},
		{"offload", "--trace", back},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), args, strings.NewReader(""), &out, &errb)
		assert.Equal(t, 2, code, "%v", args)
		assert.NotEmpty(t, errb.String(), "%v", args)
	}
}

// TestOffloadFromAnyDirectory: without --trace, demo offload replays the
// trace built into the command, from any working directory (it does not
// open data/… relative to the working directory).
func TestOffloadFromAnyDirectory(t *testing.T) {
	t.Chdir(t.TempDir())
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"offload", "--limit", "30", "--speed", "5000", "--json"}, strings.NewReader(""), &out, &errb)
	require.Equal(t, 0, code, errb.String())
	var rep offload.Report
	require.NoError(t, json.Unmarshal(out.Bytes(), &rep))
	assert.Equal(t, "data/AzureLLMInferenceTrace_conv.csv (built in)", rep.Trace)
	assert.Equal(t, 30, rep.Requests)
	assert.Contains(t, errb.String(), "offload: replaying 30 requests:", "progress on standard error")
}

// TestOffloadRefusesAReplayOfYears: a trace with a timestamp in year 9999,
// or a speed of 1e-300, is refused at once with exit status 2 and a
// message, never a wait of years in silence.
func TestOffloadRefusesAReplayOfYears(t *testing.T) {
	far := writeFile(t, t.TempDir(), "far.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.00,30,2\n9999-12-31 23:59:59.00,30,2\n")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--trace", far}, "more than the 366 days a trace may span: check its timestamps (" + far + ")"},
		{[]string{"--speed", "1e-300", "--limit", "3"}, "at speed 1e-300 the run would wait"},
		{[]string{"--speed", "0.01"}, "more than the 24 h a run may wait"},
	} {
		code, out, errs := runDemo(t, append([]string{"offload"}, c.args...)...)
		assert.Equal(t, 2, code, "%v: %s", c.args, errs)
		assert.Empty(t, out)
		assert.Contains(t, errs, c.want, "%v", c.args)
	}
}
