package system

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/internal/testsys"
)

// Copies of different values into one location share that location's
// stream. An injected copy failure must fail exactly the transfer whose
// copy failed — never report success for it (its bytes were never copied)
// nor fail a neighbour whose copy ran. Many rounds of concurrent places
// with one armed fault each.
func TestCopyFailureIsAttributedToItsOwnTransfer(t *testing.T) {
	ctx := context.Background()
	s, err := startSoft(t, ctx, Options{Locations: []LocationConfig{NoLimit("pageable-host"), NoLimit("cuda:0")}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	const rounds, perRound = 100, 32
	for r := 0; r < rounds; r++ {
		hs := make([]Handle, perRound)
		datas := make([][]byte, perRound)
		for i := range hs {
			datas[i] = bytes.Repeat([]byte{byte(r), byte(i), 0x5a}, 100)
			h, err := s.Register(ctx, Value{Name: fmt.Sprintf("r%d-v%d", r, i), Bytes: 300, Mode: Replicable, At: "pageable-host", Data: datas[i]})
			if err != nil {
				t.Fatal(err)
			}
			hs[i] = h
		}
		testsys.Faults(s).Arm(cuda.FaultCopy, "cuda:0")
		errs := make([]error, perRound)
		var wg sync.WaitGroup
		for i := range hs {
			wg.Add(1)
			go func() { defer wg.Done(); errs[i] = s.Place(ctx, hs[i], "cuda:0") }()
		}
		wg.Wait()
		failed := 0
		for i, err := range errs {
			if err != nil {
				var pe *PlanExecutionError
				if !errors.As(err, &pe) || !errors.Is(err, cuda.ErrInjectedFault) {
					t.Fatalf("round %d value %d: want the injected copy fault, got %v", r, i, err)
				}
				failed++
				if _, err := s.Acquire(ctx, hs[i], "cuda:0"); err == nil {
					t.Fatalf("round %d value %d: failed place left the value resident", r, i)
				}
				continue
			}
			got, err := s.Read(ctx, hs[i], "cuda:0")
			if err != nil || !bytes.Equal(got, datas[i]) {
				t.Fatalf("round %d value %d: place reported success but the bytes at cuda:0 differ (err %v)", r, i, err)
			}
		}
		if failed != 1 {
			t.Fatalf("round %d: %d places failed, want exactly the one that met the armed fault", r, failed)
		}
	}
}
