package nodeproc

import (
	"bytes"
	"context"
	"errors"
	"math"
	"runtime"
	"strings"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/internal/testsys"
	"github.com/residency-go/residency/system"
)

// TestServeRefusesAndKeepsServing: lines that are no command are answered
// in order with their InvalidInputError reply (a blank line with none), a
// command that hits a bug (here: a server without a node) is answered
// with an InternalError reply and logged, and Serve returns when its
// input ends; the reply bytes are those `demo node` has always written.
func TestServeRefusesAndKeepsServing(t *testing.T) {
	var out, logs bytes.Buffer
	s := NewServer(nil, &out, zerolog.New(&logs))
	in := strings.Join([]string{
		`not json`,
		``,
		`{"id":7,"op":"explode"}`,
		`{"id":8,"op":"register","name":"a","bytes":-5,"at":"cuda:0"}`,
		strings.Repeat(" ", 2*maxCommandLine),
		`{"id":9,"op":"members"}`,
	}, "\n")
	s.Serve(context.Background(), strings.NewReader(in))
	s.Stop()
	want := `{"id":0,"op":"?","ok":false,"error":"malformed command: column 1: unexpected character 'n': want a value (object, array, string, number, true, false or null)","error_type":"InvalidInputError","elapsed_ms":0}
{"id":7,"op":"?","ok":false,"error":"malformed command: unknown op \"explode\" (known: copy, discard, inspect, members, place, read, refresh, register, release, summaries, whereis)","error_type":"InvalidInputError","elapsed_ms":0}
{"id":8,"op":"register","ok":false,"error":"malformed command: op \"register\": field \"bytes\": must be \u003e 0, got -5","error_type":"InvalidInputError","elapsed_ms":0}
{"id":0,"op":"?","ok":false,"error":"malformed command: the line is longer than 64 KiB, the most one command may hold","error_type":"InvalidInputError","elapsed_ms":0}
{"id":9,"op":"members","ok":false,"error":"internal error: runtime error: invalid memory address or nil pointer dereference","error_type":"InternalError","elapsed_ms":0}
`
	assert.Equal(t, want, out.String())
	assert.Contains(t, logs.String(), "a command failed on a bug")
}

// TestServeAfterStop: once stopped, a server runs no further command.
func TestServeAfterStop(t *testing.T) {
	var out bytes.Buffer
	s := NewServer(nil, &out, zerolog.Nop())
	s.Stop()
	s.Serve(context.Background(), strings.NewReader(`{"id":1,"op":"members"}`+"\n"+`{"id":2,"op":"members"}`))
	assert.Empty(t, out.String())
}

type failingWriter struct{ writes int }

func (w *failingWriter) Write([]byte) (int, error) {
	w.writes++
	return 0, errors.New("standard output closed")
}

// TestWriteLineKeepsTheFirstError: after a failed write nothing more is
// written, the error is returned again and logged once.
func TestWriteLineKeepsTheFirstError(t *testing.T) {
	var logs bytes.Buffer
	w := &failingWriter{}
	s := NewServer(nil, w, zerolog.New(&logs))
	err := s.WriteLine(map[string]any{"event": "ready"})
	require.EqualError(t, err, "standard output closed")
	s.Serve(context.Background(), strings.NewReader("not json\n"))
	require.EqualError(t, s.WriteLine(Ready{Event: "ready"}), "standard output closed")
	assert.Equal(t, 1, w.writes)
	assert.Equal(t, 1, strings.Count(logs.String(), "no further replies can be sent"))
}

// TestRegisterPatternAdmitsFirst: register never panics on its size
// (bytes -5 and 2^63−1 are refused, the node stays up), and makes no byte
// of a value its location's budget refuses: the runtime's refusal comes
// first (256 MiB at an 8 MiB cuda:0 allocates nothing).
func TestRegisterPatternAdmitsFirst(t *testing.T) {
	ctx := context.Background()
	locs := []system.LocationConfig{system.NoLimit("pageable-host"), system.Limit("cuda:0", 8<<20)}
	sys, err := system.Start(ctx, system.Options{ManagerID: "node-test", Locations: locs, Backend: testsys.Soft(t, locs)})
	require.NoError(t, err)
	defer func() { require.NoError(t, sys.Close(ctx)) }()

	var inv *system.InvalidInputError
	var be *system.BudgetError
	_, err = registerPattern(ctx, sys, Command{Op: "register", Name: "neg", Bytes: -5, At: "cuda:0"})
	require.ErrorAs(t, err, &inv)
	_, err = registerPattern(ctx, sys, Command{Op: "register", Name: "max", Bytes: math.MaxInt64, At: "cuda:0"})
	require.ErrorAs(t, err, &be)
	_, err = registerPattern(ctx, sys, Command{Op: "register", Name: "max", Bytes: math.MaxInt64, Source: "cuda:0"})
	require.ErrorAs(t, err, &inv, "never fits the budget of its source")
	_, err = registerPattern(ctx, sys, Command{Op: "register", Name: "max", Bytes: math.MaxInt64, At: "pageable-host"})
	require.ErrorAs(t, err, &inv, "a location without a budget takes at most maxUnbudgetedPattern")
	assert.Contains(t, err.Error(), "has no budget")
	_, err = registerPattern(ctx, sys, Command{Op: "register", Name: "max", Bytes: maxUnbudgetedPattern + 1, Source: "pageable-host"})
	require.ErrorAs(t, err, &inv)

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err = registerPattern(ctx, sys, Command{Op: "register", Name: "big", Bytes: 256 << 20, At: "cuda:0"})
	runtime.ReadMemStats(&after)
	require.ErrorAs(t, err, &be)
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(32<<20), "bytes allocated before the budget refused 256 MiB")

	sum, err := registerPattern(ctx, sys, Command{Op: "register", Name: "w", Bytes: 1 << 20, At: "cuda:0", Seed: 3})
	require.NoError(t, err)
	assert.Equal(t, Digest(Pattern(3, 1<<20)), sum)
	h, err := sys.Lookup(ctx, "w")
	require.NoError(t, err)
	b, err := sys.Read(ctx, h, "cuda:0")
	require.NoError(t, err)
	assert.Equal(t, sum, Digest(b))

	sum, err = registerPattern(ctx, sys, Command{Op: "register", Name: "l", Bytes: 3<<20 + 5, Source: "pageable-host", Seed: 9})
	require.NoError(t, err)
	assert.Equal(t, Digest(Pattern(9, 3<<20+5)), sum, "the digest computed piece by piece")
	h, err = sys.Lookup(ctx, "l")
	require.NoError(t, err)
	require.NoError(t, sys.Place(ctx, h, "cuda:0"))
	b, err = sys.Read(ctx, h, "cuda:0")
	require.NoError(t, err)
	assert.Equal(t, sum, Digest(b), "the loader makes the same bytes")

	snap, err := sys.Snapshot(ctx)
	require.NoError(t, err)
	for _, l := range snap.Locations {
		assert.Zero(t, l.ReservedBytes, "%s: register's reservation is gone", l.Location)
	}
}
