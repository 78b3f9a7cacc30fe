package replay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/residency-go/residency/cuda"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
)

// newTestRunner starts a runtime like a replay's and returns its runner.
func newTestRunner(t *testing.T, locs ...locationSpec) (*Runner, func()) {
	t.Helper()
	ctx := context.Background()
	names := make([]string, len(locs))
	opts := system.Options{ManagerID: ManagerID}
	for i, l := range locs {
		names[i] = l.name
		if l.hasBudget {
			opts.Locations = append(opts.Locations, system.Limit(l.name, l.budget))
		} else {
			opts.Locations = append(opts.Locations, system.NoLimit(l.name))
		}
	}
	backend, err := newBackend(names)
	require.NoError(t, err)
	opts.Backend = backend
	sys, err := system.Start(ctx, opts)
	require.NoError(t, err)
	r := newRunner(sys, locs)
	return r, func() {
		_ = sys.Close(ctx)
		_ = backend.Close()
	}
}

// TestNamesBounded: the names a replay keeps follow what is alive, not
// the length of the script. Values registered and discarded, leases,
// events, holds, decisions and scopes, each under a new name, hundreds of
// times: the runner keeps at most the bounded window of finished names
// (not every name ever bound: that would be 190 MB at a million ops). A
// finished name within the window still gets its precise answer; an
// older one is forgotten and reads as unknown.
func TestNamesBounded(t *testing.T) {
	ctx := context.Background()
	r, closeAll := newTestRunner(t, locationSpec{name: "pageable-host"}, locationSpec{name: "cuda:0", hasBudget: true, budget: 1 << 30})
	defer closeAll()
	const window = 16
	r.done.maxCount, r.doneIDs.window = window, window

	line := 0
	do := func(o Op) Result {
		t.Helper()
		line++
		o.Line = line
		return r.Do(ctx, o)
	}
	ok := func(o Op) {
		t.Helper()
		res := do(o)
		require.True(t, res.OK, "line %d %s: %+v", res.Line, res.Op, res.Error)
	}
	const rounds = 200
	most := 0
	for i := range rounds {
		v, l, e, h, d, s := fmt.Sprint("v", i), fmt.Sprint("l", i), fmt.Sprint("e", i), fmt.Sprint("h", i), fmt.Sprint("d", i), fmt.Sprint("s", i)
		ok(Op{Name: "register", handle: v, bytes: 4096, at: "cuda:0"})
		ok(Op{Name: "acquire", handle: v, location: "cuda:0", as: l})
		ok(Op{Name: "record_event", lease: l, event: e})
		ok(Op{Name: "release", lease: l})
		ok(Op{Name: "complete_event", event: e})
		ok(Op{Name: "hold", handle: v, location: "cuda:0", as: h})
		ok(Op{Name: "unhold", hold: h})
		ok(Op{Name: "decide", as: d, request: &requestSpec{name: d, requirements: []requirementSpec{{handle: v, tiers: [][]string{{"cuda:0"}}}}}})
		ok(Op{Name: "enter", as: s, decision: d})
		ok(Op{Name: "exit", scope: s})
		ok(Op{Name: "discard", handle: v})
		most = max(most, r.namesKept())
	}
	// Per kind: the window's finished names and ids, plus the few alive
	// at any moment.
	assert.LessOrEqual(t, most, 2*window+10, "the runner kept %d names after %d rounds", most, rounds)

	// Within the window: the precise answers.
	last := fmt.Sprint("v", rounds-1)
	res := do(Op{Name: "place", handle: last, location: "cuda:0"})
	require.NotNil(t, res.Error)
	assert.Equal(t, "ResidencyUnavailableError", res.Error.Type, "a value discarded lately: %s", res.Error.Message)
	res = do(Op{Name: "release", lease: fmt.Sprint("l", rounds-1)})
	require.NotNil(t, res.Error)
	assert.Contains(t, res.Error.Message, "already released")
	res = do(Op{Name: "exit", scope: fmt.Sprint("s", rounds-1)})
	require.NotNil(t, res.Error)
	assert.Contains(t, res.Error.Message, "it already exited")
	// Long finished: forgotten, an unknown name.
	res = do(Op{Name: "place", handle: "v0", location: "cuda:0"})
	require.NotNil(t, res.Error)
	assert.Equal(t, "InvalidInput", res.Error.Type)
	assert.Contains(t, res.Error.Message, `unknown handle "v0"`)
	res = do(Op{Name: "release", lease: "l0"})
	require.NotNil(t, res.Error)
	assert.Contains(t, res.Error.Message, `unknown lease "l0"`)

	// A name bound anew after a discard is not forgotten with the old one.
	ok(Op{Name: "register", handle: "again", bytes: 10, at: "cuda:0"})
	ok(Op{Name: "discard", handle: "again"})
	ok(Op{Name: "register", handle: "again", bytes: 10, at: "cuda:0"})
	for i := range 2 * window {
		ok(Op{Name: "register", handle: fmt.Sprint("w", i), bytes: 10, at: "cuda:0"})
		ok(Op{Name: "discard", handle: fmt.Sprint("w", i)})
	}
	ok(Op{Name: "place", handle: "again", location: "pageable-host"})
}

