package offload

import (
	"context"
	"math"
	"strings"
	"testing"

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
