package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/replay"
)

// Replay throughput: whole scripts replayed with --json to io.Discard, the
// way CI runs them (see BENCHMARKS.md, "Replay throughput"):
//
//	go test -run '^$' -bench BenchmarkReplay -benchtime 3x ./cmd/demo/
//
// ops/s is the script's ops over the wall-clock time of the replay, both
// passes (check, run) and the runtime's start and close included.

// benchScript returns a script of n ops after start, built by kind:
//
//   - register: n values of 64 B registered resident at cuda:0 (the
//     runtime allocates and initializes a buffer for each);
//   - mixed: blocks of ten ops on a fresh value: register (with a
//     source), place on cuda:0 (a reconstruction), acquire, release,
//     hold, unhold, reserve, unreserve, evict, discard;
//   - protect: blocks of six ops on 64 resident values: acquire,
//     release, hold, unhold, reserve, unreserve (no transfers: what the
//     replay itself costs per op, the runtime's bookkeeping included);
//   - rpe: blocks of three ops on a fresh value of 64 B: register with a
//     source, place on cuda:0 (a reconstruction: the loader fills the
//     buffer), evict from cuda:0;
//   - rpe1m: the same with 1 MiB values (the replay's BufferLimit: every
//     byte is made, filled and kept).
func benchScript(kind string, n int) string {
	var b strings.Builder
	b.Grow(n * 90)
	b.WriteString(`{"op":"start","locations":{"pageable-host":null,"cuda:0":null}}` + "\n")
	emit := func(format string, args ...any) bool {
		if n == 0 {
			return false
		}
		fmt.Fprintf(&b, format+"\n", args...)
		n--
		return true
	}
	switch kind {
	case "register":
		for i := 0; n > 0; i++ {
			emit(`{"op":"register","handle":"v%d","bytes":64,"at":"cuda:0"}`, i)
		}
	case "mixed":
		for i := 0; n > 0; i++ {
			_ = emit(`{"op":"register","handle":"v%d","bytes":"4KiB","source":"pageable-host"}`, i) &&
				emit(`{"op":"place","handle":"v%d","location":"cuda:0"}`, i) &&
				emit(`{"op":"acquire","handle":"v%d","location":"cuda:0","as":"l%d"}`, i, i) &&
				emit(`{"op":"release","lease":"l%d"}`, i) &&
				emit(`{"op":"hold","handle":"v%d","location":"cuda:0","as":"h%d"}`, i, i) &&
				emit(`{"op":"unhold","hold":"h%d"}`, i) &&
				emit(`{"op":"reserve","location":"cuda:0","bytes":"1KiB","name":"r%d"}`, i) &&
				emit(`{"op":"unreserve","name":"r%d"}`, i) &&
				emit(`{"op":"evict","handle":"v%d","location":"cuda:0"}`, i) &&
				emit(`{"op":"discard","handle":"v%d"}`, i)
		}
	case "rpe", "rpe1m":
		size := "64"
		if kind == "rpe1m" {
			size = `"1MiB"`
		}
		for i := 0; n > 0; i++ {
			_ = emit(`{"op":"register","handle":"v%d","bytes":%s,"source":"pageable-host"}`, i, size) &&
				emit(`{"op":"place","handle":"v%d","location":"cuda:0"}`, i) &&
				emit(`{"op":"evict","handle":"v%d","location":"cuda:0"}`, i)
		}
	case "protect":
		const values = 64
		for i := 0; i < values && n > 0; i++ {
			emit(`{"op":"register","handle":"v%d","bytes":64,"at":"cuda:0"}`, i)
		}
		for i := 0; n > 0; i++ {
			v := i % values
			_ = emit(`{"op":"acquire","handle":"v%d","location":"cuda:0","as":"l%d"}`, v, i) &&
				emit(`{"op":"release","lease":"l%d"}`, i) &&
				emit(`{"op":"hold","handle":"v%d","location":"cuda:0","as":"h%d"}`, v, i) &&
				emit(`{"op":"unhold","hold":"h%d"}`, i) &&
				emit(`{"op":"reserve","location":"cuda:0","bytes":"1KiB","name":"r%d"}`, i) &&
				emit(`{"op":"unreserve","name":"r%d"}`, i)
		}
	default:
		panic("unknown script kind " + kind)
	}
	return b.String()
}

