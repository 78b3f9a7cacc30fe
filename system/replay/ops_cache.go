package replay

import (
	"context"
	"errors"
	"fmt"
	"github.com/residency-go/residency/internal/jsonline"
	"github.com/residency-go/residency/system/wire"
	"sort"
	"strconv"
	"strings"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
)

// The loader cache ops of a replay script (package system/cache: New,
// Load, Cache.Evict, Cache.Statistics, Cache.Close and the cache's leases
// and pins). They are kept here so that the dispatch in script.go, Runner.go
// and output.go stays a line per hook.
//
// A cached value stands for its bytes: the loader returns a small struct
// and reports the script's "resident" figure, so a script about 40 GiB of
// weights holds a few bytes of real memory.

// cacheSpec holds the fields of a cache op.
type cacheSpec struct {
	cache, key, as, mode string
	hasAs                bool // load: "as" was given (an empty one is refused)
	spill                bool // cache_open: the cache opts into spill
	peak, resident       int64
}

func parseCacheOpen(o *Op, f *jsonline.Fields) {
	o.cache = &cacheSpec{spill: f.OptBool("spill")}
	o.resName, o.location = f.Str("name"), f.Str("location")
}

func parseLoad(o *Op, f *jsonline.Fields) {
	c := &cacheSpec{}
	o.cache = c
	c.cache, c.key, c.peak, c.resident = f.Str("cache"), f.Str("key"), f.Bytes("peak"), f.Bytes("resident")
	c.as, c.hasAs = f.OptStr("as")
}

func parseLoadFail(o *Op, f *jsonline.Fields) {
	c := &cacheSpec{}
	o.cache = c
	c.cache, c.key, c.peak, c.mode = f.Str("cache"), f.Str("key"), f.Bytes("peak"), f.Str("mode")
}

func parseCachePin(o *Op, f *jsonline.Fields) {
	o.cache = &cacheSpec{}
	o.lease, o.cache.as = f.Str("lease"), f.Str("as")
}

func parseCacheUnpin(o *Op, f *jsonline.Fields) {
	o.cache = &cacheSpec{}
	o.hold = f.Str("pin")
}

func parseCacheKey(o *Op, f *jsonline.Fields) {
	o.cache = &cacheSpec{}
	o.cache.cache, o.cache.key = f.Str("cache"), f.Str("key")
}

func parseCache(o *Op, f *jsonline.Fields) {
	o.cache = &cacheSpec{}
	o.cache.cache = f.Str("cache")
}

// cachedValue is what a replay caches: a stand-in for resident bytes.
type cachedValue struct {
	key      string
	resident int64
}

// errLoaderFailed is what a load_fail with mode "error" returns.
var errLoaderFailed = errors.New("the script's loader failed (load_fail mode \"error\")")

// cacheState is a replay's caches, cache leases and pins, by script name.
// A script's cache has its script name in the runtime too
// (cache.Options.Name), so the runtime's words for its charges are the
// script's: owner `cache "NAME"`, charges `cache "NAME"/KEY#N`.
type cacheState struct {
	caches map[string]*replayCache
	leases map[string]*cacheLeaseEntry
	pins   map[string]*cachePinEntry
}

type replayCache struct {
	c      *cache.Cache
	closed bool
}

type cacheLeaseEntry struct {
	lease    cache.Lease[*cachedValue]
	released bool
}

type cachePinEntry struct {
	pin      *cache.Pin
	released bool
}

func (r *Runner) cacheState() *cacheState {
	if r.caches == nil {
		r.caches = &cacheState{caches: map[string]*replayCache{}, leases: map[string]*cacheLeaseEntry{}, pins: map[string]*cachePinEntry{}}
	}
	return r.caches
}

// openCache resolves a cache name that is an op's first field; a closed
// cache refuses loads and evictions.
func (cs *cacheState) openCache(name string) (*cache.Cache, error) {
	e, ok := cs.caches[name]
	switch {
	case !ok:
		return nil, invalid("unknown cache %q (open it first with cache_open)", name)
	case e.closed:
		return nil, invalid("cache %q is closed", name)
	}
	return e.c, nil
}

// unknownLease is release's refusal of a name it does not know; a cache
// lease's name says which op releases it.
func (r *Runner) unknownLease(name string) error {
	if r.caches != nil {
		if _, ok := r.caches.leases[name]; ok {
			return invalid("unknown lease %q: it is a cache lease, release it with cache_release", name)
		}
	}
	return invalid("unknown lease %q", name)
}

func (r *Runner) execCacheOpen(ctx context.Context, o Op, res *Result) (bool, error) {
	cs := r.cacheState()
	// Fields: name, location. The name binds only on success; a cache
	// name stays bound after cache_close (its reservations keep its
	// name in snapshots and the trace).
	switch _, dup := cs.caches[o.resName]; {
	case o.resName == "":
		return false, invalid("a cache name must not be empty")
	case dup:
		return false, invalid("duplicate cache name %q", o.resName)
	}
	// The runtime knows the cache by its script name: its owner name is
	// `cache "NAME"`, as the script's words say it. (Names are unique in
	// the runtime as in the script, also after cache_close.)
	opts := cache.Options{Location: o.location, Name: o.resName}
	if o.cache.spill {
		// The copy at the spill target stands for the entry's bytes there,
		// as the entry itself does.
		opts.Spill = &cache.Spill{Demote: func(_ context.Context, _ string, v any) (any, error) {
			cv := *v.(*cachedValue)
			return &cv, nil
		}}
	}
	sc, err := cache.New(ctx, r.sys, opts)
	if err != nil {
		return true, err
	}
	cs.caches[o.resName] = &replayCache{c: sc}
	return true, nil
}

