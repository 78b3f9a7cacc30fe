package replay

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkParse reads every example script of cmd/demo/testdata (their
// JSON parsed and their ops checked, nothing run): the speed of reading a
// script, bytes per second of script text.
//
//	go test -run '^$' -bench BenchmarkParse -count 5 ./system/replay/
func BenchmarkParse(b *testing.B) {
	paths, err := filepath.Glob(filepath.Join("..", "..", "cmd", "demo", "testdata", "*.jsonl"))
	if err != nil || len(paths) == 0 {
		b.Fatalf("no scripts in testdata: %v", err)
	}
	var scripts [][]byte
	size := 0
	for _, p := range paths {
		s, err := os.ReadFile(p)
		if err != nil {
			b.Fatal(err)
		}
		scripts = append(scripts, s)
		size += len(s)
	}
	b.SetBytes(int64(size))
	b.ReportAllocs()
	for b.Loop() {
		for i, s := range scripts {
			if _, err := Parse(bytes.NewReader(s)); err != nil {
				b.Fatalf("%s: %v", paths[i], err)
			}
		}
	}
}