// benchSizes are the script lengths BenchmarkReplay runs per kind: the
// 1 MiB script keeps every value's megabyte on pageable-host, so it stays
// short.
var benchSizes = map[string][]int{
	"register": {10_000, 100_000},
	"mixed":    {10_000, 100_000},
	"protect":  {10_000, 100_000},
	"rpe":      {10_000, 100_000},
	"rpe1m":    {3_000},
}

func BenchmarkReplay(b *testing.B) {
	for _, kind := range []string{"register", "mixed", "protect", "rpe", "rpe1m"} {
		for _, n := range benchSizes[kind] {
			script := benchScript(kind, n)
			b.Run(fmt.Sprintf("%s/%dk", kind, n/1000), func(b *testing.B) {
				b.SetBytes(int64(len(script)))
				var elapsed, cpu time.Duration
				for i := 0; i < b.N; i++ {
					start, cpu0 := time.Now(), processCPU()
					code := run(context.Background(), []string{"replay", "--json", "-"}, strings.NewReader(script), io.Discard, io.Discard)
					elapsed += time.Since(start)
					cpu += processCPU() - cpu0
					if code != 0 {
						b.Fatalf("exit status %d", code)
					}
				}
				b.ReportMetric(float64(n)*float64(b.N)/elapsed.Seconds(), "ops/s")
				// CPU time of the whole process per op (user and system,
				// every goroutine, the collector's included): steadier than
				// ops/s on shared, loaded cores.
				b.ReportMetric(float64(cpu.Microseconds())/float64(n*b.N), "cpu-µs/op")
			})
		}
	}
}

// TestBenchScripts keeps the benchmark's scripts honest: every op of a
// small one succeeds.
func TestBenchScripts(t *testing.T) {
	for _, kind := range []string{"register", "mixed", "protect", "rpe", "rpe1m"} {
		var out, errb strings.Builder
		code := run(context.Background(), []string{"replay", "--json", "-"}, strings.NewReader(benchScript(kind, 200)), &out, &errb)
		if code != 0 {
			t.Fatalf("%s: exit status %d: %s", kind, code, errb.String())
		}
		if n := strings.Count(out.String(), "\n"); n != 201 {
			t.Errorf("%s: %d results, want 201", kind, n)
		}
		if strings.Contains(out.String(), `"ok":false`) {
			t.Errorf("%s: an op failed:\n%s", kind, out.String())
		}
	}
}

// BenchmarkReplayBaseline runs the ops of the rpe scripts straight on a
// runtime (system.System on the soft backend, the loader the replay
// gives): no script, no results, no state version read per op. Its
// ops/s over BenchmarkReplay's is what the replay itself costs:
//
//	go test -run '^$' -bench 'BenchmarkReplay(Baseline)?/rpe' -benchtime 1x -count 5 ./cmd/demo/
func BenchmarkReplayBaseline(b *testing.B) {
	for _, c := range []struct {
		kind  string
		n     int
		bytes int64
	}{{"rpe", 10_000, 64}, {"rpe", 100_000, 64}, {"rpe1m", 3_000, 1 << 20}} {
		b.Run(fmt.Sprintf("%s/%dk", c.kind, c.n/1000), func(b *testing.B) {
			var elapsed, cpu time.Duration
			for i := 0; i < b.N; i++ {
				start, cpu0 := time.Now(), processCPU()
				baselineRPE(b, c.n, c.bytes)
				elapsed += time.Since(start)
				cpu += processCPU() - cpu0
			}
			b.ReportMetric(float64(c.n)*float64(b.N)/elapsed.Seconds(), "ops/s")
			b.ReportMetric(float64(cpu.Microseconds())/float64(c.n*b.N), "cpu-µs/op")
		})
	}
}

// baselineRPE starts a runtime, registers, places and evicts values of
// size bytes for n ops, and closes it.
func baselineRPE(b *testing.B, n int, bytes int64) {
	ctx := context.Background()
	locs := []system.LocationConfig{system.NoLimit("pageable-host"), system.NoLimit("cuda:0")}
	be, err := system.SoftBackend(locs, soft.Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	sys, err := system.Start(ctx, system.Options{Locations: locs, Backend: be})
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < n; i += 3 {
		name := "v" + strconv.Itoa(i/3)
		h, err := sys.Register(ctx, system.Value{Name: name, Bytes: bytes, Source: "pageable-host", Loader: replay.Loader(name)})
		if err == nil && i+1 < n {
			err = sys.Place(ctx, h, "cuda:0")
		}
		if err == nil && i+2 < n {
			err = sys.Evict(ctx, h, "cuda:0")
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	if err := sys.Close(ctx); err != nil {
		b.Fatal(err)
	}
}
