package system_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
)

// syncBuffer is a log sink safe for the runtime's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *syncBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// events decodes the log lines of one event kind.
func (w *syncBuffer) events(t *testing.T, kind string) []map[string]any {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(w.b.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), line)
		if m["event"] == kind {
			out = append(out, m)
		}
	}
	return out
}

func startLogged(t *testing.T, opts system.Options) (*system.System, *syncBuffer) {
	t.Helper()
	w := &syncBuffer{}
	log := zerolog.New(w).Level(zerolog.InfoLevel)
	opts.Logger = &log
	if opts.EventLevel == zerolog.DebugLevel {
		opts.EventLevel = zerolog.InfoLevel
	}
	if opts.Locations == nil {
		opts.Locations = []system.LocationConfig{system.NoLimit("pageable-host"), system.Limit("pinned-host", 1000), system.Limit("cuda:0", 1000)}
	}
	sys, err := startSoft(t, context.Background(), opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sys.Close(context.Background()) })
	return sys, w
}

func TestEventAdmissionRefused(t *testing.T) {
	ctx := context.Background()
	sys, w := startLogged(t, system.Options{})
	var be *system.BudgetError
	require.ErrorAs(t, sys.Reserve(ctx, "cuda:0", "big", 2000), &be)
	v, err := sys.StateVersion(ctx)
	require.NoError(t, err)

	h, err := sys.Register(ctx, system.Value{Name: "w", Bytes: 100, Mode: system.Replicable, At: "pageable-host"})
	require.NoError(t, err)
	require.NoError(t, sys.Copy(ctx, h, "pageable-host", "cuda:0"))
	lease, err := sys.Acquire(ctx, h, "cuda:0")
	require.NoError(t, err)
	var iu *system.InUseError
	require.ErrorAs(t, sys.Evict(ctx, h, "cuda:0"), &iu)
	require.NoError(t, lease.Release(ctx))

	evs := w.events(t, system.EventAdmissionRefused)
	require.Len(t, evs, 2)
	b := evs[0]
	assert.Equal(t, "info", b["level"])
	assert.Equal(t, "reserve", b["op"])
	assert.Equal(t, "ResidencyBudgetError", b["class"])
	assert.Equal(t, "budget", b["reason"])
	assert.Equal(t, "cuda:0", b["location"])
	assert.EqualValues(t, 2000, b["bytes"])
	assert.EqualValues(t, 1000, b["budget_bytes"])
	assert.EqualValues(t, v, b["state_version"])
	assert.NotContains(t, b, "suppressed")
	u := evs[1]
	assert.Equal(t, "evict", u["op"])
	assert.Equal(t, "in_use", u["reason"])
	assert.Equal(t, "w", u["handle"])
	assert.Equal(t, "cuda:0", u["location"])
	assert.EqualValues(t, 1, u["leases"])
}

func TestEventEvicted(t *testing.T) {
	ctx := context.Background()
	sys, w := startLogged(t, system.Options{})
	h, err := sys.Register(ctx, system.Value{Name: "old", Bytes: 600, Mode: system.Replicable, At: "pageable-host"})
	require.NoError(t, err)
	require.NoError(t, sys.Copy(ctx, h, "pageable-host", "cuda:0"))
	require.NoError(t, sys.Evict(ctx, h, "cuda:0"))
	v1, err := sys.StateVersion(ctx)
	require.NoError(t, err)

	// An Admit that makes room: the victim's event names the controller's
	// reason beside the removal's.
	require.NoError(t, sys.Copy(ctx, h, "pageable-host", "cuda:0"))
	n, err := sys.Register(ctx, system.Value{Name: "new", Bytes: 600, At: "pageable-host"})
	require.NoError(t, err)
	sc, d, err := sys.Admit(ctx, system.Request{Name: "step", Requirements: []system.Requirement{{Handle: n, Tiers: [][]string{{"cuda:0"}}}}})
	require.NoError(t, err)
	require.Len(t, d.Evictions, 1)
	require.NoError(t, sc.Exit(ctx))

	evs := w.events(t, system.EventEvicted)
	require.Len(t, evs, 2)
	e := evs[0]
	assert.Equal(t, "old", e["handle"])
	assert.Equal(t, "cuda:0", e["location"])
	assert.EqualValues(t, 600, e["bytes"])
	assert.Equal(t, system.RemovalEvict.String(), e["reason"])
	assert.EqualValues(t, v1, e["state_version"])
	assert.NotContains(t, e, "eviction")
	r := evs[1]
	assert.Equal(t, "old", r["handle"])
	assert.Equal(t, system.RemovalReclaim.String(), r["reason"])
	assert.Equal(t, d.Evictions[0].Kind.String(), r["eviction"])
	assert.Greater(t, r["state_version"], e["state_version"])
}

