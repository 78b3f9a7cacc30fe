package staging

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/residency-go/residency/cuda"
)

// Reads of a task's rows and of the CPU block pool.

// ReadRow returns a copy of the task's row (key, slot). ErrNoRow when no
// chunk of the task wrote the row, or a later task took it before this
// task's pool write. For a JOIN_ON_FINISH task not yet written it reads the
// host rows its copy stage landed, or the device clone (after the clone's
// event) while that copy has not landed; once the task is written, and
// always for a JOIN_NEXT_STEP task (after waiting for its pool write), it
// reads the CPU block pool — which a later task may have written since.
// The task's failure if it failed.
func (t *Task) ReadRow(ctx context.Context, key string, slot int) ([]byte, error) {
	p := t.p
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer p.exit()
	k, err := p.rowIndex(key, slot)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	_, has := slices.BinarySearch(t.has, k)
	_, lost := t.lost[k]
	p.mu.Unlock()
	if !has || lost {
		return nil, ErrNoRow
	}
	if t.Mode() == JoinNextStep {
		if err := t.Wait(ctx); err != nil {
			return nil, err
		}
		return p.readPool(key, slot)
	}
	for {
		src, err := p.sys.Source(ctx, t.t, key, slot)
		if err != nil {
			return nil, err
		}
		switch {
		case src.State == Written:
			return p.readPool(key, slot)
		case src.State == Failed:
			<-t.t.Done()
			return nil, t.t.Err()
		case !src.Found:
			return nil, ErrNoRow
		}
		if src.Event != nil {
			if err := src.Event.Wait(ctx); err != nil {
				return nil, err
			}
		}
		out, err := p.readRange(ctx, src.Buf, src.Offset, src.OnDevice)
		if errors.Is(err, cuda.ErrFreed) {
			continue // the copy landed (or the pool write finished) meanwhile: look again
		}
		return out, err
	}
}

// readRange copies RowBytes at off from buf: a device clone through the
// backend, a host buffer through a view of its bytes.
func (p *Pipeline) readRange(ctx context.Context, buf cuda.Buffer, off int64, onDevice bool) ([]byte, error) {
	n := p.cfg.RowBytes
	if onDevice {
		b, err := p.be.Read(ctx, buf)
		if err != nil {
			return nil, err
		}
		return b[off : off+n : off+n], nil
	}
	out := make([]byte, n)
	err := p.hostView(ctx, buf, func(b []byte) { copy(out, b[off:off+n]) })
	return out, err
}

// ReadPool returns a copy of the CPU block pool's row (key, slot): what the
// committer wrote there last (zeros if nothing yet).
func (p *Pipeline) ReadPool(key string, slot int) ([]byte, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer p.exit()
	return p.readPool(key, slot)
}

func (p *Pipeline) readPool(key string, slot int) ([]byte, error) {
	off, err := p.poolOffset(key, slot)
	if err != nil {
		return nil, err
	}
	out := make([]byte, p.cfg.RowBytes)
	p.poolMu.RLock()
	defer p.poolMu.RUnlock()
	if p.poolMem == nil {
		return nil, ErrClosed // freed by Close
	}
	copy(out, p.poolMem[off:])
	return out, nil
}

func (p *Pipeline) poolOffset(key string, slot int) (int64, error) {
	k, err := p.rowIndex(key, slot)
	if err != nil {
		return 0, err
	}
	return int64(k) * p.cfg.RowBytes, nil
}

// rowIndex is the pool row of (key, slot), checked.
func (p *Pipeline) rowIndex(key string, slot int) (int, error) {
	ki, ok := p.keys[key]
	if !ok {
		return 0, fmt.Errorf("%w: unknown key %q", ErrConfig, key)
	}
	if slot < 0 || slot >= p.cfg.PoolSlots {
		return 0, fmt.Errorf("%w: pool slot %d out of range [0, %d)", ErrConfig, slot, p.cfg.PoolSlots)
	}
	return p.poolRow(ki, slot), nil
}

// poolRow is the index of the pool row of (key index ki, slot): rows are
// laid out key by key, slot by slot.
func (p *Pipeline) poolRow(ki, slot int) int { return ki*p.cfg.PoolSlots + slot }
