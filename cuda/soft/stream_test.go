package soft_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/soft"
	"go.uber.org/goleak"
)

// Bytes travel pageable-host -> pinned-host -> cuda:0 -> cuda:1 on three
// streams chained by events, and read back identical everywhere.
func TestCopyChainAcrossLocations(t *testing.T) {
	defer goleak.VerifyNone(t)
	b := newBackend(t, soft.Config{})
	defer mustClose(t, b)

	const n = 1<<20 + 3
	want := pattern(1, n)
	bufs := make([]cuda.Buffer, len(allLocations))
	for i, loc := range allLocations {
		bufs[i] = mustAlloc(t, b, loc, n)
	}
	mustWrite(t, b, bufs[0], want)

	var prev cuda.Event
	for i := 1; i < len(bufs); i++ {
		s := mustStream(t, b, bufs[i].Location())
		defer mustClose(t, s)
		if prev != nil {
			if err := s.WaitEvent(prev); err != nil {
				t.Fatalf("WaitEvent: %v", err)
			}
		}
		mustCopy(t, s, bufs[i], bufs[i-1])
		prev = mustRecord(t, s)
	}
	if err := prev.Wait(context.Background()); err != nil {
		t.Fatalf("last event: %v", err)
	}
	for i, buf := range bufs {
		assertBytes(t, allLocations[i], mustRead(t, b, buf), want)
	}
}

// An event recorded after a copy is not complete while the copy is in
// flight, and once it is complete the copy's bytes are visible.
func TestEventCompletesOnlyAfterItsCopy(t *testing.T) {
	defer goleak.VerifyNone(t)
	g := newGate()
	b := newBackend(t, soft.Config{BandwidthBytesPerSec: 1024, Sleep: g.sleep})
	defer mustClose(t, b)
	s := mustStream(t, b, "cuda:0")
	defer mustClose(t, s)

	const n = 4096
	src := mustAlloc(t, b, "pinned-host", n)
	dst := mustAlloc(t, b, "cuda:0", n)
	want := pattern(2, n)
	mustWrite(t, b, src, want)

	mustCopy(t, s, dst, src)
	ev := mustRecord(t, s)
	later := mustRecord(t, s)

	if d := g.await(t); d != 4*time.Second { // 4096 B at 1024 B/s
		t.Fatalf("simulated transfer time %v, want 4s", d)
	}
	// The copy is in flight: held in its simulated transfer.
	if ev.Query() || later.Query() {
		t.Fatal("an event completed while the copy before it was in flight")
	}
	select {
	case <-ev.Done():
		t.Fatal("Done closed while the copy was in flight")
	default:
	}
	if ev.Err() != nil {
		t.Fatalf("Err before completion = %v, want nil", ev.Err())
	}
	assertBytes(t, "destination during the copy", mustRead(t, b, dst), make([]byte, n))

	g.release <- struct{}{}
	if err := ev.Wait(context.Background()); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if !ev.Query() {
		t.Fatal("Query false after Wait returned")
	}
	assertBytes(t, "destination after the event", mustRead(t, b, dst), want)
	if err := later.Wait(context.Background()); err != nil {
		t.Fatalf("later event: %v", err)
	}
}

// Event.Wait gives up with the context's error while the event is pending.
func TestEventWaitHonoursContext(t *testing.T) {
	defer goleak.VerifyNone(t)
	g := newGate()
	b := newBackend(t, soft.Config{BandwidthBytesPerSec: 1, Sleep: g.sleep})
	defer mustClose(t, b)
	s := mustStream(t, b, "cuda:0")
	src := mustAlloc(t, b, "cuda:0", 8)
	dst := mustAlloc(t, b, "cuda:1", 8)
	mustCopy(t, s, dst, src)
	ev := mustRecord(t, s)
	g.await(t)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := ev.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait with a cancelled context = %v, want context.Canceled", err)
	}
	if err := s.Synchronize(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Synchronize with a cancelled context = %v, want context.Canceled", err)
	}
	g.release <- struct{}{}
	if err := ev.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	mustClose(t, s)
}