// TestVersionAfterInterrupt: an op that returned just as Ctrl-C came
// still shows the state version it left, not the previous op's (the
// version is not read with the interrupted context, which would fail).
func TestVersionAfterInterrupt(t *testing.T) {
	r, closeAll := newTestRunner(t, locationSpec{name: "cuda:0"})
	defer closeAll()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res := r.Do(ctx, Op{Line: 2, Name: "register", handle: "a", bytes: 10, at: "cuda:0"})
	require.True(t, res.OK)
	before := res.StateVersion
	r.afterExec = cancel // the interrupt comes right after the op returned
	res = r.Do(ctx, Op{Line: 3, Name: "register", handle: "b", bytes: 10, at: "cuda:0"})
	require.True(t, res.OK, "%+v", res.Error)
	v, err := r.sys.StateVersion(context.Background())
	require.NoError(t, err)
	assert.Equal(t, v, res.StateVersion)
	assert.Equal(t, before+2, res.StateVersion, "a register at a location is 2 versions")
}

// TestFillSpeed: a value's deterministic bytes are made at about the
// speed of memory, without allocating (1 MiB took about 2.5 ms, a hash of
// the name per 8 bytes: 365 registrations a second), and they do not
// depend on how the value is split.
func TestFillSpeed(t *testing.T) {
	buf := make([]byte, 1<<20)
	allocs := testing.AllocsPerRun(5, func() { Fill("value", 0, buf) })
	assert.Zero(t, allocs)
	if !raceEnabled {
		src := make([]byte, len(buf))
		best := func(f func()) time.Duration {
			m := time.Duration(math.MaxInt64)
			for range 10 {
				start := time.Now()
				f()
				m = min(m, time.Since(start))
			}
			return m
		}
		fillTime := best(func() { Fill("some-value-name", 0, buf) })
		copyTime := best(func() { copy(buf, src) })
		assert.Less(t, fillTime, 10*copyTime+500*time.Microsecond, "filling 1 MiB took %v, copying it %v", fillTime, copyTime)
	}

	whole := make([]byte, 5*fillBlockWords*8+13)
	Fill("v", 0, whole)
	for _, part := range [][2]int{{0, 1}, {3, 9}, {8, 4096}, {7, 4096*2 + 5}, {4095, 3 * 4096}, {100, len(whole) - 100}, {len(whole) - 3, 3}} {
		got := make([]byte, part[1])
		Fill("v", int64(part[0]), got)
		require.Equal(t, whole[part[0]:part[0]+part[1]], got, "offset %d, %d bytes", part[0], part[1])
	}
	// Blocks differ from each other, and values from values.
	assert.NotEqual(t, whole[:4096], whole[4096:8192])
	other := make([]byte, len(whole))
	Fill("w", 0, other)
	assert.NotEqual(t, whole, other)
}

// BenchmarkFill: filling 1 MiB, against copying it.
func BenchmarkFill(b *testing.B) {
	buf := make([]byte, 1<<20)
	src := make([]byte, 1<<20)
	b.Run("fill", func(b *testing.B) {
		b.SetBytes(1 << 20)
		for b.Loop() {
			Fill("some-value", 0, buf)
		}
	})
	b.Run("copy", func(b *testing.B) {
		b.SetBytes(1 << 20)
		for b.Loop() {
			copy(buf, src)
		}
	})
}

// TestRegisteredBytes: a value registered with "at" up to the buffer
// limit holds its deterministic bytes; a larger one starts zero-filled
// (only its first BufferLimit bytes are kept at all).
func TestRegisteredBytes(t *testing.T) {
	ctx := context.Background()
	backend, err := newBackend([]string{"pageable-host"})
	require.NoError(t, err)
	defer backend.Close()
	sys, err := system.Start(ctx, system.Options{ManagerID: ManagerID, Backend: backend,
		Locations: []system.LocationConfig{system.NoLimit("pageable-host")}})
	require.NoError(t, err)
	defer sys.Close(ctx)
	r := newRunner(sys, []locationSpec{{name: "pageable-host"}})
	for _, tc := range []struct {
		name  string
		bytes int64
	}{{"small", 1000}, {"at-limit", BufferLimit}, {"large", 3 * BufferLimit}} {
		res := r.Do(ctx, Op{Line: 1, Name: "register", handle: tc.name, bytes: tc.bytes, at: "pageable-host"})
		require.True(t, res.OK, "%s: %+v", tc.name, res.Error)
		got, err := sys.Read(ctx, r.handles[tc.name], "pageable-host")
		require.NoError(t, err)
		kept := min(tc.bytes, BufferLimit)
		require.Len(t, got, int(kept), tc.name)
		want := make([]byte, kept)
		if tc.bytes <= BufferLimit {
			Fill(tc.name, 0, want)
		}
		assert.Equal(t, want, got, tc.name)
	}
}