func (r *Runner) execLoad(ctx context.Context, o Op, res *Result) (bool, error) {
	cs := r.cacheState()
	c := o.cache
	// Fields: cache, key, peak, then resident or mode, then as. The
	// key and peak are checked here, in that order, with the
	// runtime's own words (it checks the peak first).
	sc, err := cs.openCache(c.cache)
	if err != nil {
		return false, err
	}
	switch {
	case c.key == "":
		return false, invalid("cache key is empty")
	case c.peak <= 0:
		return false, invalid("cache key %q: peak bytes must be positive, got %d", c.key, c.peak)
	}
	if o.Name == "load_fail" && c.mode != "error" && c.mode != "panic" {
		return false, invalid("unknown load_fail mode %q (use error or panic)", c.mode)
	}
	if c.hasAs {
		if c.as == "" {
			return false, invalid(`a cache lease name must not be empty (leave "as" out to release the lease at once)`)
		}
		if _, dup := cs.leases[c.as]; dup {
			return false, invalid("duplicate cache lease name %q", c.as)
		}
	}
	ran, warm := false, false
	loader := func(ctx context.Context) (*cachedValue, int64, error) {
		ran = true
		_, warm = cache.Demoted[*cachedValue](ctx)
		switch {
		case o.Name == "load":
			return &cachedValue{key: c.key, resident: c.resident}, c.resident, nil
		case c.mode == "panic":
			panic("the script's loader panicked (load_fail mode \"panic\")")
		}
		return nil, 0, errLoaderFailed
	}
	l, err := cache.Load(ctx, sc, c.key, c.peak, nil, loader)
	if err != nil {
		return true, err
	}
	out := &Load{Key: l.Key(), Bytes: l.Bytes(), Hit: !ran, Warm: warm}
	if c.hasAs {
		cs.leases[c.as] = &cacheLeaseEntry{lease: l}
		out.Lease = &c.as
	} else if err := l.Release(); err != nil {
		// Without as (and for load_fail, which found the key
		// resident), the lease is released at once.
		return true, err
	}
	res.Load = out
	return true, nil
}

func (r *Runner) execCacheRelease(ctx context.Context, o Op, res *Result) (bool, error) {
	cs := r.cacheState()
	e, ok := cs.leases[o.lease]
	switch {
	case !ok:
		if _, runtimeLease := r.leases[o.lease]; runtimeLease {
			return false, invalid("unknown cache lease %q: it is a lease of acquire, release it with release", o.lease)
		}
		return false, invalid("unknown cache lease %q", o.lease)
	case e.released:
		return false, invalid("cache lease %q was already released", o.lease)
	}
	e.released = true
	// Releasing the last reference of a closed cache's entry releases
	// its charge (a state version).
	return true, e.lease.Release()
}

func (r *Runner) execCachePin(ctx context.Context, o Op, res *Result) (bool, error) {
	cs := r.cacheState()
	c := o.cache
	// Fields: lease, then as.
	e, ok := cs.leases[o.lease]
	switch {
	case !ok:
		return false, invalid("unknown cache lease %q", o.lease)
	case e.released:
		return false, invalid("cannot pin through cache lease %q: it was released", o.lease)
	}
	if c.as == "" {
		return false, invalid("a cache pin name must not be empty")
	}
	if _, dup := cs.pins[c.as]; dup {
		return false, invalid("duplicate cache pin name %q", c.as)
	}
	cs.pins[c.as] = &cachePinEntry{pin: e.lease.Pin()}
	return false, nil
}

func (r *Runner) execCacheUnpin(ctx context.Context, o Op, res *Result) (bool, error) {
	cs := r.cacheState()
	e, ok := cs.pins[o.hold]
	switch {
	case !ok:
		return false, invalid("unknown cache pin %q", o.hold)
	case e.released:
		return false, invalid("cache pin %q was already released", o.hold)
	}
	e.released = true
	return true, e.pin.Release()
}

func (r *Runner) execCacheEvict(ctx context.Context, o Op, res *Result) (bool, error) {
	cs := r.cacheState()
	c := o.cache
	sc, err := cs.openCache(c.cache)
	if err != nil {
		return false, err
	}
	evicted, err := sc.Evict(ctx, c.key)
	if err != nil {
		return true, err
	}
	res.Evicted = &evicted
	return true, nil
}

