package kvtrace

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func read(t *testing.T, s string, lim Limits) *Trace {
	t.Helper()
	tr, err := Read(strings.NewReader(s), lim)
	require.NoError(t, err)
	return tr
}

func TestReadNumbersBlocksInOrderOfFirstUse(t *testing.T) {
	tr := read(t, `{"timestamp": 5, "input_length": 1024, "output_length": 3, "hash_ids": [70, 71, 72]}

{"hash_ids": [71, 9, 71], "extra": {"ignored": true}, "timestamp": null}
`, Limits{})
	require.Equal(t, []Request{
		{Timestamp: 5, InputLength: 1024, OutputLength: 3, Blocks: []int32{0, 1, 2}},
		{Blocks: []int32{1, 3}},
	}, tr.Requests)
	require.Equal(t, []int64{70, 71, 72, 9}, tr.IDs)
	require.Equal(t, int64(5), tr.Uses)
	require.Equal(t, int64(1), tr.Repeats)
	require.Equal(t, 4, tr.Blocks())
}

func TestReadLimits(t *testing.T) {
	two := "{\"hash_ids\": [1]}\n{\"hash_ids\": [2]}\n{\"hash_ids\": [3]}\n"
	require.Len(t, read(t, two, Limits{MaxRequests: 2}).Requests, 2)
	for _, c := range []struct {
		name string
		in   string
		lim  Limits
		line int
		text string
	}{
		{"line too long", "{\"hash_ids\": [1]}\n{\"hash_ids\": [" + strings.Repeat("1,", 40) + "1]}\n", Limits{MaxLineBytes: 40}, 2, "a line longer than 40 bytes"},
		{"request too large", `{"hash_ids": [1, 2, 3]}`, Limits{MaxRequestBlocks: 2}, 1, "3 hash ids in one request (at most 2)"},
		{"trace too large", two, Limits{MaxUses: 2}, 3, "more than 2 block uses"},
	} {
		_, err := Read(strings.NewReader(c.in), c.lim)
		var le *LineError
		require.ErrorAs(t, err, &le, c.name)
		require.Equal(t, c.line, le.Line, c.name)
		require.ErrorIs(t, err, ErrTooLong, c.name)
		require.Contains(t, err.Error(), c.text, c.name)
	}
}

func TestReadErrorsNameTheLine(t *testing.T) {
	for _, c := range []struct{ in, text string }{
		{`[1, 2]`, "line 2: not a JSON object of a request"},
		{`{"hash_ids": [1]} {"hash_ids": [2]}`, "line 2: more than one JSON value on the line"},
		{`{"timestamp": 1}`, "line 2: hash_ids is missing or empty"},
		{`{"hash_ids": []}`, "line 2: hash_ids is missing or empty"},
		{`{"hash_ids": [1, -2]}`, "line 2: hash_ids[1] is -2: want an integer from 0 to"},
		{`{"hash_ids": [1.5]}`, "line 2: hash_ids[0] is 1.5: want an integer"},
		{`{"hash_ids": ["x"]}`, "line 2: not a JSON object of a request"},
		{`{"hash_ids": [1], "input_length": -1}`, "line 2: input_length is -1"},
		{`{"hash_ids": [1], "timestamp": 1e30}`, "line 2: timestamp is 1e30"},
		{`{"hash_ids": [99999999999999999999]}`, "line 2: hash_ids[0] is 99999999999999999999"},
		{`{"hash_ids": [1]`, "line 2: not a JSON object of a request"},
	} {
		_, err := Read(strings.NewReader("{\"hash_ids\": [7]}\n"+c.in+"\n"), Limits{})
		require.Error(t, err, c.in)
		require.Contains(t, err.Error(), c.text, c.in)
	}
	_, err := Read(strings.NewReader("\n \n"), Limits{})
	require.EqualError(t, err, "the trace has no request")
	_, err = Read(errReader{}, Limits{})
	require.ErrorIs(t, err, errBroken)
}

var errBroken = errors.New("broken")

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errBroken }

// The repository's copy of the synthetic trace has the figures its README
// gives.
func TestReadSyntheticTrace(t *testing.T) {
	tr := syntheticTrace(t)
	require.Len(t, tr.Requests, 3993)
	require.Equal(t, int64(121877), tr.Uses)
	require.Equal(t, 43924, tr.Blocks())
	require.Zero(t, tr.Repeats)
}

func syntheticTrace(t testing.TB) *Trace {
	t.Helper()
	f, err := os.Open("../../data/mooncake_synthetic_trace.jsonl")
	require.NoError(t, err)
	defer f.Close()
	tr, err := Read(f, Limits{})
	require.NoError(t, err)
	return tr
}

func FuzzReadTrace(f *testing.F) {
	f.Add([]byte(`{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1, 2, 3]}` + "\n" + `{"hash_ids": [2, 4]}`))
	f.Add([]byte(`{"hash_ids": [1, 1, 1]}`))
	f.Add([]byte(`{"hash_ids": [-1]}`))
	f.Add([]byte("\n\n{\"hash_ids\": [1e3]}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		tr, err := Read(strings.NewReader(string(data)), Limits{MaxLineBytes: 1 << 12, MaxRequestBlocks: 64, MaxUses: 512})
		if err != nil {
			require.NotEmpty(t, err.Error())
			return
		}
		var uses int64
		for _, r := range tr.Requests {
			require.NotEmpty(t, r.Blocks)
			seen := map[int32]bool{}
			for _, b := range r.Blocks {
				require.True(t, b >= 0 && int(b) < tr.Blocks())
				require.False(t, seen[b], "a block twice in one request")
				seen[b] = true
			}
			uses += int64(len(r.Blocks))
		}
		require.Equal(t, uses, tr.Uses)
		require.LessOrEqual(t, tr.Uses, int64(512))
		// The policies accept whatever Read accepts.
		l, o := LRU(tr, 8), Belady(tr, 8)
		require.Equal(t, tr.Uses, l.Uses)
		require.Equal(t, tr.Uses, o.Uses)
		require.GreaterOrEqual(t, o.GPUHits, l.GPUHits)
	})
}