func TestLocationOrder(t *testing.T) {
	in := []string{"cuda:10", "cuda:0@b", "pinned-host", "cuda:2", "pageable-host", "cuda:0@a", "pageable-host@a"}
	SortLocations(in)
	want := fmt.Sprint([]string{"pageable-host", "pinned-host", "cuda:2", "cuda:10", "pageable-host@a", "cuda:0@a", "cuda:0@b"})
	if got := fmt.Sprint(in); got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

// TestClassify: the outermost residency error names the type, so a
// PlanExecutionError is not mistaken for its cause; anything else is
// "Error".
func TestClassify(t *testing.T) {
	cause := &system.BudgetError{Location: "cuda:0"}
	pe := &system.PlanExecutionError{Phase: "reserve", FailedActionIndex: -1, FailedReservationIndex: 0,
		FailedReservation: &system.ReservationSpec{Name: "r", Location: "cuda:0", Bytes: 1}, Cause: cause}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{pe, "ResidencyPlanExecutionError"},
		{fmt.Errorf("wrapped: %w", pe), "ResidencyPlanExecutionError"},
		{cause, "ResidencyBudgetError"},
		{&system.SearchLimitError{}, "ResidencySearchLimitError"},
		{&system.StaleStateError{}, "ResidencyStaleStateError"},
		{&system.PlanError{}, "ResidencyPlanError"},
		{&system.InUseError{}, "ResidencyInUseError"},
		{&system.UnavailableError{}, "ResidencyUnavailableError"},
		{&system.InvalidInputError{}, "InvalidInput"},
		{context.DeadlineExceeded, "Error"},
		{errors.New("boom"), "Error"},
	} {
		if got, _ := classify(tc.err); got != tc.want {
			t.Errorf("classify(%v) = %s, want %s", tc.err, got, tc.want)
		}
	}
	b, err := Marshal((*Runner)(nil).errorObject(pe))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"type":"ResidencyPlanExecutionError","message":"` + pe.Error() + `","phase":"reserve","failed_action":null,"failed_action_index":null,` +
		`"failed_reservation":{"name":"r","location":"cuda:0","bytes":1},"failed_reservation_index":0,"partial_report":{"transitions":[]},` +
		`"cause":{"type":"ResidencyBudgetError","message":"` + cause.Error() + `","location":"cuda:0","budget_bytes":0,"used_bytes":0,"reserved_bytes":0,"requested_bytes":0}}`
	if string(b) != want {
		t.Errorf("got  %s\nwant %s", b, want)
	}
}

// TestTruncatingBackend: large buffers report their full size but keep
// only the first bytes; copies, loads and faults still work.
func TestTruncatingBackend(t *testing.T) {
	ctx := context.Background()
	b, err := newBackend([]string{"pinned-host", "cuda:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const size = 64 << 30
	src, err := b.Allocate(ctx, "pinned-host", size)
	if err != nil {
		t.Fatal(err)
	}
	dst, err := b.Allocate(ctx, "cuda:0", size)
	if err != nil {
		t.Fatal(err)
	}
	if src.Size() != size || src.Location() != "pinned-host" {
		t.Fatalf("buffer %d at %s", src.Size(), src.Location())
	}
	if err := b.Load(ctx, src, "", Loader("v")); err != nil {
		t.Fatal(err)
	}
	s, err := b.NewStream("cuda:0")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.CopyAsync(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := b.Read(ctx, dst)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, BufferLimit)
	Fill("v", 0, want)
	if string(got) != string(want) {
		t.Errorf("the kept bytes were not copied")
	}
	b.Faults().Arm(cuda.FaultAlloc, "cuda:0")
	if _, err := b.Allocate(ctx, "cuda:0", 10); !errors.Is(err, cuda.ErrInjectedFault) {
		t.Errorf("armed alloc fault: %v", err)
	}
	small, _ := b.Allocate(ctx, "cuda:0", 10)
	if err := s.CopyAsync(small, src); !errors.Is(err, cuda.ErrInvalid) {
		t.Errorf("copy of different sizes: %v", err)
	}
	for _, buf := range []cuda.Buffer{src, dst, small} {
		if err := b.Free(buf); err != nil {
			t.Error(err)
		}
	}
}

// TestFill: the deterministic content does not depend on how a buffer is
// split, and differs between values.
func TestFill(t *testing.T) {
	whole := make([]byte, 100)
	Fill("a", 0, whole)
	part := make([]byte, 37)
	Fill("a", 13, part)
	if string(part) != string(whole[13:50]) {
		t.Error("fill at an offset differs from the whole")
	}
	other := make([]byte, 100)
	Fill("b", 0, other)
	if string(other) == string(whole) {
		t.Error("two values got the same bytes")
	}
}

// A script's cache has the script's name in the runtime: its owner and
// charge names in snapshots and in the ledger's messages are the
// script's words as they come (no rewriting), and a charge written that
// way is the charge itself.
func TestCacheNamesAreTheScripts(t *testing.T) {
	script := cacheStart + `{"op":"load","cache":"c","key":"a","peak":2,"resident":2}
{"op":"unreserve","name":"cache \"c\"/a#1"}
{"op":"snapshot"}
`
	var out bytes.Buffer
	_, err := Run(context.Background(), strings.NewReader(script), &out, Options{})
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 5)
	assert.Contains(t, lines[3], `reservation cache \"c\"/a#1 is a charge of cache \"c\"; only the cache releases it`)
	assert.Contains(t, lines[4], `{"name":"cache \"c\"/a#1","bytes":2,"owner":"cache \"c\""}`)
}

