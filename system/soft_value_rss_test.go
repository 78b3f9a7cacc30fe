package system

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/cuda/soft"
)

// valueRSSChildEnv names the environment variable that makes
// TestSoftValueRSSChild register that many values and print its figures.
const valueRSSChildEnv = "RESIDENCY_VALUE_RSS_N"

// BenchmarkSoftValueRSS: memory per resident value through the public
// API on the soft backend, measured in a child process so that its
// resident set is this measurement's alone: n values of 1 byte (100,000;
// 1,000,000 with RESIDENCY_BENCH_1M=1), either each registered at cuda:0
// with its byte written (registered), or each registered with a loader
// that writes its byte and admitted at cuda:0 by Admit, its scope kept
// entered (admitted: a lease, the scope and the report of its entry per
// value, as a server holds the values in use). Reports the live Go heap per value after a
// collection (heap-B/value), the growth of the peak resident set per
// value while registering (peak-rss-B/value: the Go collector lets the
// heap grow to about twice the live heap between collections, GOGC=100),
// and the resident set per value once the collector has returned what it
// freed to the OS (rss-B/value). Linux only (/proc/self/status).
//
//	go test ./system -run '^$' -bench BenchmarkSoftValueRSS -benchtime 1x
//	RESIDENCY_BENCH_1M=1 go test ./system -run '^$' -bench BenchmarkSoftValueRSS -benchtime 1x
func BenchmarkSoftValueRSS(b *testing.B) {
	if runtime.GOOS != "linux" {
		b.Skip("VmHWM and VmRSS of /proc/self/status are Linux's")
	}
	n := 100000
	if os.Getenv("RESIDENCY_BENCH_1M") != "" {
		n = 1000000
	}
	for _, mode := range []string{"registered", "admitted"} {
		b.Run(mode, func(b *testing.B) {
			for b.Loop() {
				out := runChild(b, "^TestSoftValueRSSChild$", valueRSSChildEnv+"="+strconv.Itoa(n)+","+mode)
				var heap, peak, rss float64
				found := false
				sc := bufio.NewScanner(bytes.NewReader(out))
				for sc.Scan() {
					line := strings.TrimSpace(sc.Text())
					if _, err := fmt.Sscanf(line, "VALUEFIGURES heap=%g peak=%g rss=%g", &heap, &peak, &rss); err == nil {
						found = true
					}
				}
				require.True(b, found, "no figures from the child: %s", out)
				b.ReportMetric(heap, "heap-B/value")
				b.ReportMetric(peak, "peak-rss-B/value")
				b.ReportMetric(rss, "rss-B/value")
			}
		})
	}
}

// TestSoftValueRSSChild is the child of BenchmarkSoftValueRSS: it runs
// only when the parent sets valueRSSChildEnv.
func TestSoftValueRSSChild(t *testing.T) {
	arg := os.Getenv(valueRSSChildEnv)
	if arg == "" {
		t.Skip("run by BenchmarkSoftValueRSS in a child process")
	}
	count, mode, _ := strings.Cut(arg, ",")
	n, err := strconv.Atoi(count)
	require.NoError(t, err)
	ctx := context.Background()
	locs := []LocationConfig{NoLimit("pageable-host"), NoLimit("cuda:0")}
	be, err := SoftBackend(locs, soft.Config{})
	require.NoError(t, err)
	defer be.Close()
	s, err := Start(ctx, Options{Locations: locs, Backend: be})
	require.NoError(t, err)
	defer s.Close(ctx)

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	rss0, err := procStatus("VmRSS")
	require.NoError(t, err)
	scopes := registerValues(t, s, n, mode == "admitted")
	peak, err := procStatus("VmHWM")
	require.NoError(t, err)
	runtime.GC()
	runtime.ReadMemStats(&after)
	debug.FreeOSMemory()
	rss, err := procStatus("VmRSS")
	require.NoError(t, err)
	for _, sc := range scopes {
		require.NoError(t, sc.Exit(ctx))
	}
	per := func(v int64) float64 { return float64(v) / float64(n) }
	fmt.Printf("VALUEFIGURES heap=%.0f peak=%.0f rss=%.0f\n",
		per(int64(after.HeapAlloc)-int64(before.HeapAlloc)), per(peak-rss0), per(rss-rss0))
}

// registerValues registers n values of 1 byte: at cuda:0 with their byte
// written, or (admitted) from a loader that writes it, each admitted at
// cuda:0 and its scope returned, entered.
func registerValues(t *testing.T, s *System, n int, admitted bool) []*Scope {
	ctx := context.Background()
	one := []byte{1}
	load := func(_ context.Context, dst []byte) error {
		dst[0] = 1
		return nil
	}
	var scopes []*Scope
	for i := range n {
		v := Value{Name: "v" + strconv.Itoa(i), Bytes: 1, At: "cuda:0", Data: one}
		if admitted {
			v = Value{Name: v.Name, Bytes: 1, Source: "pageable-host", Loader: load}
		}
		h, err := s.Register(ctx, v)
		require.NoError(t, err)
		if !admitted {
			continue
		}
		sc, _, err := s.Admit(ctx, Request{Name: v.Name, Requirements: []Requirement{{Handle: h, Tiers: [][]string{{"cuda:0"}}}}})
		require.NoError(t, err)
		scopes = append(scopes, sc)
	}
	return scopes
}
