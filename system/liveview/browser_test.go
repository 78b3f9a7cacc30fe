package liveview_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/staging"
	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/diagnose"
)

// findChromium returns the headless browser to drive, or "" when none is
// installed (make chromium installs it).
func findChromium() string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

type pageLocation struct {
	Location, Used, Reserved, Budget, Peak string
}

type pageMat struct {
	Location, State       string
	Leases, Holds, Events int
}

type pageValue struct {
	Value, Bytes string
	Mats         []pageMat
}

type pageEntry struct {
	Key, State, Bytes, Expiry string
	Leases, Pins, KeepAlives  int
	EvictWhenIdle             string
}

type pagePipeline struct {
	Pipeline                  string
	Tasks, Drops              map[string]int64
	Slots, Free, Holders      int
	CloneUsed, ClonePeak, Cap int64
}

type pageWaiter struct {
	Name, Locations, Since, Eligible, Bypass string
	Class, Tries                             int
}

type pageDiagnosis struct {
	Class string
	Steps []int
	Text  string
}

type pageView struct {
	Version   string
	Locations []pageLocation
	Values    []pageValue
	Trace     int
	Entries   []pageEntry
	Pipelines []pagePipeline
	Waiters   []pageWaiter
	Diagnosis pageDiagnosis
}

const readPage = `(() => ({
  Version: document.getElementById("version").textContent,
  Locations: [...document.querySelectorAll(".loc")].map(l => ({
    Location: l.dataset.location,
    Used: l.querySelector(".used").dataset.bytes,
    Reserved: l.querySelector(".reserved").dataset.bytes,
    Budget: l.querySelector(".budget").dataset.bytes,
    Peak: l.querySelector(".peak").dataset.bytes,
  })),
  Values: [...document.querySelectorAll("tr.value")].map(r => ({
    Value: r.dataset.value,
    Bytes: r.querySelector("td[data-bytes]").dataset.bytes,
    Mats: [...r.querySelectorAll(".mat")].map(m => ({Location: m.dataset.location, State: m.dataset.state,
      Leases: +m.dataset.leases, Holds: +m.dataset.holds, Events: +m.dataset.events})),
  })),
  Trace: document.querySelectorAll("#trace tbody tr").length,
  Entries: [...document.querySelectorAll("tr.entries .entry")].map(e => ({
    Key: e.dataset.key, State: e.dataset.state, Bytes: e.dataset.bytes, Expiry: e.dataset.expiry,
    Leases: +e.dataset.leases, Pins: +e.dataset.pins, KeepAlives: +e.dataset.keepalives, EvictWhenIdle: e.dataset.evictWhenIdle,
  })),
  Pipelines: [...document.querySelectorAll("tr.pipeline")].map(p => {
    const s = p.querySelector(".slots"), c = p.querySelector(".clone");
    return {Pipeline: p.dataset.pipeline,
      Tasks: Object.fromEntries([...p.querySelectorAll(".task")].map(x => [x.dataset.state, +x.dataset.count])),
      Drops: Object.fromEntries([...p.querySelectorAll(".drop")].map(x => [x.dataset.reason, +x.dataset.count])),
      Slots: +s.dataset.slots, Free: +s.dataset.free, Holders: +s.dataset.holders,
      CloneUsed: +c.dataset.used, ClonePeak: +c.dataset.peak, Cap: +c.dataset.cap};
  }),
  Waiters: [...document.querySelectorAll("tr.waiter")].map(w => ({Name: w.dataset.name, Locations: w.dataset.locations,
    Since: w.dataset.since, Eligible: w.dataset.eligible, Bypass: w.dataset.bypass, Class: +w.dataset.class, Tries: +w.dataset.tries})),
  Diagnosis: {Class: document.getElementById("diagnosis").dataset.class,
    Steps: [...document.querySelectorAll("#diagnosis .step")].map(s => +s.dataset.number),
    Text: document.getElementById("diagnosis").textContent},
}))()`

