package soft_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/soft"
)

var allLocations = []string{"pageable-host", "pinned-host", "cuda:0", "cuda:1"}

// gate is an injectable Config.Sleep that holds every simulated transfer
// until the test releases it: entered receives the duration of each copy
// that starts its delay; a send on release lets one copy finish. A closing
// stream or backend cancels ctx and lets the copy through.
type gate struct {
	entered chan time.Duration
	release chan struct{}
}

func newGate() *gate {
	return &gate{entered: make(chan time.Duration), release: make(chan struct{})}
}

// await returns the duration of the next copy to enter its simulated
// transfer. It fails the test if none does within a generous deadline, so a
// broken backend fails instead of hanging (inside a synctest bubble the
// deadline is on the fake clock and fires as soon as everything is blocked).
func (g *gate) await(t *testing.T) time.Duration {
	t.Helper()
	select {
	case d := <-g.entered:
		return d
	case <-time.After(30 * time.Second):
		t.Fatal("no copy entered its simulated transfer")
		return 0
	}
}

func (g *gate) sleep(ctx context.Context, d time.Duration) {
	select {
	case g.entered <- d:
	case <-ctx.Done():
		return
	}
	select {
	case <-g.release:
	case <-ctx.Done():
	}
}

// newBackend returns a backend over cfg (allLocations when cfg has none).
// The caller closes it.
func newBackend(t *testing.T, cfg soft.Config) *soft.Backend {
	t.Helper()
	if cfg.Locations == nil {
		cfg.Locations = allLocations
	}
	b, err := soft.New(cfg)
	if err != nil {
		t.Fatalf("soft.New: %v", err)
	}
	return b
}

func mustAlloc(t *testing.T, b cuda.Backend, loc string, n int64) cuda.Buffer {
	t.Helper()
	buf, err := b.Allocate(context.Background(), loc, n)
	if err != nil {
		t.Fatalf("Allocate(%s, %d): %v", loc, n, err)
	}
	return buf
}

func mustStream(t *testing.T, b cuda.Backend, loc string) cuda.Stream {
	t.Helper()
	s, err := b.NewStream(loc)
	if err != nil {
		t.Fatalf("NewStream(%s): %v", loc, err)
	}
	return s
}

func mustRecord(t *testing.T, s cuda.Stream) cuda.Event {
	t.Helper()
	ev, err := s.Record()
	if err != nil {
		t.Fatalf("Record: %v", err)
	}
	return ev
}

func mustCopy(t *testing.T, s cuda.Stream, dst, src cuda.Buffer) {
	t.Helper()
	if err := s.CopyAsync(dst, src); err != nil {
		t.Fatalf("CopyAsync(%s <- %s): %v", dst.Location(), src.Location(), err)
	}
}

func mustWrite(t *testing.T, b cuda.Backend, buf cuda.Buffer, data []byte) {
	t.Helper()
	if err := b.Write(context.Background(), buf, data); err != nil {
		t.Fatalf("Write: %v", err)
	}
}

func mustRead(t *testing.T, b cuda.Backend, buf cuda.Buffer) []byte {
	t.Helper()
	data, err := b.Read(context.Background(), buf)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	return data
}

// pattern returns n pseudo-random bytes determined by seed; no two seeds
// give the same bytes for any useful n.
func pattern(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	out := make([]byte, n)
	for i := range out {
		out[i] = byte(r.Uint32())
	}
	return out
}

func assertBytes(t *testing.T, what string, got, want []byte) {
	t.Helper()
	if !bytes.Equal(got, want) {
		i := 0
		for i < len(got) && i < len(want) && got[i] == want[i] {
			i++
		}
		t.Fatalf("%s: bytes differ (len %d vs %d, first difference at %d)", what, len(got), len(want), i)
	}
}

func mustMemInfo(t *testing.T, b cuda.Backend, loc string) cuda.MemInfo {
	t.Helper()
	mi, err := b.MemInfo(loc)
	if err != nil {
		t.Fatalf("MemInfo(%s): %v", loc, err)
	}
	return mi
}

func mustClose(t *testing.T, c interface{ Close() error }) {
	t.Helper()
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}
