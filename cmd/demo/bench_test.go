package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"
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
//     replay itself costs per op, the runtime's bookkeeping included).
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

func BenchmarkReplay(b *testing.B) {
	for _, kind := range []string{"register", "mixed", "protect"} {
		for _, n := range []int{10_000, 100_000} {
			script := benchScript(kind, n)
			b.Run(fmt.Sprintf("%s/%dk", kind, n/1000), func(b *testing.B) {
				b.SetBytes(int64(len(script)))
				var elapsed time.Duration
				for i := 0; i < b.N; i++ {
					start := time.Now()
					code := run(context.Background(), []string{"replay", "--json", "-"}, strings.NewReader(script), io.Discard, io.Discard)
					elapsed += time.Since(start)
					if code != 0 {
						b.Fatalf("exit status %d", code)
					}
				}
				b.ReportMetric(float64(n)*float64(b.N)/elapsed.Seconds(), "ops/s")
			})
		}
	}
}

// TestBenchScripts keeps the benchmark's scripts honest: every op of a
// small one succeeds.
func TestBenchScripts(t *testing.T) {
	for _, kind := range []string{"register", "mixed", "protect"} {
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
