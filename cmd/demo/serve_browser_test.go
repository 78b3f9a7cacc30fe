package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// findChromium returns the headless browser to drive, or "" when none is
// installed.
func findChromium() string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// artifactDir is where the screenshot goes: $RESIDENCY_TEST_ARTIFACTS when
// set (CI collects it), else the test's temporary folder.
func artifactDir(t *testing.T) string {
	if d := os.Getenv("RESIDENCY_TEST_ARTIFACTS"); d != "" {
		require.NoError(t, os.MkdirAll(d, 0o755))
		return d
	}
	return t.TempDir()
}

// pageLocation is a location as the page shows it.
type pageLocation struct {
	Location  string  `json:"location"`
	Used      string  `json:"used"`
	Reserved  string  `json:"reserved"`
	Budget    string  `json:"budget"`
	Peak      string  `json:"peak"`
	UsedText  string  `json:"usedText"`
	UsedWidth float64 `json:"usedWidth"` // % of the bar
	PeakLeft  float64 `json:"peakLeft"`  // % of the bar
}

type pageMat struct {
	Location, State       string
	Leases, Holds, Events int
}

type pageValue struct {
	Value string    `json:"value"`
	Bytes string    `json:"bytes"`
	Mats  []pageMat `json:"mats"`
}

type pageView struct {
	Version   string         `json:"version"`
	Locations []pageLocation `json:"locations"`
	Values    []pageValue    `json:"values"`
	Decisions int            `json:"decisions"`
	Evictions []string       `json:"evictions"`
}

const readPage = `(() => {
  const pctOf = s => parseFloat(s) || 0;
  return {
    version: document.getElementById("version").textContent,
    locations: [...document.querySelectorAll(".loc")].map(l => ({
      location: l.dataset.location,
      used: l.querySelector(".used").dataset.bytes,
      reserved: l.querySelector(".reserved").dataset.bytes,
      budget: l.querySelector(".budget").dataset.bytes,
      peak: l.querySelector(".peak").dataset.bytes,
      usedText: l.querySelector(".used b").textContent,
      usedWidth: pctOf(l.querySelector(".seg.used").style.width),
      peakLeft: pctOf(l.querySelector(".bar .peak").style.left),
    })),
    values: [...document.querySelectorAll("tr.value")].map(r => ({
      value: r.dataset.value,
      bytes: r.querySelector("td[data-bytes]").dataset.bytes,
      mats: [...r.querySelectorAll(".mat")].map(m => ({Location: m.dataset.location, State: m.dataset.state,
        Leases: +m.dataset.leases, Holds: +m.dataset.holds, Events: +m.dataset.events})),
    })),
    decisions: document.querySelectorAll(".decision").length,
    evictions: [...document.querySelectorAll(".eviction")].map(e => e.textContent),
  };
})()`

// TestServePageInBrowser opens the live page in headless Chromium once the
// embedded scenario has finished, and checks that every figure it shows
// equals the runtime's snapshot; it writes a screenshot.
func TestServePageInBrowser(t *testing.T) {
	browser := findChromium()
	if browser == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("chromium is not installed, and CI=true: `make test` installs it (target chromium); that step failed")
		}
		t.Skip("chromium is not installed: the browser test of demo serve needs it (make chromium, or apt-get install -y chromium); skipped outside CI")
	}
	r := startServe(t, serveOptions{}, nil)
	r.waitFinished(t)
	snap, err := r.srv.sys.Snapshot(context.Background())
	require.NoError(t, err)

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(browser),
		chromedp.NoSandbox, // CI runs as root
		chromedp.WindowSize(1400, 1000),
	)
	// Generous bounds: they stop a hung browser, they never time a fast one.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	defer acancel()
	bctx, bcancel := chromedp.NewContext(actx)
	defer bcancel()

	want := strconv.FormatUint(snap.StateVersion, 10)
	require.NoError(t, chromedp.Do(bctx,
		chromedp.Navigate(r.url),
		// The page has rendered the snapshot at the runtime's version.
		chromedp.WaitVisible(fmt.Sprintf(`body[data-version="%s"] .decision`, want)),
	))
	view, err := chromedp.Run(bctx, chromedp.Evaluate[pageView](readPage))
	require.NoError(t, err)
	shot, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)

	assert.Equal(t, want, view.Version)
	require.Len(t, view.Locations, len(snap.Locations))
	for i, l := range snap.Locations {
		p := view.Locations[i]
		assert.Equal(t, l.Location, p.Location)
		assert.Equal(t, strconv.FormatInt(l.UsedBytes, 10), p.Used, l.Location)
		assert.Equal(t, strconv.FormatInt(l.ReservedBytes, 10), p.Reserved, l.Location)
		assert.Equal(t, strconv.FormatInt(l.PeakBytes, 10), p.Peak, l.Location)
		assert.NotEmpty(t, p.UsedText)
		if l.HasBudget {
			assert.Equal(t, strconv.FormatInt(l.BudgetBytes, 10), p.Budget, l.Location)
			assert.InDelta(t, 100*float64(l.UsedBytes)/float64(l.BudgetBytes), p.UsedWidth, 0.01, "%s: the used bar", l.Location)
			assert.InDelta(t, 100*float64(l.PeakBytes)/float64(l.BudgetBytes), p.PeakLeft, 0.01, "%s: the peak mark", l.Location)
		} else {
			assert.Empty(t, p.Budget, "%s has no budget", l.Location)
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
	assert.Equal(t, 2, view.Decisions, "the scenario's two decisions")
	require.Len(t, view.Evictions, 1)
	assert.True(t, strings.HasPrefix(view.Evictions[0], "evict embedder@cuda:1"), view.Evictions[0])
	assert.Contains(t, view.Evictions[0], "among the lowest at cuda:1", "the reason is shown")

	path := filepath.Join(artifactDir(t), "demo-serve.png")
	require.NoError(t, os.WriteFile(path, shot, 0o644))
	t.Logf("screenshot: %s", path)

	bcancel()
	acancel()
	assert.Equal(t, 0, r.stop())
}
