package staging

import (
	"context"
	"fmt"
	"slices"
)

// The pool write: a host-ready task's rows scattered into the CPU block
// pool, on the committer (or inline when eager).

// poolWriter is the scratch of pool writes. The committer keeps one for
// its life and writes one task at a time with it, so that a pool write
// allocates nothing; an inline (eager) pool write makes its own.
type poolWriter struct {
	p *Pipeline

	plan  []scatterRow
	offs  []int64 // pool offset of each plan row
	order []int   // plan rows, chunk by chunk
	rows  []int   // the rows of the chunk being written that the task still owns

	// The chunk being written, for scatter.
	task  *Task
	chunk []int // its rows (indexes into plan)
	view  func(context.Context, []byte) error
}

func (p *Pipeline) newPoolWriter() *poolWriter {
	w := &poolWriter{p: p}
	w.view = w.scatter // bound once
	return w
}

// write scatters the rows of t's plan (see planOf) into the CPU block
// pool, reading each chunk's host bytes (the staging slot, or the landed
// clone) in place: one copy per byte, slot → pool. Rows that follow each
// other both in the chunk and in the pool are written as one run (one
// copy() of the whole run: a step whose rows land on consecutive pool rows
// is written with a single large copy, which the Go runtime does with
// non-temporal stores beyond 1 MiB).
//
// A row that a later task took (its newest append is another task's) is
// skipped: ownership is read under the pool's lock, row by row, so the
// newest append wins whatever order the two tasks are written in.
func (w *poolWriter) write(ctx context.Context, t *taskRef, chunks []*taskChunk, plan []scatterRow) error {
	p := w.p
	p.mu.Lock()
	w.task = p.tasks[t.ID]
	p.mu.Unlock()
	defer func() { w.task, w.chunk = nil, nil }()
	// Pool offsets, checked before anything is written.
	w.offs = slices.Grow(w.offs[:0], len(plan))
	sorted := true // plan rows in chunk order (always, for one chunk)
	for i, r := range plan {
		off, err := p.poolOffset(r.Key, r.Slot)
		if err != nil {
			return err
		}
		w.offs = append(w.offs, off)
		if i > 0 && r.Chunk < plan[i-1].Chunk {
			sorted = false
		}
	}
	w.plan = plan
	w.order = slices.Grow(w.order[:0], len(plan))
	for i := range plan {
		w.order = append(w.order, i)
	}
	if !sorted {
		slices.SortStableFunc(w.order, func(a, b int) int { return plan[a].Chunk - plan[b].Chunk })
	}
	var written int64
	for lo := 0; lo < len(w.order); {
		ci := plan[w.order[lo]].Chunk
		hi := lo
		for hi < len(w.order) && plan[w.order[hi]].Chunk == ci {
			hi++
		}
		c := chunks[ci]
		src := c.Host
		if t.Mode == JoinNextStep {
			src = c.SlotBuf
		}
		w.chunk = w.order[lo:hi]
		w.rows = w.rows[:0]
		// The backend runs scatter on the chunk buffer's own bytes (a
		// reconstruction at its location, which a fault injector may
		// fail); scatter writes the pool through its host view.
		if err := p.be.Load(ctx, src, src.Location(), w.view); err != nil {
			return fmt.Errorf("pool write: %w", err)
		}
		written += int64(len(w.rows)) * p.cfg.RowBytes
		lo = hi
	}
	p.mu.Lock()
	p.counts.committedBytes += written
	p.mu.Unlock()
	return nil
}

// scatter writes the rows of the current chunk that the task still owns
// from b, the chunk's host bytes, into the pool's host view.
func (w *poolWriter) scatter(_ context.Context, b []byte) error {
	p, plan, offs, n := w.p, w.plan, w.offs, w.p.cfg.RowBytes
	p.poolMu.Lock()
	defer p.poolMu.Unlock()
	if p.poolMem == nil {
		return ErrClosed // freed by Close
	}
	p.mu.Lock()
	for _, r := range w.chunk {
		if p.owners[offs[r]/n] == w.task {
			w.rows = append(w.rows, r)
		}
	}
	p.mu.Unlock()
	rows := w.rows
	for i := 0; i < len(rows); {
		// The run of rows contiguous in both the chunk and the pool.
		first := rows[i]
		j := i + 1
		for j < len(rows) {
			prev, next := rows[j-1], rows[j]
			if plan[next].Offset != plan[prev].Offset+n || offs[next] != offs[prev]+n {
				break
			}
			j++
		}
		run := int64(j-i) * n
		so, do := plan[first].Offset, offs[first]
		copy(p.poolMem[do:do+run], b[so:so+run])
		i = j
	}
	return nil
}
