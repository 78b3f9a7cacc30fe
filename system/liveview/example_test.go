package liveview_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"

	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/system"
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
	mux.Handle("/debug/residency/", http.StripPrefix("/debug/residency", liveview.Handler(sys)))
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
