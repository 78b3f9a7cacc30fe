package offload

import (
	"context"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
)

const head = "TIMESTAMP,ContextTokens,GeneratedTokens\n"

// TestRunRefusesBadConfig: a config out of range, or no rows, is an
// InvalidInputError before anything starts (a zero bytes per token used
// to divide by zero, no rows to index out of range).
func TestRunRefusesBadConfig(t *testing.T) {
	rows, err := ReadTrace(strings.NewReader(head+"2023-11-16 18:15:46.68,10,1\n"), 0)
	require.NoError(t, err)
	for _, c := range []struct {
		cfg  Config
		rows []Row
		want string
	}{
		{Config{BytesPerToken: 0, Speed: 1}, rows, "bytes per token 0"},
		{Config{BytesPerToken: RealBytesPerToken + 1, Speed: 1}, rows, "bytes per token"},
		{Config{BytesPerToken: 64, Speed: 0}, rows, "speed 0"},
		{Config{BytesPerToken: 64, Speed: math.NaN()}, rows, "speed NaN"},
		{Config{BytesPerToken: 64, Speed: math.Inf(1)}, rows, "speed +Inf"},
		{Config{BytesPerToken: 64, Speed: 1}, nil, "no requests"},
	} {
		rep, err := Run(context.Background(), c.cfg, c.rows)
		var inv *system.InvalidInputError
		require.ErrorAs(t, err, &inv, "%+v", c.cfg)
		assert.Contains(t, err.Error(), c.want)
		assert.Nil(t, rep)
	}
}

// TestRunSmallTrace: a run of three requests writes each one's KV (the
// first two arrive together), stays within every budget and ends with an
// empty queue.
func TestRunSmallTrace(t *testing.T) {
	rows, err := ReadTrace(strings.NewReader(head+
		"2023-11-16 18:15:46.00,300,20\n2023-11-16 18:15:46.00,40,4\n2023-11-16 18:15:47.00,100,10\n"), 0)
	require.NoError(t, err)
	rep, err := Run(context.Background(), Config{Trace: "small", BytesPerToken: 64, Speed: 1000}, rows)
	require.NoError(t, err)
	assert.Equal(t, "small", rep.Trace)
	assert.Equal(t, 3, rep.Requests)
	assert.Equal(t, int64(300+20+40+4+100+10), rep.Tokens)
	assert.Equal(t, int64((20+3+7)*BlockTokens*64), rep.KVBytes, "blocks of 16 tokens, rounded up")
	assert.Equal(t, rep.TasksOpened, rep.TasksWritten)
	assert.Zero(t, rep.TasksFailed)
	assert.Zero(t, rep.BudgetViolations)
	last := rep.Queue[len(rep.Queue)-1]
	assert.Zero(t, last.Pending+last.Queued+last.Copying+last.HostReady)
}

// TestRunStopsWithTheContext: a run whose context ended returns its error.
func TestRunStopsWithTheContext(t *testing.T) {
	rows, err := ReadTrace(strings.NewReader(head+"2023-11-16 18:15:46.00,30,2\n2023-11-16 19:15:46.00,30,2\n"), 0)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = Run(ctx, Config{BytesPerToken: 64, Speed: 1}, rows)
	assert.ErrorIs(t, err, context.Canceled)
}

// TestRunRefusesLongReplay: a run whose replay would span more than
// MaxTraceSpan of trace time (a timestamp in year 9999) or wait more than
// MaxWait (a speed of 1e-300) is refused before it starts, with a message
// saying which, never a wait of years in silence.
func TestRunRefusesLongReplay(t *testing.T) {
	far, err := ReadTrace(strings.NewReader(head+"2023-11-16 18:15:46.00,30,2\n9999-11-16 18:15:46.00,30,2\n"), 0)
	require.NoError(t, err)
	near, err := ReadTrace(strings.NewReader(head+"2023-11-16 18:15:46.00,30,2\n2023-11-16 18:15:47.00,30,2\n"), 0)
	require.NoError(t, err)
	for _, c := range []struct {
		cfg  Config
		rows []Row
		want string
	}{
		{Config{BytesPerToken: 64, Speed: 1e300}, far, "more than the 366 days a trace may span"},
		{Config{BytesPerToken: 64, Speed: 1e-300}, near, "at speed 1e-300 the run would wait"},
		{Config{BytesPerToken: 64, Speed: 1 / MaxWait.Seconds()}, near, "more than the 24 h a run may wait"},
	} {
		var progress strings.Builder
		c.cfg.Progress = &progress
		rep, err := Run(context.Background(), c.cfg, c.rows)
		var inv *system.InvalidInputError
		require.ErrorAs(t, err, &inv, "%+v", c.cfg)
		assert.Contains(t, err.Error(), c.want)
		assert.Nil(t, rep)
		assert.Empty(t, progress.String(), "nothing ran")
	}
	// A request refused for its size does not count: its decode (2·10^9
	// tokens, 463 days of trace time) never runs.
	big, err := ReadTrace(strings.NewReader(head+"2023-11-16 18:15:46.00,30,2\n2023-11-16 18:15:46.10,10,2000000000\n"), 0)
	require.NoError(t, err)
	rep, err := Run(context.Background(), Config{BytesPerToken: 64, Speed: 1000}, big)
	require.NoError(t, err)
	assert.Equal(t, 1, rep.RequestsRefused)
}

// TestRunShowsProgress: a run says what it replays when it starts, then
// how far it got while it waits for the trace's arrivals.
func TestRunShowsProgress(t *testing.T) {
	rows, err := ReadTrace(strings.NewReader(head+"2023-11-16 18:15:46.00,30,2\n2023-11-16 18:15:47.00,30,2\n"), 0)
	require.NoError(t, err)
	var progress lockedBuilder
	_, err = Run(context.Background(), Config{BytesPerToken: 64, Speed: 2, Progress: &progress, ProgressEvery: 20 * time.Millisecond}, rows)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSuffix(progress.String(), "\n"), "\n")
	require.GreaterOrEqual(t, len(lines), 2, "the run waits 0.5 s; a line every 20 ms:\n%s", progress.String())
	assert.Equal(t, "offload: replaying 2 requests: 1 s of trace time at speed 2, about 0.5 s", lines[0])
	assert.Regexp(t, `^offload: [01] s of 1 s of trace time, [12] of 2 requests arrived, 0 s waited$`, lines[1])
}

// lockedBuilder is a strings.Builder safe for concurrent use.
type lockedBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuilder) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuilder) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
