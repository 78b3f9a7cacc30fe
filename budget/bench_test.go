package budget

import (
	"fmt"
	"runtime"
	"testing"
)

// Micro-benchmarks of the ledger's hot paths. Every ledger here keeps the
// default trace ring (DefaultTraceCapacity), as a runtime would.

func benchLedger(b *testing.B) *Ledger {
	b.Helper()
	l, err := New(Config{ManagerID: "bench", TraceCapacity: DefaultTraceCapacity, Locations: []LocationConfig{
		{Name: "pageable-host"},
		{Name: "pinned-host", HasBudget: true, BudgetBytes: 1 << 40},
		{Name: "cuda:0", HasBudget: true, BudgetBytes: 1 << 40},
		{Name: "cuda:1", HasBudget: true, BudgetBytes: 1 << 40},
	}})
	if err != nil {
		b.Fatal(err)
	}
	return l
}

func benchRegister(b *testing.B, l *Ledger, name string, mode ReplicaMode, at string) Handle {
	b.Helper()
	h, a, err := l.Register(ValueSpec{Name: name, Bytes: 1 << 20, Mode: mode, At: at})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := l.Complete(a.ID); err != nil {
		b.Fatal(err)
	}
	return h
}

// BenchmarkAcquireRelease: one lease acquired and released (2 versions).
func BenchmarkAcquireRelease(b *testing.B) {
	l := benchLedger(b)
	h := benchRegister(b, l, "w", Exclusive, "cuda:0")
	for b.Loop() {
		id, err := l.Acquire(h, "cuda:0")
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(id); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAdmitCompletePlace: a replicable value resident at
// pageable-host is placed at cuda:0 (admission + completion) and evicted
// back, in steady state (3 versions per iteration).
func BenchmarkAdmitCompletePlace(b *testing.B) {
	l := benchLedger(b)
	h := benchRegister(b, l, "w", Replicable, "pageable-host")
	for b.Loop() {
		a, err := l.Place(h, "cuda:0")
		if err != nil {
			b.Fatal(err)
		}
		if _, err := l.Complete(a.ID); err != nil {
			b.Fatal(err)
		}
		if _, err := l.Evict(h, "cuda:0"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSnapshot10k: a snapshot of 10,000 values, each with one or two
// materializations, some leased, and a few reservations.
func BenchmarkSnapshot10k(b *testing.B) {
	l := benchLedger(b)
	for i := range 10000 {
		h := benchRegister(b, l, fmt.Sprint("v", i), Replicable, "pageable-host")
		if i%2 == 0 {
			a, err := l.Place(h, "cuda:0")
			if err != nil {
				b.Fatal(err)
			}
			if _, err := l.Complete(a.ID); err != nil {
				b.Fatal(err)
			}
		}
		if i%10 == 0 {
			if _, err := l.Acquire(h, "pageable-host"); err != nil {
				b.Fatal(err)
			}
		}
	}
	for i := range 8 {
		if err := l.Reserve("cuda:1", fmt.Sprint("r", i), 1<<20); err != nil {
			b.Fatal(err)
		}
	}
	if s := l.Snapshot(); len(s.Values) != 10000 {
		b.Fatalf("%d values", len(s.Values))
	}
	for b.Loop() {
		_ = l.Snapshot()
	}
}

// BenchmarkExplain: a plan of one reclaim, one reservation and four enters
// (a copy, a move, a reconstruction and a no-op) on a ledger of 1,000
// values.
func BenchmarkExplain(b *testing.B) {
	l := benchLedger(b)
	var hs []Handle
	for i := range 1000 {
		mode := Replicable
		if i%2 == 1 {
			mode = Exclusive
		}
		hs = append(hs, benchRegister(b, l, fmt.Sprint("v", i), mode, "pageable-host"))
	}
	a, err := l.Place(hs[0], "cuda:0")
	if err != nil {
		b.Fatal(err)
	}
	if _, err := l.Complete(a.ID); err != nil {
		b.Fatal(err)
	}
	s, _, err := l.Register(ValueSpec{Name: "s", Bytes: 1 << 20, Source: "pinned-host"})
	if err != nil {
		b.Fatal(err)
	}
	p := Plan{
		Reclaim:      []Action{{Handle: hs[0], Location: "cuda:0"}},
		Reservations: []ReservationSpec{{Name: "q", Location: "cuda:0", Bytes: 1 << 20}},
		Enter: []Action{
			{Handle: hs[2], Location: "cuda:0"},                               // copy
			{Handle: hs[3], Location: "cuda:1"},                               // move
			{Handle: s, Location: "cuda:0"},                                   // reconstruction
			{Handle: hs[4], Location: "pageable-host", From: "pageable-host"}, // no-op
		},
	}
	if ex := l.Explain(p); !ex.Feasible {
		b.Fatalf("infeasible: %s", ex.Reason)
	}
	for b.Loop() {
		_ = l.Explain(p)
	}
}

// BenchmarkSnapshotScale: a snapshot of BenchmarkDecideScale's 1M-value
// state, in its two halves. "freeze" is what the runtime's supervisor
// does (Ledger.Freeze) when nothing changed since the last snapshot,
// "freeze-after-1000-changes" after 500 lease pairs on random values
// (1,000 values changed; the pairs are not timed), "render" is
// FrozenSnapshot.Snapshot, which the caller runs outside the supervisor,
// and "snapshot" both (Ledger.Snapshot).
//
//	go test ./budget -run '^$' -bench BenchmarkSnapshotScale -benchmem
func BenchmarkSnapshotScale(b *testing.B) {
	const n = 1000000
	l, _ := dtBenchLedger(b, n)
	hs := make([]Handle, 0, n)
	locs := make([]string, 0, n)
	for _, v := range l.liveValues() {
		if len(v.mats) == 1 {
			hs = append(hs, l.handle(v))
			locs = append(locs, l.locs[v.mats[0].loc].name)
		}
	}
	_ = l.Freeze()
	b.Run("freeze", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = l.Freeze()
		}
	})
	b.Run("freeze-after-1000-changes", func(b *testing.B) {
		b.ReportAllocs()
		r := 0
		for b.Loop() {
			b.StopTimer()
			for range 500 {
				r = (r + 7919) % len(hs)
				id, err := l.Acquire(hs[r], locs[r])
				if err != nil {
					b.Fatal(err)
				}
				if err := l.Release(id); err != nil {
					b.Fatal(err)
				}
			}
			b.StartTimer()
			_ = l.Freeze()
		}
	})
	f := l.Freeze()
	b.Run("render", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = f.Snapshot()
		}
	})
	b.Run("snapshot", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = l.Snapshot()
		}
	})
}

// BenchmarkLedgerMemory: heap per resident value of BenchmarkDecideScale's
// state at 1M values (each resident at one location, 0–3 lease pairs
// taken on it), snapshot records included (one freeze). The ledger alone,
// not the runtime (system's BenchmarkValueMemory adds the value actors).
//
//	go test ./budget -run '^$' -bench BenchmarkLedgerMemory -benchtime 1x
func BenchmarkLedgerMemory(b *testing.B) {
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		l, _ := dtBenchLedger(b, 1000000)
		_ = l.Freeze()
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/1e6, "heap-B/value")
		runtime.KeepAlive(l)
	}
}
