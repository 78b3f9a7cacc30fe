package staging

import (
	"context"
	"testing"

	"github.com/residency-go/residency/cuda"
)

// nopRuntime admits every reservation within the clone cap at once: the
// benchmark below measures the clone budget's orchestration and the
// ledger's admission, not a runtime's messages.
type nopRuntime struct{ *ledgerBook }

func (nopRuntime) Backend() cuda.Backend { return nil }

// BenchmarkCloneBudget measures one reserve + release of the GPU-byte
// budget of device clones (the ledger's admission in the cap, the ticket's
// name, the wake-up of waiters), against a runtime with no budgets.
// "contended": every goroutine of b.RunParallel reserves a whole cap of
// one clone, so all but one wait for a release (no deferred task to flush).
//
//	go test -run '^$' -bench BenchmarkCloneBudget -benchmem ./staging
func BenchmarkCloneBudget(b *testing.B) {
	ctx := context.Background()
	run := func(b *testing.B, capBytes int64, parallel bool) {
		g, err := newGPUBudget(nopRuntime{newLedgerBook(b)}, "cuda:0", "bench", capBytes)
		if err != nil {
			b.Fatal(err)
		}
		g.flush = func() (TaskID, bool) { return 0, false }
		once := func() {
			tk, err := g.reserve(ctx, 64, true, 0)
			if err != nil {
				b.Fatal(err)
			}
			if err := g.release(ctx, tk); err != nil {
				b.Fatal(err)
			}
		}
		if !parallel {
			for b.Loop() {
				once()
			}
		} else {
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					once()
				}
			})
		}
		if st := g.state(); st.used != 0 || st.peak < 64 || st.peak > capBytes {
			b.Fatalf("after the run: used %d, peak %d", st.used, st.peak)
		}
	}
	b.Run("serial", func(b *testing.B) { run(b, 1<<30, false) })
	b.Run("parallel", func(b *testing.B) { run(b, 1<<30, true) })
	b.Run("contended", func(b *testing.B) { run(b, 64, true) })
}