func TestEventLoaderFailed(t *testing.T) {
	ctx := context.Background()
	sys, w := startLogged(t, system.Options{})
	boom := errors.New("weights file missing")
	h, err := sys.Register(ctx, system.Value{Name: "weights", Bytes: 100, Mode: system.Replicable, Source: "pageable-host",
		Loader: func(context.Context, []byte) error { return boom }})
	require.NoError(t, err)
	require.ErrorIs(t, sys.Place(ctx, h, "cuda:0"), boom)

	c, err := cache.New(ctx, sys, cache.Options{Location: "cuda:0", Name: "models"})
	require.NoError(t, err)
	_, err = cache.Load(ctx, c, "m", 200, nil, func(context.Context) (*int, int64, error) { return nil, 0, boom })
	require.ErrorIs(t, err, boom)
	require.NoError(t, c.Close(ctx))

	evs := w.events(t, system.EventLoaderFailed)
	require.Len(t, evs, 2)
	v := evs[0]
	assert.Equal(t, "value", v["loader"])
	assert.Equal(t, "weights", v["handle"])
	assert.Equal(t, "cuda:0", v["location"])
	assert.EqualValues(t, 100, v["bytes"])
	assert.Contains(t, v, "state_version")
	assert.Contains(t, v["error"], "weights file missing")
	k := evs[1]
	assert.Equal(t, "cache", k["loader"])
	assert.Equal(t, "m", k["key"])
	assert.Equal(t, "cuda:0", k["location"])
	assert.EqualValues(t, 200, k["bytes"])
	assert.Equal(t, false, k["panicked"])
}

func TestEventStagingFailed(t *testing.T) {
	sys, w := startLogged(t, system.Options{})
	sys.ReportStagingFailure("ckpt", "cuda:0", 7, errors.New("copy failed"))
	evs := w.events(t, system.EventStagingFailed)
	require.Len(t, evs, 1)
	assert.Equal(t, "ckpt", evs[0]["pipeline"])
	assert.Equal(t, "cuda:0", evs[0]["location"])
	assert.EqualValues(t, 7, evs[0]["task"])
	assert.Equal(t, "copy failed", evs[0]["error"])
}

// A storm of refusals writes the burst and no more; the count of the
// lines left out is carried by the kind's next line (events_internal_test).
func TestEventStormIsBounded(t *testing.T) {
	ctx := context.Background()
	sys, w := startLogged(t, system.Options{EventBurst: 5, EventsPerSecond: 1e-9})
	for range 1000 {
		require.Error(t, sys.Reserve(ctx, "cuda:0", "big", 2000))
	}
	assert.Len(t, w.events(t, system.EventAdmissionRefused), 5)
}

// Events below the logger's level cost no line; bad rates are refused.
func TestEventLevelAndOptions(t *testing.T) {
	ctx := context.Background()
	sys, w := startLogged(t, system.Options{EventLevel: zerolog.Disabled})
	require.Error(t, sys.Reserve(ctx, "cuda:0", "big", 2000))
	assert.Empty(t, w.events(t, system.EventAdmissionRefused))
	_, err := startSoft(t, ctx, system.Options{Locations: []system.LocationConfig{system.NoLimit("pageable-host")}, EventBurst: -1})
	require.ErrorIs(t, err, system.ErrInvalidInput)
}