// TestPageInBrowser mounts the view (with a cache, a staging pipeline and
// the evidence of a failure) under a prefix and opens its page in
// headless Chromium: every figure it shows equals the snapshot at the
// state version it shows, the cache's entries, the pipeline's Stats and
// the failure's diagnosis.
func TestPageInBrowser(t *testing.T) {
	browser := findChromium()
	if browser == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("chromium is not installed, and CI=true: `make test` installs it (target chromium); that step failed")
		}
		t.Skip("chromium is not installed (make chromium): skipped outside CI")
	}
	f := newFixture(t)
	sys := f.sys
	ctx := context.Background()
	lease, err := sys.Acquire(ctx, mustHandle(t, sys, "weights"), "cuda:0")
	require.NoError(t, err)
	defer func() { assert.NoError(t, lease.Release(ctx)) }()
	srv := mount(t, sys, f.options()...)
	snap, err := sys.Snapshot(ctx)
	require.NoError(t, err)

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser), chromedp.NoSandbox)
	// A generous bound: it stops a hung browser, it never times a fast one.
	bctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	actx, acancel := chromedp.NewExecAllocator(bctx, opts...)
	defer acancel()
	cctx, ccancel := chromedp.NewContext(actx)
	defer ccancel()

	want := strconv.FormatUint(snap.StateVersion, 10)
	require.NoError(t, chromedp.Do(cctx,
		chromedp.Navigate(srv.URL+prefix+"/"),
		chromedp.WaitVisible(fmt.Sprintf(`body[data-version="%s"] .loc`, want)),
	))
	view, err := chromedp.Run(cctx, chromedp.Evaluate[pageView](readPage))
	require.NoError(t, err)

	assert.Equal(t, want, view.Version)
	require.Len(t, view.Locations, len(snap.Locations))
	for i, l := range snap.Locations {
		p := view.Locations[i]
		assert.Equal(t, l.Location, p.Location)
		assert.Equal(t, strconv.FormatInt(l.UsedBytes, 10), p.Used, l.Location)
		assert.Equal(t, strconv.FormatInt(l.ReservedBytes, 10), p.Reserved, l.Location)
		assert.Equal(t, strconv.FormatInt(l.PeakBytes, 10), p.Peak, l.Location)
		if l.HasBudget {
			assert.Equal(t, strconv.FormatInt(l.BudgetBytes, 10), p.Budget, l.Location)
		} else {
			assert.Empty(t, p.Budget, l.Location)
		}
	}
	require.Len(t, view.Values, len(snap.Values))
	for i, v := range snap.Values {
		p := view.Values[i]
		assert.Equal(t, v.Handle.Name, p.Value)
		assert.Equal(t, strconv.FormatInt(v.Bytes, 10), p.Bytes)
		require.Len(t, p.Mats, len(v.Materializations), v.Handle.Name)
		for j, m := range v.Materializations {
			assert.Equal(t, pageMat{Location: m.Location, State: m.State.String(), Leases: m.UseCount, Holds: m.HoldCount, Events: m.PendingEventCount}, p.Mats[j], v.Handle.Name)
		}
	}
	assert.Positive(t, view.Trace, "the trace is shown")

	entries := f.cache.Entries()
	require.Len(t, view.Entries, len(entries))
	for i, e := range entries {
		expiry := ""
		if !e.Expiry.IsZero() {
			expiry = e.Expiry.UTC().Format(time.RFC3339Nano)
		}
		assert.Equal(t, pageEntry{Key: e.Key, State: e.State.String(), Bytes: strconv.FormatInt(e.Bytes, 10), Expiry: expiry,
			Leases: e.Leases, Pins: e.Pins, KeepAlives: e.KeepAlives, EvictWhenIdle: strconv.FormatBool(e.EvictWhenIdle)}, view.Entries[i])
	}

	st := f.pipeline.Stats()
	require.Len(t, view.Pipelines, 1)
	tasks := map[string]int64{}
	for _, s := range []staging.TaskState{staging.Pending, staging.Queued, staging.Copying, staging.HostReady} {
		tasks[s.String()] = int64(st.Tasks[s])
	}
	assert.Equal(t, pagePipeline{Pipeline: "0", Tasks: tasks,
		Drops: map[string]int64{staging.DropBudget: st.Drops[staging.DropBudget], staging.DropLocation: st.Drops[staging.DropLocation]},
		Slots: st.Slots, Free: st.FreeSlots, Holders: st.SlotHolders,
		CloneUsed: st.CloneBytes, ClonePeak: st.PeakCloneBytes, Cap: st.CloneBudgetBytes}, view.Pipelines[0])

	ws := sys.Waiters()
	require.Len(t, view.Waiters, len(ws))
	require.NotEmpty(t, ws)
	for i, w := range ws {
		assert.Equal(t, pageWaiter{Name: w.Name, Locations: strings.Join(w.Locations, ","), Since: w.Since.UTC().Format(time.RFC3339Nano),
			Eligible: strconv.FormatBool(w.Eligible), Bypass: strconv.FormatBool(w.AllowBypass), Class: w.Class, Tries: w.Tries}, view.Waiters[i])
	}

	d := diagnose.DiagnoseEvidence(f.failure)
	assert.Equal(t, d.Class, view.Diagnosis.Class)
	var steps []int
	for _, s := range d.Steps {
		steps = append(steps, s.Number)
	}
	assert.Equal(t, steps, view.Diagnosis.Steps)
	assert.Contains(t, view.Diagnosis.Text, d.FirstAction)
}

func mustHandle(t *testing.T, sys interface {
	Lookup(context.Context, string) (system.Handle, error)
}, name string) system.Handle {
	t.Helper()
	h, err := sys.Lookup(context.Background(), name)
	require.NoError(t, err)
	return h
}