func (r *Runner) execCacheStats(ctx context.Context, o Op, res *Result) (bool, error) {
	cs := r.cacheState()
	c := o.cache
	// Statistics also answer for a closed cache: what it still
	// charges (entries leased when it closed).
	e, ok := cs.caches[c.cache]
	if !ok {
		return false, invalid("unknown cache %q (open it first with cache_open)", c.cache)
	}
	st, err := e.c.Statistics(ctx)
	if err != nil {
		return true, err
	}
	res.Stats = wire.CacheStatsOf(st)
	return true, nil
}

func (r *Runner) execCacheClose(ctx context.Context, o Op, res *Result) (bool, error) {
	cs := r.cacheState()
	c := o.cache
	e, ok := cs.caches[c.cache]
	switch {
	case !ok:
		return false, invalid("unknown cache %q (open it first with cache_open)", c.cache)
	case e.closed:
		return false, invalid("cache %q was already closed", c.cache)
	}
	if err := e.c.Close(ctx); err != nil {
		return true, err
	}
	e.closed = true
	return true, nil
}

// Load is the result of load (and of a load_fail that found its key
// resident).
type Load struct {
	Key   string  `json:"key"`
	Bytes int64   `json:"bytes"`
	Hit   bool    `json:"hit"`
	Lease *string `json:"lease"`
	// Warm: the loader started from the key's demoted copy (a cache opened
	// with spill); absent otherwise.
	Warm bool `json:"warm,omitempty"`
}

// cacheErrorFields are the JSON fields of the cache's errors.
func (r *Runner) cacheErrorFields(e error) []Field {
	switch x := e.(type) {
	case *system.CacheBusyError:
		var refusal any
		if b := x.Refusal; b != nil {
			refusal = Object{{Key: "location", Value: b.Location}, {Key: "budget_bytes", Value: b.BudgetBytes}, {Key: "used_bytes", Value: b.UsedBytes},
				{Key: "reserved_bytes", Value: b.ReservedBytes}, {Key: "requested_bytes", Value: b.RequestedBytes}}
		}
		return []Field{{Key: "key", Value: nullable(x.Key)}, {Key: "location", Value: x.Location}, {Key: "refusal", Value: refusal}}
	case *system.CacheLoadError:
		var cause, panicked any
		if x.Cause != nil {
			typ, _ := classify(x.Cause)
			cause = Object{{Key: "type", Value: typ}, {Key: "message", Value: x.Cause.Error()}}
		}
		if x.Panic != nil {
			panicked = fmt.Sprint(x.Panic)
		}
		return []Field{{Key: "key", Value: x.Key}, {Key: "cause", Value: cause}, {Key: "panic", Value: panicked}}
	}
	return nil
}

// cacheOutstanding lists the cache leases and pins the script still
// holds ("" for none), in the script's names.
func (cs *cacheState) cacheOutstanding() string {
	if cs == nil {
		return ""
	}
	var leases, pins []string
	for name, e := range cs.leases {
		if !e.released {
			leases = append(leases, name)
		}
	}
	for name, e := range cs.pins {
		if !e.released {
			pins = append(pins, name)
		}
	}
	if len(leases)+len(pins) == 0 {
		return ""
	}
	sort.Strings(leases)
	sort.Strings(pins)
	var parts []string
	for _, k := range []struct {
		what  string
		names []string
	}{{"cache lease", leases}, {"cache pin", pins}} {
		switch len(k.names) {
		case 0:
		case 1:
			parts = append(parts, fmt.Sprintf("1 %s %s", k.what, quoteList(k.names)))
		default:
			parts = append(parts, fmt.Sprintf("%d %ss %s", len(k.names), k.what, quoteList(k.names)))
		}
	}
	return strings.Join(parts, " and ")
}

func quoteList(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = strconv.Quote(n)
	}
	return "[" + strings.Join(q, " ") + "]"
}

// closeNote is the outcome of the runtime's Close at the end of a
// script, with the cache leases and pins the script left held added to
// the note of what was still outstanding: like the runtime's leases and
// holds, they are released at close, and it is not a failure. The result
// is an *system.OutstandingError (errors.As) whenever err is one or
// only cache leases and pins were left; any other error is unchanged.
func (r *Runner) closeNote(err error) error {
	held := r.caches.cacheOutstanding()
	if held == "" {
		return err
	}
	var oe *system.OutstandingError
	switch {
	case err == nil:
		return &outstandingNote{base: &system.OutstandingError{}, text: "residency: closed with " + held + " still held (released at close)"}
	case errors.As(err, &oe):
		return &outstandingNote{base: err, text: err.Error() + "; " + held + " still held (released at close)"}
	}
	return err
}

// outstandingNote is a Close outcome with the script's cache leases and
// pins added to its message.
type outstandingNote struct {
	base error // an *system.OutstandingError
	text string
}

func (e *outstandingNote) Error() string { return e.text }
func (e *outstandingNote) Unwrap() error { return e.base }

func parseCacheRelease(o *Op, f *jsonline.Fields) {
	o.cache = &cacheSpec{}
	o.lease = f.Str("lease")
}

// CacheStatsOf is st in the JSON form of a cache_stats op's statistics.
func CacheStatsOf(st cache.Stats) *wire.CacheStats { return wire.CacheStatsOf(st) }