// The note at close lists the cache leases and pins
// the script left held, beside the runtime's leases and holds, and is
// still a note (an OutstandingError), not a failure.
func TestCacheOutstandingAtClose(t *testing.T) {
	ctx := context.Background()
	ops, err := Parse(strings.NewReader(cacheStart + `{"op":"register","handle":"v","bytes":1,"at":"cuda:0"}
{"op":"acquire","handle":"v","location":"cuda:0","as":"R"}
{"op":"load","cache":"c","key":"a","peak":2,"resident":2,"as":"A"}
{"op":"load","cache":"c","key":"b","peak":2,"resident":2,"as":"B"}
{"op":"cache_pin","lease":"A","as":"P"}
{"op":"cache_release","lease":"B"}
`))
	require.NoError(t, err)
	run := func(ops []Op) (*Runner, *system.System) {
		backend, err := newBackend([]string{"pageable-host", "cuda:0"})
		require.NoError(t, err)
		t.Cleanup(func() { backend.Close() })
		sys, err := system.Start(ctx, system.Options{ManagerID: ManagerID, Backend: backend,
			Locations: []system.LocationConfig{system.NoLimit("pageable-host"), system.Limit("cuda:0", 10)}})
		require.NoError(t, err)
		r := newRunner(sys, ops[0].locations)
		for _, o := range ops[1:] {
			res := r.Do(ctx, o)
			require.True(t, res.OK, "line %d: %+v", o.Line, res.Error)
		}
		return r, sys
	}
	r, sys := run(ops)
	held := r
	err = r.closeNote(sys.Close(ctx))
	var oe *system.OutstandingError
	require.ErrorAs(t, err, &oe, "a note, not a failure")
	assert.Contains(t, err.Error(), "1 leases [v@cuda:0]")
	assert.Contains(t, err.Error(), `1 cache lease ["A"] and 1 cache pin ["P"] still held (released at close)`)

	// Only cache leases left: still a note.
	r, sys = run(append(ops[:2:2], ops[4], ops[6]))
	err = r.closeNote(sys.Close(ctx))
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, `residency: closed with 1 cache lease ["A"] and 1 cache pin ["P"] still held (released at close)`, err.Error())

	// Nothing left: nothing to say.
	r, sys = run(ops[:2])
	assert.NoError(t, r.closeNote(sys.Close(ctx)))
	other := errors.New("closing failed")
	assert.Equal(t, other, held.closeNote(other), "a failure stays a failure")
}

const cacheStart = `{"op":"start","locations":{"pageable-host":null,"cuda:0":10}}
{"op":"cache_open","name":"c","location":"cuda:0"}
`

// TestVersionAfterInterruptJSON: the same through Run: the last JSON line
// before the interruption carries its op's state version.
func TestVersionAfterInterruptJSON(t *testing.T) {
	script := `{"op":"start","locations":{"pageable-host":null,"cuda:0":"1MiB"}}` + "\n" +
		strings.Repeat(`{"op":"reserve","location":"cuda:0","name":"r","bytes":1}`+"\n"+`{"op":"unreserve","name":"r"}`+"\n", 5)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n := 0
	var out bytes.Buffer
	_, err := Run(ctx, strings.NewReader(script), &out, Options{afterExec: func() {
		if n++; n == 3 { // the third op after start: a reserve
			cancel()
		}
	}})
	assert.ErrorIs(t, err, context.Canceled)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 4, out.String())
	assert.Equal(t, `{"line":4,"op":"reserve","ok":true,"state_version":3}`, lines[3])
}
