package tests

// Staging saves of the system checker: a pipeline (package staging) over
// the checker's runtime, saving steps of its own device buffers, one
// after another, both join modes, while the workers run.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/staging"
)

// scStagingDeviceBytes: the application's own device buffers at cuda:0
// (the saves' sources), which the ledger does not charge.
const scStagingDeviceBytes = 2 * 12 * stRow

type scStaging struct {
	rd      *scRound
	n       int
	p       *staging.Pipeline
	bufs    []cuda.Buffer
	data    [][]byte
	saves   int
	written int
	failed  int
	reopen  int
}

func newSCStaging(t *testing.T, r *scRound) *scStaging {
	ctx := context.Background()
	s := &scStaging{rd: r}
	be := r.sys.Backend()
	for i := range 2 {
		d := pattern(12*stRow, byte(0x40+i))
		b, err := be.Allocate(ctx, "cuda:0", int64(len(d)))
		require.NoError(t, err)
		require.NoError(t, be.Write(ctx, b, d))
		s.bufs, s.data = append(s.bufs, b), append(s.data, d)
	}
	require.NoError(t, s.open())
	return s
}

func (s *scStaging) open() error {
	s.n++
	cfg := stagingConfig(fmt.Sprintf("st%d", s.n))
	cfg.CloneBudgetBytes = 24 * stRow
	p, err := staging.New(context.Background(), s.rd.sys, cfg)
	s.p = p
	return err
}

// run makes n saves, each checked byte for byte in the pool once written;
// a save that fails (an injected copy fault, a budget refusal) fails the
// pipeline's tasks, and a failed pipeline is closed and opened again.
func (s *scStaging) run(r *rand.Rand, n int) {
	for range n {
		if s.p == nil || s.p.Err() != nil {
			if s.p != nil {
				_ = s.p.Close(context.Background())
				s.reopen++
			}
			if err := s.open(); err != nil {
				s.p = nil
				continue // no room for the pipeline now
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err := s.save(ctx, r)
		timedOut := ctx.Err() != nil
		cancel()
		if err == nil {
			s.written++
			continue
		}
		if timedOut {
			s.rd.fail("staging save did not finish in 20s: %v", err)
			return
		}
		s.failed++
	}
}

func (s *scStaging) save(ctx context.Context, r *rand.Rand) error {
	i := r.IntN(len(s.bufs))
	rows := []staging.Row{}
	used := map[int]bool{}
	for range 1 + r.IntN(4) {
		slot := r.IntN(64)
		if used[slot] {
			continue
		}
		used[slot] = true
		rows = append(rows, staging.Row{Key: []string{"k", "v"}[r.IntN(2)], Slot: slot, Offset: int64(r.IntN(12)) * stRow})
	}
	s.saves++
	mode := staging.JoinNextStep
	if r.IntN(2) == 0 {
		mode = staging.JoinOnFinish
	}
	task, err := s.p.Open(ctx, staging.TaskSpec{ReqID: fmt.Sprintf("r%d", s.saves), WriteN: 1, Mode: mode})
	if err != nil {
		return err
	}
	if mode == staging.JoinNextStep {
		st, err := s.p.Stage(ctx, s.bufs[i], nil)
		if err != nil {
			return err
		}
		err = task.Append(ctx, staging.Chunk{Step: st, Rows: rows})
		if err == nil {
			err = s.p.Submit(ctx, task)
		}
		if rerr := st.Release(); err == nil {
			err = rerr
		}
		if err != nil {
			return err
		}
	} else {
		if err := task.Append(ctx, staging.Chunk{Device: s.bufs[i], Rows: rows}); err != nil {
			return err
		}
		if err := s.p.Submit(ctx, task); err != nil {
			return err
		}
	}
	if err := task.Wait(ctx); err != nil {
		return err
	}
	for _, row := range rows {
		got, err := s.p.ReadPool(row.Key, row.Slot)
		if err != nil || string(got) != string(s.data[i][row.Offset:row.Offset+stRow]) {
			s.rd.fail("staging: pool row (%s, %d) after a written save: %v (bytes equal: %v)", row.Key, row.Slot, err, err == nil && string(got) == string(s.data[i][row.Offset:row.Offset+stRow]))
		}
	}
	return nil
}

// close closes the pipeline and frees the device buffers.
func (s *scStaging) close(t *testing.T) {
	if s.p != nil {
		_ = s.p.Close(context.Background())
	}
	for _, b := range s.bufs {
		require.NoError(t, s.rd.sys.Backend().Free(b))
	}
	t.Logf("syscheck: staging: %d saves, %d written, %d failed, %d pipelines reopened", s.saves, s.written, s.failed, s.reopen)
}
