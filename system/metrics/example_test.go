package metrics_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/metrics"
)

// Mount the runtime's metrics on a registry the application serves; here
// the handler is called directly instead of from a Prometheus server.
func ExampleNewMetrics() {
	ctx := context.Background()
	sys := startExample()
	defer closeExample(sys)

	reg := prometheus.NewRegistry()
	m, err := metrics.NewMetrics(sys)
	if err != nil {
		log.Fatal(err)
	}
	reg.MustRegister(m)
	handler := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})

	h, _ := sys.Register(ctx, system.Value{Name: "weights", Bytes: 48 << 10, At: "pinned-host"})
	_ = sys.Place(ctx, h, "cuda:0")
	_, err = sys.Register(ctx, system.Value{Name: "too-big", Bytes: 80 << 10, At: "cuda:1"})
	fmt.Println(err != nil)

	rec := httptest.NewRecorder()
	handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		for _, prefix := range []string{
			`residency_location_used_bytes{location="cuda:0"}`,
			`residency_location_budget_bytes{location="cuda:0"}`,
			`residency_admissions_total{op="register"}`,
			`residency_admissions_refused_total`,
			`residency_transitions_total{kind="complete"}`,
		} {
			if strings.HasPrefix(line, prefix) {
				fmt.Println(line)
			}
		}
	}
	if rec.Code != http.StatusOK {
		log.Fatal(rec.Code)
	}
	// Output:
	// true
	// residency_admissions_refused_total{class="ResidencyBudgetError",op="register"} 1
	// residency_admissions_total{op="register"} 2
	// residency_location_budget_bytes{location="cuda:0"} 65536
	// residency_location_used_bytes{location="cuda:0"} 49152
	// residency_transitions_total{kind="complete"} 2
}

// startExample starts a runtime with an unlimited pageable host, 1 MiB of
// pinned host memory and two simulated 64 KiB devices.
func startExample() *system.System {
	sys, err := system.Start(context.Background(), simulated(system.Options{
		Locations: []system.LocationConfig{
			system.NoLimit("pageable-host"),
			system.Limit("pinned-host", 1<<20),
			system.Limit("cuda:0", 64<<10),
			system.Limit("cuda:1", 64<<10),
		},
	}))
	if err != nil {
		log.Fatal(err)
	}
	return sys
}

func closeExample(sys *system.System) {
	if err := sys.Close(context.Background()); err != nil {
		log.Fatal(err)
	}
}
