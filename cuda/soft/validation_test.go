package soft_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/soft"
	"go.uber.org/goleak"
)

func TestNewRejectsBadConfig(t *testing.T) {
	defer goleak.VerifyNone(t)
	for name, cfg := range map[string]soft.Config{
		"no locations":        {},
		"malformed location":  {Locations: []string{"cuda:0", "gpu:1"}},
		"duplicate location":  {Locations: []string{"cuda:0", "cuda:0"}},
		"unknown capacity":    {Locations: []string{"cuda:0"}, Capacity: map[string]int64{"cuda:1": 10}},
		"negative capacity":   {Locations: []string{"cuda:0"}, Capacity: map[string]int64{"cuda:0": -1}},
		"negative bandwidth":  {Locations: []string{"cuda:0"}, BandwidthBytesPerSec: -5},
		"leading zero device": {Locations: []string{"cuda:01"}},
	} {
		if b, err := soft.New(cfg); !errors.Is(err, cuda.ErrInvalid) {
			t.Errorf("%s: New = %v, %v; want ErrInvalid", name, b, err)
		}
	}
}

func TestIdentity(t *testing.T) {
	defer goleak.VerifyNone(t)
	locs := []string{"cuda:0@node-b", "pinned-host@node-b"}
	b := newBackend(t, soft.Config{Locations: locs})
	defer mustClose(t, b)
	var _ cuda.Backend = b
	if b.Name() != "soft (simulated devices)" || !b.Simulated() {
		t.Fatalf("Name %q, Simulated %v", b.Name(), b.Simulated())
	}
	if got := b.Locations(); !slices.Equal(got, locs) {
		t.Fatalf("Locations = %v", got)
	}
	got := b.Locations()
	got[0] = "changed"
	if b.Locations()[0] != locs[0] {
		t.Fatal("Locations exposes internal state")
	}
	buf := mustAlloc(t, b, "cuda:0@node-b", 8)
	if buf.Location() != "cuda:0@node-b" {
		t.Fatalf("Location = %q", buf.Location())
	}
	if _, err := b.Allocate(context.Background(), "cuda:0", 8); !errors.Is(err, cuda.ErrUnknownLocation) {
		t.Fatalf("Allocate at the unqualified name = %v, want ErrUnknownLocation", err)
	}
	s := mustStream(t, b, "pinned-host@node-b")
	defer mustClose(t, s)
	if s.Location() != "pinned-host@node-b" {
		t.Fatalf("stream Location = %q", s.Location())
	}
}

func TestBadInputFailsAtOnce(t *testing.T) {
	defer goleak.VerifyNone(t)
	b := newBackend(t, soft.Config{})
	defer mustClose(t, b)
	other := newBackend(t, soft.Config{})
	defer mustClose(t, other)
	ctx := context.Background()
	s := mustStream(t, b, "cuda:0")
	defer mustClose(t, s)
	a := mustAlloc(t, b, "cuda:0", 8)
	c := mustAlloc(t, b, "cuda:1", 8)
	foreign := mustAlloc(t, other, "cuda:0", 8)

	var le *cuda.LocationError
	if _, err := b.Allocate(ctx, "cuda:x", 8); !errors.As(err, &le) || le.Name != "cuda:x" {
		t.Errorf("malformed location: %v", err)
	}
	if _, err := b.NewStream("cuda:9"); !errors.Is(err, cuda.ErrUnknownLocation) {
		t.Errorf("NewStream at an unconfigured location: %v", err)
	}
	if _, err := b.MemInfo("nowhere"); !errors.Is(err, cuda.ErrInvalid) {
		t.Errorf("MemInfo of a malformed location: %v", err)
	}
	if _, err := b.Allocate(ctx, "cuda:0", -1); !errors.Is(err, cuda.ErrInvalid) {
		t.Errorf("negative size: %v", err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := b.Allocate(cancelled, "cuda:0", 8); !errors.Is(err, context.Canceled) {
		t.Errorf("Allocate with a cancelled context: %v", err)
	}
	if err := b.Write(ctx, a, make([]byte, 7)); !errors.Is(err, cuda.ErrInvalid) {
		t.Errorf("short Write: %v", err)
	}
	for name, err := range map[string]error{
		"foreign dst":     s.CopyAsync(foreign, a),
		"foreign src":     s.CopyAsync(a, foreign),
		"nil dst":         s.CopyAsync(nil, a),
		"self copy":       s.CopyAsync(a, a),
		"size mismatch":   s.CopyAsync(a, mustAlloc(t, b, "cuda:1", 9)),
		"nil event":       s.WaitEvent(nil),
		"Free foreign":    b.Free(foreign),
		"Read foreign":    func() error { _, err := b.Read(ctx, foreign); return err }(),
		"Load foreign":    b.Load(ctx, foreign, "", func(context.Context, []byte) error { return nil }),
		"Write foreign":   b.Write(ctx, foreign, make([]byte, 8)),
		"Free nil buffer": b.Free(nil),
	} {
		if !errors.Is(err, cuda.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	// None of that disturbed the stream or the buffers.
	mustWrite(t, b, a, pattern(40, 8))
	mustCopy(t, s, c, a)
	if err := s.Synchronize(ctx); err != nil {
		t.Fatal(err)
	}
	assertBytes(t, "copy after bad input", mustRead(t, b, c), pattern(40, 8))
	if mi := mustMemInfo(t, other, "cuda:0"); mi.UsedBytes != 8 {
		t.Fatalf("the foreign backend's buffer was freed: %+v", mi)
	}
}

// A stream can wait on an event of another backend's stream.
func TestWaitEventAcrossBackends(t *testing.T) {
	defer goleak.VerifyNone(t)
	g := newGate()
	first := newBackend(t, soft.Config{BandwidthBytesPerSec: 1, Sleep: g.sleep})
	defer mustClose(t, first)
	second := newBackend(t, soft.Config{})
	defer mustClose(t, second)
	s1, s2 := mustStream(t, first, "cuda:0"), mustStream(t, second, "cuda:0")
	mustCopy(t, s1, mustAlloc(t, first, "cuda:0", 4), mustAlloc(t, first, "cuda:1", 4))
	e1 := mustRecord(t, s1)
	if err := s2.WaitEvent(e1); err != nil {
		t.Fatal(err)
	}
	e2 := mustRecord(t, s2)
	g.await(t)
	if e2.Query() {
		t.Fatal("an event behind WaitEvent completed before the awaited event")
	}
	g.release <- struct{}{}
	if err := e2.Wait(context.Background()); err != nil || !e1.Query() {
		t.Fatalf("e2 = %v, e1 done = %v", err, e1.Query())
	}
}