// WaitEvent holds later work on one stream until an event of another
// stream completes: the dependent copy does not even start its transfer
// before the copy it depends on has finished.
func TestWaitEventOrdersAcrossStreams(t *testing.T) {
	defer goleak.VerifyNone(t)
	synctest.Test(t, func(t *testing.T) {
		g := newGate()
		b := newBackend(t, soft.Config{BandwidthBytesPerSec: 1 << 20, Sleep: g.sleep})
		defer mustClose(t, b)
		s0 := mustStream(t, b, "cuda:0")
		s1 := mustStream(t, b, "cuda:1")

		const n = 1 << 16
		a := mustAlloc(t, b, "pinned-host", n)
		mid := mustAlloc(t, b, "cuda:0", n)
		out := mustAlloc(t, b, "cuda:1", n)
		want := pattern(3, n)
		mustWrite(t, b, a, want)

		mustCopy(t, s0, mid, a) // a -> cuda:0
		e0 := mustRecord(t, s0)
		if err := s1.WaitEvent(e0); err != nil {
			t.Fatal(err)
		}
		mustCopy(t, s1, out, mid) // cuda:0 -> cuda:1, only after e0
		e1 := mustRecord(t, s1)

		g.await(t)      // s0's copy is in flight
		synctest.Wait() // every other goroutine is now durably blocked
		select {
		case <-g.entered:
			t.Fatal("the copy after WaitEvent started before the awaited event completed")
		default:
		}
		if e1.Query() {
			t.Fatal("dependent event completed before the event it waits for")
		}
		assertBytes(t, "cuda:1 before e0", mustRead(t, b, out), make([]byte, n))

		g.release <- struct{}{}
		g.await(t) // now s1's copy may start...
		if !e0.Query() {
			t.Fatal("s1's copy started before e0 completed")
		}
		assertBytes(t, "cuda:0 at e0", mustRead(t, b, mid), want)
		g.release <- struct{}{}
		if err := e1.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		assertBytes(t, "cuda:1 after e1", mustRead(t, b, out), want)
	})
}

