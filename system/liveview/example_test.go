package liveview_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"

	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/staging"
	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
	"github.com/residency-go/residency/system/diagnose"
	"github.com/residency-go/residency/system/liveview"
)

// Mount the live view on the application's mux under its own prefix, as
// net/http/pprof is mounted, and read the snapshot it serves. The page
// is at /debug/residency/.
func ExampleHandler() {
	ctx := context.Background()
	locs := []system.LocationConfig{system.NoLimit("pageable-host"), system.Limit("cuda:0", 64<<10)}
	backend, err := system.SoftBackend(locs, soft.Config{}) // simulated devices: no GPU needed
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close()
	sys, err := system.Start(ctx, system.Options{Locations: locs, Backend: backend})
	if err != nil {
		log.Fatal(err)
	}
	defer sys.Close(ctx)
	h, _ := sys.Register(ctx, system.Value{Name: "weights", Bytes: 48 << 10, At: "pageable-host"})
	_ = sys.Place(ctx, h, "cuda:0")

	mux := http.NewServeMux()
	view, err := liveview.Handler(sys)
	if err != nil {
		log.Fatal(err)
	}
	mux.Handle("/debug/residency/", http.StripPrefix("/debug/residency", view))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	resp, err := http.Get(srv.URL + "/debug/residency/snapshot")
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	var snap struct {
		StateVersion uint64 `json:"state_version"`
		Locations    []struct {
			Location  string `json:"location"`
			UsedBytes int64  `json:"used_bytes"`
		} `json:"locations"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&snap); err != nil {
		log.Fatal(err)
	}
	fmt.Println(resp.StatusCode, resp.Header.Get("Content-Type"))
	for _, l := range snap.Locations {
		fmt.Println(l.Location, l.UsedBytes)
	}
	// Output:
	// 200 application/json
	// pageable-host 0
	// cuda:0 49152
}

// startExample starts a runtime on simulated devices (no GPU needed) at
// locs; stop closes it and its backend.
func startExample(ctx context.Context, locs ...system.LocationConfig) (sys *system.System, stop func()) {
	backend, err := system.SoftBackend(locs, soft.Config{})
	if err != nil {
		log.Fatal(err)
	}
	sys, err = system.Start(ctx, system.Options{Locations: locs, Backend: backend})
	if err != nil {
		log.Fatal(err)
	}
	return sys, func() { _ = sys.Close(ctx); _ = backend.Close() }
}

// getJSON decodes the JSON body of url into v.
func getJSON(url string, v any) {
	resp, err := http.Get(url)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		log.Fatal(err)
	}
}

// Show a loader cache: /caches lists its statistics and its entries
// (state, bytes, leases, pins, keep-alive, expiry, …).
func ExampleWithCache() {
	ctx := context.Background()
	sys, stop := startExample(ctx, system.NoLimit("pageable-host"), system.Limit("cuda:0", 64<<10))
	defer stop()
	models, err := cache.New(ctx, sys, cache.Options{Location: "cuda:0", Name: "models"})
	if err != nil {
		log.Fatal(err)
	}
	defer models.Close(ctx)
	lease, err := cache.Load(ctx, models, "encoder", 16<<10, nil, func(context.Context) (string, int64, error) {
		return "weights", 16 << 10, nil
	})
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release()

	view, err := liveview.Handler(sys, liveview.WithCache(models))
	if err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewServer(view)
	defer srv.Close()
	var out struct {
		Caches []struct {
			Entries []struct {
				Key         string `json:"key"`
				State       string `json:"state"`
				Bytes       int64  `json:"bytes"`
				Leases      int    `json:"leases"`
				KeepAliveNS *int64 `json:"keep_alive_ns"`
			} `json:"entries"`
		} `json:"caches"`
	}
	getJSON(srv.URL+"/caches", &out)
	for _, c := range out.Caches {
		for _, e := range c.Entries {
			fmt.Println(e.Key, e.State, e.Bytes, "leases:", e.Leases, "kept forever:", e.KeepAliveNS == nil)
		}
	}
	// Output:
	// encoder ready 16384 leases: 1 kept forever: true
}

// Show a staging pipeline: /pipelines has its live tasks per state, its
// staging slots, its clone budget and its drops by reason.
func ExampleWithPipeline() {
	ctx := context.Background()
	sys, stop := startExample(ctx, system.NoLimit("pageable-host"), system.NoLimit("pinned-host"), system.Limit("cuda:0", 1<<20))
	defer stop()
	p, err := staging.New(ctx, sys, staging.Config{
		Device: "cuda:0", Slots: 2, SlotBytes: 4 << 10,
		Keys: []string{"k", "v"}, PoolSlots: 16, RowBytes: 1 << 10, CloneBudgetBytes: 64 << 10,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close(ctx)
	if _, err := p.Open(ctx, staging.TaskSpec{ReqID: "req-1", WriteN: 1, Mode: staging.JoinOnFinish}); err != nil {
		log.Fatal(err)
	}

	view, err := liveview.Handler(sys, liveview.WithPipeline(p))
	if err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewServer(view)
	defer srv.Close()
	var out struct {
		Pipelines []struct {
			Pipeline int `json:"pipeline"`
			Stats    struct {
				Slots            int              `json:"slots"`
				FreeSlots        int              `json:"free_slots"`
				CloneBudgetBytes int64            `json:"clone_budget_bytes"`
				Tasks            map[string]int   `json:"tasks"`
				Drops            map[string]int64 `json:"drops"`
			} `json:"stats"`
		} `json:"pipelines"`
	}
	getJSON(srv.URL+"/pipelines", &out)
	for _, x := range out.Pipelines {
		st := x.Stats
		fmt.Println("pipeline", x.Pipeline, "slots", st.FreeSlots, "of", st.Slots, "free; clone budget", st.CloneBudgetBytes)
		fmt.Println("pending tasks", st.Tasks[staging.Pending.String()], "drops", st.Drops[staging.DropBudget], st.Drops[staging.DropLocation])
	}
	// Output:
	// pipeline 0 slots 2 of 2 free; clone budget 65536
	// pending tasks 1 drops 0 0
}

// Serve the diagnosis of the application's last failure: the application
// keeps the evidence (diagnose.Capture, right after the failed call) and
// hands it to the view, which diagnoses it at /diagnose (JSON, or text
// with ?format=text).
func ExampleWithEvidence() {
	ctx := context.Background()
	sys, stop := startExample(ctx, system.NoLimit("pageable-host"), system.Limit("cuda:0", 64<<10))
	defer stop()

	var (
		mu   sync.Mutex
		last *diagnose.Evidence
	)
	lastFailure := func() (diagnose.Evidence, bool) {
		mu.Lock()
		defer mu.Unlock()
		if last == nil {
			return diagnose.Evidence{}, false
		}
		return *last, true
	}
	view, err := liveview.Handler(sys, liveview.WithEvidence(lastFailure))
	if err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewServer(view)
	defer srv.Close()

	var d *struct {
		Class     string `json:"class"`
		Operation struct {
			Kind     string `json:"kind"`
			Location string `json:"location"`
		} `json:"operation"`
	}
	getJSON(srv.URL+"/diagnose", &d)
	fmt.Println("before any failure:", d == nil)

	_, err = sys.Register(ctx, system.Value{Name: "too-big", Bytes: 128 << 10, At: "cuda:0"})
	if err != nil {
		ev, cerr := diagnose.Capture(ctx, sys, err, diagnose.Operation{Kind: "register", Handle: system.Handle{Name: "too-big"}, Location: "cuda:0"})
		if cerr != nil {
			log.Fatal(cerr)
		}
		mu.Lock()
		last = &ev
		mu.Unlock()
	}
	getJSON(srv.URL+"/diagnose", &d)
	fmt.Println(d.Class, d.Operation.Kind, d.Operation.Location)
	// Output:
	// before any failure: true
	// ResidencyBudgetError register cuda:0
}

// See who waits for room: /waiters lists the callers of Admit (or of a
// cache's Load) that wait with a system.WaitOption, in queue order.
func ExampleHandler_waiters() {
	ctx := context.Background()
	sys, stop := startExample(ctx, system.NoLimit("pageable-host"), system.Limit("cuda:0", 64<<10))
	defer stop()
	block := func(name string, bytes int64) system.Request {
		return system.Request{Name: name, Reservations: []system.ReservationSpec{{Name: name, Location: "cuda:0", Bytes: bytes}}}
	}
	holder, _, err := sys.Admit(ctx, block("batch-1", 48<<10))
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan error)
	go func() {
		sc, _, err := sys.Admit(ctx, block("batch-2", 32<<10), system.WaitClass(1))
		if err == nil {
			err = sc.Exit(ctx)
		}
		done <- err
	}()
	for len(sys.Waiters()) == 0 { // until batch-2 is queued
		runtime.Gosched()
	}

	view, err := liveview.Handler(sys)
	if err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewServer(view)
	defer srv.Close()
	var out struct {
		Waiters []struct {
			Name      string   `json:"name"`
			Class     int      `json:"class"`
			Locations []string `json:"locations"`
		} `json:"waiters"`
	}
	getJSON(srv.URL+"/waiters", &out)
	for _, w := range out.Waiters {
		fmt.Println(w.Name, "waits in class", w.Class, "at", w.Locations)
	}
	if err := holder.Exit(ctx); err != nil {
		log.Fatal(err)
	}
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	getJSON(srv.URL+"/waiters", &out)
	fmt.Println("waiting now:", len(out.Waiters))
	// Output:
	// batch-2 waits in class 1 at [cuda:0]
	// waiting now: 0
}
