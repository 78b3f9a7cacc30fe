package system_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/internal/testsys"
	"github.com/residency-go/residency/system"
)

// backendCopier copies demotions through the backend and counts them.
type backendCopier struct {
	be    cuda.Backend
	calls atomic.Int32
	last  atomic.Pointer[system.Demotion]
}

func (c *backendCopier) CopyDemotion(ctx context.Context, d system.Demotion) (bool, error) {
	c.calls.Add(1)
	rec := system.Demotion{Value: d.Value, From: d.From, To: d.To, Bytes: d.Bytes}
	c.last.Store(&rec)
	b, err := c.be.Read(ctx, d.Src)
	if err != nil {
		return true, err
	}
	return true, c.be.Write(ctx, d.Dst, b)
}

func TestDemotionCopierCarriesOutTheSpill(t *testing.T) {
	ctx := context.Background()
	f := newSpillFixture(t, map[string]string{"cuda:0": "pinned-host"})
	c := &backendCopier{be: f.sys.Backend()}
	stop, err := f.sys.ServeDemotions("cuda:0", "pinned-host", c)
	require.NoError(t, err)
	_, err = f.sys.Execute(ctx, f.decide(t).Plan)
	require.NoError(t, err)
	assert.Equal(t, int32(1), c.calls.Load())
	assert.Equal(t, system.Demotion{Value: "a", From: "cuda:0", To: "pinned-host", Bytes: 60}, *c.last.Load())
	got, err := f.sys.Read(ctx, f.a, "pinned-host")
	require.NoError(t, err)
	assert.Equal(t, f.data, got)
	assert.Equal(t, int64(60), f.used(t, "pinned-host"), "charged once")

	// Once stopped, the copier is not asked: the value actor moves it.
	stop()
	require.NoError(t, f.sys.Evict(ctx, f.x, "cuda:0"))
	require.NoError(t, f.sys.Move(ctx, f.a, "pinned-host", "cuda:0"))
	_, err = f.sys.Execute(ctx, f.decide(t).Plan)
	require.NoError(t, err)
	assert.Equal(t, int32(1), c.calls.Load())
	assert.Equal(t, []string{"pinned-host:resident"}, f.where(t, f.a))
}

func TestDemotionServeRefusals(t *testing.T) {
	f := newSpillFixture(t, map[string]string{"cuda:0": "pinned-host"})
	c := &backendCopier{be: f.sys.Backend()}
	for name, route := range map[string][2]string{
		"unknown":  {"cuda:3", "pinned-host"},
		"same":     {"cuda:0", "cuda:0"},
		"malformd": {"cuda:0", "gpu"},
	} {
		_, err := f.sys.ServeDemotions(route[0], route[1], c)
		var ie *system.InvalidInputError
		assert.ErrorAs(t, err, &ie, name)
	}
	_, err := f.sys.ServeDemotions("cuda:0", "pinned-host", nil)
	assert.ErrorIs(t, err, system.ErrInvalidInput)

	locs := []system.LocationConfig{system.NoLimit("pageable-host"), system.Limit("cuda:0", 100)}
	sys, err := system.Start(context.Background(), system.Options{Locations: locs, Backend: testsys.Soft(t, locs)})
	require.NoError(t, err)
	require.NoError(t, sys.Close(context.Background()))
	_, err = sys.ServeDemotions("cuda:0", "pageable-host", c)
	assert.ErrorIs(t, err, system.ErrClosed)
}
