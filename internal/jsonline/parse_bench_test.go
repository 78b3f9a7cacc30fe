package jsonline

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkParseLines parses every line of the example scripts of
// cmd/demo/testdata: the JSON reader alone, bytes per second of script
// text.
//
//	go test -run '^$' -bench BenchmarkParseLines -count 5 ./internal/jsonline/
func BenchmarkParseLines(b *testing.B) {
	paths, err := filepath.Glob(filepath.Join("..", "..", "cmd", "demo", "testdata", "*.jsonl"))
	if err != nil || len(paths) == 0 {
		b.Fatalf("no scripts in testdata: %v", err)
	}
	var lines [][]byte
	size := 0
	for _, p := range paths {
		s, err := os.ReadFile(p)
		if err != nil {
			b.Fatal(err)
		}
		for _, l := range bytes.Split(s, []byte("\n")) {
			if len(bytes.TrimSpace(l)) > 0 && l[0] == '{' {
				lines = append(lines, l)
				size += len(l)
			}
		}
	}
	b.SetBytes(int64(size))
	b.ReportAllocs()
	for b.Loop() {
		for _, l := range lines {
			if _, err := Parse(l); err != nil {
				b.Fatalf("%s: %v", l, err)
			}
		}
	}
}
