package cache

import (
	"context"
	"errors"
	"fmt"
	"reflect"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/system"
)

// Spill of cache entries: a cache that opts in ([Options].Spill) has its
// idle entries demoted to the spill target of its location instead of
// dropped, when the controller picks one as a victim and the target has
// room (docs/cache.md, "Spill"; the ledger's side is
// budget/charges_spill.go). The runtime cannot copy an application's
// value itself: the cache calls the application's [Spill].Demote, which
// makes the copy kept there (weights in pinned host memory, say), and
// keeps that copy under a charge of its own at the target. The next load
// of the key hands the copy to its loader ([Demoted]): a warm start.
//
// A demoted copy is a cacheEntry with copyAt set: it is in byCharge (its
// charge is offered, plainly, as an idle entry at the target) and in
// spill.copies by key, never in the book. A load of its key takes it
// (taken: withdrawn, never dropped) for the loader, and releases it once
// the load succeeded, or offers it again when the load failed.

// Spill opts a cache's idle entries into demotion.
type Spill struct {
	// Demote makes, from value (the entry's value, as loaded), the copy
	// of key kept at the spill target of the cache's location
	// ([system.Options].Spill), charged there with the entry's bytes.
	// Required. It runs on a goroutine of its own while the admission
	// whose plan demotes the entry waits for it: keep it bounded. Its
	// context ends when the cache closes (Close waits for it). After
	// it returns the cache closes value as it would on a drop. An error
	// or a panic drops the entry, exactly as without spill; the copy it
	// returned with an error is not kept. A copy that implements
	// interface{ Close() error } is closed when the cache lets it go.
	Demote func(ctx context.Context, key string, value any) (any, error)
}

// cacheSpill is a cache's spill state: fixed fields, then those guarded
// by Cache.mu.
type cacheSpill struct {
	to     string // the spill target of the cache's location ("": no spill)
	demote func(ctx context.Context, key string, value any) (any, error)
	// ctx is Demote's context: canceled when the cache closes (stop).
	ctx  context.Context
	stop context.CancelFunc

	copies    map[string]*cacheEntry // demoted copies by key
	demotions uint64                 // entries demoted
	failures  uint64                 // demotions whose Demote failed (entry dropped)
	warm      uint64                 // loads handed a demoted copy
}

// newSpill validates opts.Spill against the runtime's spill targets.
func newSpill(opts Options, target func(string) (string, bool)) (cacheSpill, error) {
	if opts.Spill == nil {
		return cacheSpill{}, nil
	}
	if opts.Spill.Demote == nil {
		return cacheSpill{}, &budget.InvalidInputError{Message: "cache: Options.Spill.Demote is nil"}
	}
	to, ok := target(opts.Location)
	if !ok {
		return cacheSpill{}, &budget.InvalidInputError{Message: fmt.Sprintf("cache: Options.Spill is set but %s has no spill target (set one in system.Options.Spill)", opts.Location)}
	}
	ctx, stop := context.WithCancel(context.Background())
	return cacheSpill{to: to, demote: opts.Spill.Demote, ctx: ctx, stop: stop, copies: map[string]*cacheEntry{}}, nil
}

// demotable says whether e's charge is offered as demotable: the cache
// opted in, and e is a ready entry of one charge (a split entry, a
// budgeted one or a demoted copy is dropped).
func (c *Cache) demotable(e *cacheEntry) bool {
	return c.sp.to != "" && e.split == nil && e.copyAt == "" && e.charge != ""
}

// errNotDemoted: the entry a demotion named could not be demoted (it had
// left the cache, was leaving, or is not demotable); it was dropped.
var errNotDemoted = errors.New("the cache entry was leaving or could not be demoted: dropped")

// DemoteCharge demotes the entry whose charge a plan demotes to to: an
// idle entry leaves the book, Demote makes its copy, its value is closed,
// and the copy is kept under demoted (settle(nil, nil)); a Demote that
// fails drops the entry (settle(nil, err)); an entry that became busy
// refuses (settle(refusal, nil)). An entry that is not there to demote
// (gone, leaving, a copy) is dropped as DropCharge would, and answered
// as dropped: the runtime releases the new charge too.
func (d dropper) DemoteCharge(charge, to, demoted string, settle func(refusal, dropped error)) {
	dropped := func(refusal error) {
		if refusal != nil {
			settle(refusal, nil)
			return
		}
		settle(nil, errNotDemoted)
	}
	c := d.c.Value()
	if c == nil {
		dropped(nil) // the cache is gone: nothing holds the value
		return
	}
	c.lockForDrop()
	e := c.byCharge[charge]
	if e == nil || e.retiring.Load() || e.detached.Load() || !c.demotable(e) || c.closed || to != c.sp.to {
		c.dropLocked(charge, dropped)
		return
	}
	if !c.leaveBookLocked(e, dropped) {
		return
	}
	c.busy++
	c.mu.Unlock()
	defer c.workDone()
	copied, err := c.callDemote(e.key, reflect.ValueOf(e.box).Elem().Interface())
	e.closeBox()
	if err == nil {
		err = c.keepCopy(e, to, demoted, copied)
	}
	if err != nil {
		c.mu.Lock()
		c.sp.failures++
		c.mu.Unlock()
		c.rt.Log().Warn().Err(err).Str("cache", c.owner).Str("key", e.key).Str("to", to).Msg("cache entry's demotion failed; the entry is dropped")
		settle(nil, err)
		e.gone()
		return
	}
	settle(nil, nil)
	e.gone()
}