// Without WaitEvent, streams are independent: two copies on two streams
// are in flight at the same time. (This is what makes the ordering test
// above meaningful.)
func TestStreamsRunConcurrently(t *testing.T) {
	defer goleak.VerifyNone(t)
	g := newGate()
	b := newBackend(t, soft.Config{BandwidthBytesPerSec: 1, Sleep: g.sleep})
	defer mustClose(t, b)
	s0 := mustStream(t, b, "cuda:0")
	s1 := mustStream(t, b, "cuda:1")
	a0, b0 := mustAlloc(t, b, "cuda:0", 4), mustAlloc(t, b, "pinned-host", 4)
	a1, b1 := mustAlloc(t, b, "cuda:1", 4), mustAlloc(t, b, "pinned-host", 4)
	mustCopy(t, s0, a0, b0)
	mustCopy(t, s1, a1, b1)
	g.await(t)
	g.await(t) // both in flight at once; a serializing backend fails here
	g.release <- struct{}{}
	g.release <- struct{}{}
	for _, s := range []cuda.Stream{s0, s1} {
		if err := s.Synchronize(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// Work on one stream runs in FIFO order: the last of several copies into
// the same buffer wins.
func TestStreamIsFIFO(t *testing.T) {
	defer goleak.VerifyNone(t)
	b := newBackend(t, soft.Config{})
	defer mustClose(t, b)
	s := mustStream(t, b, "cuda:0")
	const n = 1024
	dst := mustAlloc(t, b, "cuda:0", n)
	var srcs []cuda.Buffer
	for i := range 32 {
		src := mustAlloc(t, b, "pinned-host", n)
		mustWrite(t, b, src, pattern(uint64(100+i), n))
		srcs = append(srcs, src)
	}
	for _, src := range srcs {
		mustCopy(t, s, dst, src)
	}
	if err := s.Synchronize(context.Background()); err != nil {
		t.Fatal(err)
	}
	assertBytes(t, "destination", mustRead(t, b, dst), pattern(100+31, n))
}

// With the default Sleep the simulated transfer takes size/bandwidth on the
// clock (here the fake clock of a synctest bubble).
func TestBandwidthDelaysCopies(t *testing.T) {
	defer goleak.VerifyNone(t)
	synctest.Test(t, func(t *testing.T) {
		b := newBackend(t, soft.Config{BandwidthBytesPerSec: 1 << 20})
		defer mustClose(t, b)
		s := mustStream(t, b, "cuda:0")
		src := mustAlloc(t, b, "pinned-host", 1<<19)
		dst := mustAlloc(t, b, "cuda:0", 1<<19)
		start := time.Now()
		mustCopy(t, s, dst, src)
		mustCopy(t, s, src, dst)
		if err := s.Synchronize(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got := time.Since(start); got != time.Second {
			t.Fatalf("two 512 KiB copies at 1 MiB/s took %v, want 1s", got)
		}
	})
}

// Closing a stream cuts the simulated delay short but still performs the
// copy and completes its event.
func TestStreamCloseDrains(t *testing.T) {
	defer goleak.VerifyNone(t)
	g := newGate()
	b := newBackend(t, soft.Config{BandwidthBytesPerSec: 1, Sleep: g.sleep})
	defer mustClose(t, b)
	s := mustStream(t, b, "cuda:0")
	const n = 512
	src := mustAlloc(t, b, "pageable-host", n)
	dst := mustAlloc(t, b, "cuda:0", n)
	want := pattern(4, n)
	mustWrite(t, b, src, want)
	mustCopy(t, s, dst, src)
	mustCopy(t, s, src, dst) // queued behind the first; must also run
	ev := mustRecord(t, s)
	g.await(t) // first copy in flight, held by the test

	mustClose(t, s) // cancels the hold, drains, stops
	if !ev.Query() || ev.Err() != nil {
		t.Fatalf("after Close: event done=%v err=%v, want done without error", ev.Query(), ev.Err())
	}
	assertBytes(t, "destination after Close", mustRead(t, b, dst), want)
	if err := s.Close(); err != nil {
		t.Fatalf("second Close = %v, want nil", err)
	}
	if err := s.CopyAsync(dst, src); !errors.Is(err, cuda.ErrClosed) {
		t.Fatalf("CopyAsync after Close = %v, want ErrClosed", err)
	}
	if _, err := s.Record(); !errors.Is(err, cuda.ErrClosed) {
		t.Fatalf("Record after Close = %v, want ErrClosed", err)
	}
	if err := s.WaitEvent(ev); !errors.Is(err, cuda.ErrClosed) {
		t.Fatalf("WaitEvent after Close = %v, want ErrClosed", err)
	}
	if err := s.Synchronize(context.Background()); !errors.Is(err, cuda.ErrClosed) {
		t.Fatalf("Synchronize after Close = %v, want ErrClosed", err)
	}
}

// Copies between the same buffers in opposite directions on many streams
// neither deadlock nor tear: every buffer always holds one whole pattern.
func TestConcurrentCrossCopiesDoNotTear(t *testing.T) {
	defer goleak.VerifyNone(t)
	b := newBackend(t, soft.Config{})
	defer mustClose(t, b)
	const n, nbufs, nstreams, rounds = 4096, 6, 8, 200
	bufs := make([]cuda.Buffer, nbufs)
	patterns := make(map[string]bool)
	for i := range bufs {
		bufs[i] = mustAlloc(t, b, allLocations[i%len(allLocations)], n)
		p := pattern(uint64(200+i), n)
		mustWrite(t, b, bufs[i], p)
		patterns[string(p)] = true
	}
	streams := make([]cuda.Stream, nstreams)
	for i := range streams {
		streams[i] = mustStream(t, b, allLocations[i%len(allLocations)])
	}
	done := make(chan struct{})
	go func() { // concurrent readers see whole patterns only
		defer close(done)
		for i := 0; i < rounds; i++ {
			data, err := b.Read(context.Background(), bufs[i%nbufs])
			if err != nil || !patterns[string(data)] {
				t.Errorf("Read saw a torn or unknown buffer (err %v)", err)
				return
			}
		}
	}()
	for r := range rounds {
		for i, s := range streams {
			x, y := (r+i)%nbufs, (r+2*i+1)%nbufs
			if x == y {
				continue
			}
			mustCopy(t, s, bufs[x], bufs[y])
		}
	}
	// A deadline turns a lock-order deadlock into a failure, not a hang.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, s := range streams {
		if err := s.Synchronize(ctx); err != nil {
			t.Fatal(err)
		}
	}
	<-done
	for i, buf := range bufs {
		if !patterns[string(mustRead(t, b, buf))] {
			t.Fatalf("buffer %d holds a mixture of patterns", i)
		}
	}
}

// heldEvent is an event of the test's: done when the test closes ch.
type heldEvent struct{ ch chan struct{} }

func (e heldEvent) Done() <-chan struct{} { return e.ch }
func (e heldEvent) Err() error            { return nil }
func (e heldEvent) Query() bool {
	select {
	case <-e.ch:
		return true
	default:
		return false
	}
}
func (e heldEvent) Wait(ctx context.Context) error {
	select {
	case <-e.ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// A small copy on an idle stream runs on the caller's goroutine, but
// never ahead of work queued before it: behind a wait for an event that
// has not happened, the copy and the event recorded after it wait too;
// once it happens, they run in order.
func TestSmallCopyNeverOvertakesQueuedWork(t *testing.T) {
	defer goleak.VerifyNone(t)
	b := newBackend(t, soft.Config{})
	defer mustClose(t, b)
	s := mustStream(t, b, "cuda:0")
	defer mustClose(t, s)
	src := mustAlloc(t, b, "pinned-host", 4096)
	dst := mustAlloc(t, b, "cuda:0", 4096)
	mustWrite(t, b, src, pattern(7, 4096))

	// Idle: the copy is done when CopyAsync returns, its event complete.
	mustCopy(t, s, dst, src)
	ev := mustRecord(t, s)
	if !ev.Query() {
		t.Fatal("an event recorded on an idle stream after a small copy is not complete")
	}
	assertBytes(t, "cuda:0", mustRead(t, b, dst), pattern(7, 4096))

	held := heldEvent{ch: make(chan struct{})}
	if err := s.WaitEvent(held); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, b, src, pattern(9, 4096))
	mustCopy(t, s, dst, src)
	after := mustRecord(t, s)
	if after.Query() {
		t.Fatal("the event after a copy queued behind a wait completed before the wait")
	}
	assertBytes(t, "cuda:0 before the wait ends", mustRead(t, b, dst), pattern(7, 4096))
	close(held.ch)
	if err := after.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	assertBytes(t, "cuda:0", mustRead(t, b, dst), pattern(9, 4096))
}

// A small copy from a freed buffer on an idle stream is refused at once
// (ErrFreed), as a queued one is, and is no failure of the stream: the
// next event is clean.
func TestSmallCopyOfAFreedBufferIsRefusedAtOnce(t *testing.T) {
	defer goleak.VerifyNone(t)
	b := newBackend(t, soft.Config{})
	defer mustClose(t, b)
	s := mustStream(t, b, "cuda:0")
	defer mustClose(t, s)
	src := mustAlloc(t, b, "pinned-host", 4096)
	dst := mustAlloc(t, b, "cuda:0", 4096)
	if err := b.Free(src); err != nil {
		t.Fatal(err)
	}
	if err := s.CopyAsync(dst, src); !errors.Is(err, cuda.ErrFreed) {
		t.Fatalf("copy from a freed buffer: got %v, want ErrFreed at once", err)
	}
	// The at-once refusal is not a stream failure: the next event is clean.
	if err := mustRecord(t, s).Wait(context.Background()); err != nil {
		t.Fatalf("event after a refused copy: %v", err)
	}
}
