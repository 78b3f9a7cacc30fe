package system_test

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/internal/testsys"
	"github.com/residency-go/residency/system"
)

// spillFixture: cuda:0 (100 bytes) spills to pinned-host (100 bytes); a
// (60 bytes, loaded from pageable-host) is resident at cuda:0, and x (60
// bytes) needs its place.
type spillFixture struct {
	sys   *system.System
	a, x  system.Handle
	loads atomic.Int64 // loader runs of a
	data  []byte
}

func newSpillFixture(t *testing.T, spill map[string]string) *spillFixture {
	t.Helper()
	ctx := context.Background()
	locs := []system.LocationConfig{system.NoLimit("pageable-host"), system.Limit("pinned-host", 100), system.Limit("cuda:0", 100)}
	sys, err := system.Start(ctx, system.Options{Locations: locs, Backend: testsys.Soft(t, locs), Spill: spill})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, sys.Close(context.Background())) })
	f := &spillFixture{sys: sys, data: bytes.Repeat([]byte{0xa5, 0x01}, 30)}
	f.a, err = sys.Register(ctx, system.Value{Name: "a", Bytes: 60, Source: "pageable-host", Loader: func(_ context.Context, dst []byte) error {
		f.loads.Add(1)
		copy(dst, f.data)
		return nil
	}})
	require.NoError(t, err)
	require.NoError(t, sys.Place(ctx, f.a, "cuda:0"))
	f.x, err = sys.Register(ctx, system.Value{Name: "x", Bytes: 60, Source: "pageable-host", Loader: func(context.Context, []byte) error { return nil }})
	require.NoError(t, err)
	return f
}

func (f *spillFixture) decide(t *testing.T) system.Decision {
	t.Helper()
	d, err := f.sys.Decide(context.Background(), system.Request{Name: "x", Requirements: []system.Requirement{{Handle: f.x, Tiers: [][]string{{"cuda:0"}}}}})
	require.NoError(t, err)
	require.Len(t, d.Evictions, 1)
	return d
}

func (f *spillFixture) where(t *testing.T, h system.Handle) []string {
	t.Helper()
	s, err := f.sys.Snapshot(context.Background())
	require.NoError(t, err)
	v, _ := s.Value(h.Name)
	var out []string
	for _, m := range v.Materializations {
		out = append(out, m.Location+":"+m.State.String())
	}
	return out
}

func (f *spillFixture) used(t *testing.T, loc string) int64 {
	t.Helper()
	s, err := f.sys.Snapshot(context.Background())
	require.NoError(t, err)
	r, ok := s.Location(loc)
	require.True(t, ok)
	return r.UsedBytes
}

func TestSpillDemotesTheOnlyCopy(t *testing.T) {
	ctx := context.Background()
	f := newSpillFixture(t, map[string]string{"cuda:0": "pinned-host"})
	d := f.decide(t)
	e := d.Evictions[0]
	assert.Equal(t, "pinned-host", e.To)
	assert.Equal(t, system.EvictionDemoted, e.Kind)
	assert.Contains(t, e.Reason, "demoted to pinned-host")
	assert.Equal(t, system.Action{Handle: f.a, Location: "cuda:0", To: "pinned-host"}, d.Plan.Reclaim[0])

	sc := f.sys.ScopeFor(d)
	require.NoError(t, sc.Enter(ctx))
	require.NoError(t, sc.Exit(ctx))
	assert.Equal(t, []string{"pinned-host:resident"}, f.where(t, f.a))
	assert.Equal(t, []string{"cuda:0:resident"}, f.where(t, f.x))
	got, err := f.sys.Read(ctx, f.a, "pinned-host")
	require.NoError(t, err)
	assert.Equal(t, f.data, got, "the demotion moved a's bytes")
	require.NoError(t, f.sys.Evict(ctx, f.x, "cuda:0"))
	require.NoError(t, f.sys.Place(ctx, f.a, "cuda:0"))
	assert.Equal(t, int64(1), f.loads.Load(), "a came back from pinned-host, not from its source")
}

func TestSpillNoneByDefault(t *testing.T) {
	f := newSpillFixture(t, nil)
	e := f.decide(t).Evictions[0]
	assert.Empty(t, e.To)
	assert.Equal(t, system.EvictionLowestPriority, e.Kind)
}

// A demotion whose copy fails leaves the value dropped, exactly as
// without spill: not half-moved (no materialization anywhere), charged
// nowhere, and the plan goes on.
func TestSpillFailedDemotionDrops(t *testing.T) {
	ctx := context.Background()
	f := newSpillFixture(t, map[string]string{"cuda:0": "pinned-host"})
	d := f.decide(t)
	require.Equal(t, "pinned-host", d.Evictions[0].To)
	testsys.Faults(f.sys).Arm(cuda.FaultCopy, "pinned-host")
	rep, err := f.sys.Execute(ctx, d.Plan)
	require.NoError(t, err, "a failed demotion does not fail the plan")
	assert.Equal(t, 0, testsys.Faults(f.sys).Armed(cuda.FaultCopy, "pinned-host"), "the demotion's copy met the fault")
	var kinds []string
	for _, x := range rep.Transitions {
		kinds = append(kinds, x.Kind+" "+x.Handle+" @"+x.Location)
	}
	assert.Equal(t, []string{"admit a @pinned-host", "fail a @pinned-host", "remove a @cuda:0", "admit x @cuda:0", "complete x @cuda:0"}, kinds)
	assert.Empty(t, f.where(t, f.a), "dropped, not half-moved")
	assert.Equal(t, []string{"cuda:0:resident"}, f.where(t, f.x))
	assert.Equal(t, int64(0), f.used(t, "pinned-host"), "nothing charged at the target")
	assert.Equal(t, int64(60), f.used(t, "cuda:0"), "a's charge released once, x's taken")
	require.NoError(t, f.sys.Evict(ctx, f.x, "cuda:0"))
	require.NoError(t, f.sys.Place(ctx, f.a, "cuda:0"))
	assert.Equal(t, int64(2), f.loads.Load(), "a dropped comes back from its source")
}

func TestSpillRefusedTargets(t *testing.T) {
	ctx := context.Background()
	locs := []system.LocationConfig{system.NoLimit("pageable-host"), system.Limit("cuda:0", 100)}
	for name, spill := range map[string]map[string]string{
		"itself":                {"cuda:0": "cuda:0"},
		"target not configured": {"cuda:0": "pinned-host"},
		"source not configured": {"cuda:1": "pageable-host"},
	} {
		_, err := system.Start(ctx, system.Options{Locations: locs, Backend: testsys.Soft(t, locs), Spill: spill})
		var ie *system.InvalidInputError
		assert.ErrorAs(t, err, &ie, name)
	}
}