// keepCopy files the copy of e made at to under the charge demoted and
// offers it (the next drain offers its charge as an idle entry). A
// closed cache keeps nothing: the copy is closed and the demotion answered
// as dropped.
func (c *Cache) keepCopy(e *cacheEntry, to, demoted string, copied any) error {
	box := new(any)
	*box = copied
	cp := &cacheEntry{c: c, key: e.key, box: box, bytes: e.bytes, charge: demoted, copyAt: to, released: make(chan struct{})}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		closeValue(c, e.key, copied)
		return system.ErrCacheClosed
	}
	// An older copy of the key is there when the entry was loaded cold
	// while its predecessor's Demote ran. It is let go now, unless a load
	// holds it: that load lets it go when it ends (settleCopy).
	old := c.sp.copies[e.key]
	c.sp.copies[e.key] = cp
	c.byCharge[demoted] = cp
	c.sp.demotions++
	cp.wants = true
	c.markLocked(cp)
	release := old != nil && !old.taken && old.retiring.CompareAndSwap(false, true)
	c.mu.Unlock()
	if release {
		c.releaseCopy(old)
	}
	return nil
}

// callDemote runs Demote, turning a panic or a runtime.Goexit (see
// guarded) into an error.
func (c *Cache) callDemote(key string, v any) (copied any, err error) {
	if panicked, r, stack := guarded(func() { copied, err = c.sp.demote(c.sp.ctx, key, v) }); panicked {
		return nil, fmt.Errorf("cache key %q: Spill.Demote panicked: %v\n%s", key, r, stack)
	}
	if err != nil {
		if copied != nil {
			closeValue(c, key, copied)
		}
		return nil, fmt.Errorf("cache key %q: Spill.Demote: %w", key, err)
	}
	return copied, nil
}

// dropCopyLocked drops the demoted copy e whose charge a plan evicts
// (c.mu held; released): refused while a load holds it.
func (c *Cache) dropCopyLocked(e *cacheEntry, settle func(error)) {
	if e.taken { // read under c.mu: a load settles it (settleCopy)
		c.mu.Unlock()
		c.refuse(e, settle)
		return
	}
	if !e.retiring.CompareAndSwap(false, true) {
		c.mu.Unlock()
		<-e.released // leaving by another way (Close, a load that used it)
		settle(nil)
		return
	}
	c.forgetCopyLocked(e)
	c.busy++
	c.mu.Unlock()
	defer c.workDone()
	e.closeBox()
	settle(nil)
	e.gone()
}

// forgetCopyLocked removes the copy e from the cache's index (c.mu held).
func (c *Cache) forgetCopyLocked(e *cacheEntry) {
	if c.sp.copies[e.key] == e {
		delete(c.sp.copies, e.key)
	}
}

// releaseCopy lets the copy e go (its retiring set by the caller): its
// value closed, its charge released.
func (c *Cache) releaseCopy(e *cacheEntry) {
	c.mu.Lock()
	c.forgetCopyLocked(e)
	c.mu.Unlock()
	e.release() // value closed, then its charge released (a copy is never split)
}

// takeCopyLocked takes key's demoted copy for a load about to start (c.mu
// held): withdrawn from the controller until the load settles. nil: none.
func (c *Cache) takeCopyLocked(key string) *cacheEntry {
	cp := c.sp.copies[key]
	if cp == nil || cp.taken || cp.retiring.Load() {
		return nil
	}
	cp.taken = true
	c.withdrawLocked(cp)
	c.sp.warm++
	return cp
}

// settleCopy ends a load's hold on the copy it took: released once the
// load succeeded (the loaded entry replaces it) or a newer copy of the
// key replaced it meanwhile, offered again otherwise.
func (c *Cache) settleCopy(cp *cacheEntry, loaded bool) {
	if cp == nil {
		return
	}
	c.mu.Lock()
	cp.taken = false
	if loaded || c.closed || c.sp.copies[cp.key] != cp {
		release := cp.retiring.CompareAndSwap(false, true)
		c.mu.Unlock()
		if release {
			c.releaseCopy(cp)
		}
		return
	}
	cp.wants = true
	c.markLocked(cp)
	c.mu.Unlock()
}

// releaseCopies lets every demoted copy go (Close; no load is running).
func (c *Cache) releaseCopies() {
	c.mu.Lock()
	var out []*cacheEntry
	for _, cp := range c.sp.copies {
		if cp.retiring.CompareAndSwap(false, true) {
			out = append(out, cp)
		}
	}
	c.mu.Unlock()
	for _, cp := range out {
		c.releaseCopy(cp)
	}
}

// Demoted returns, inside a loader (its context or one derived from it),
// the copy of the key being loaded that the cache kept at its spill
// target when the key's entry was demoted ([Spill]), as a T: a warm
// start. false when there is none, or it is not a T. The copy stays the
// cache's: it is closed and its charge released once the load succeeded
// (copy what the new value needs from it), and kept for a later load
// when the load failed.
func Demoted[T any](ctx context.Context) (T, bool) {
	var zero T
	l := loadingOf(ctx)
	if l == nil || l.warm == nil {
		return zero, false
	}
	v, ok := (*l.warm.box.(*any)).(T)
	if !ok {
		return zero, false
	}
	return v, true
}
