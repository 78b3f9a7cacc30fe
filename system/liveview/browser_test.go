package liveview_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
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

type pageView struct {
	Version   string
	Locations []pageLocation
	Values    []pageValue
	Trace     int
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
}))()`

// TestPageInBrowser mounts the view under a prefix and opens its page in
// headless Chromium: every figure it shows equals the snapshot at the
// state version it shows.
func TestPageInBrowser(t *testing.T) {
	browser := findChromium()
	if browser == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("chromium is not installed, and CI=true: `make test` installs it (target chromium); that step failed")
		}
		t.Skip("chromium is not installed (make chromium): skipped outside CI")
	}
	sys := startSoft(t)
	populate(t, sys)
	ctx := context.Background()
	lease, err := sys.Acquire(ctx, mustHandle(t, sys, "weights"), "cuda:0")
	require.NoError(t, err)
	defer func() { assert.NoError(t, lease.Release(ctx)) }()
	srv := mount(t, sys)
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
}

func mustHandle(t *testing.T, sys interface {
	Lookup(context.Context, string) (system.Handle, error)
}, name string) system.Handle {
	t.Helper()
	h, err := sys.Lookup(context.Background(), name)
	require.NoError(t, err)
	return h
}
