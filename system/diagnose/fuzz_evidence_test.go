package diagnose

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzEvidence: DecodeEvidence reads replay output that a user saved or
// wrote by hand; whatever it holds, decoding, diagnosing and rendering it
// never panics. An input is at most fuzzInputLimit bytes (DecodeEvidence
// itself bounds one line at 256 MiB, and allocates in proportion to what
// it reads). Seeds: the replay output of the diagnose test script and the
// golden outputs of the replay CLI (cmd/demo/testdata/*.golden), whole and
// line by line, each with a line to diagnose of 0 (the first failure) or
// the line of one of its failures.
//
//	go test -run '^$' -fuzz '^FuzzEvidence$' -fuzztime 10m ./system/
func FuzzEvidence(f *testing.F) {
	seeds := []string{filepath.Join("testdata", "replay.out.jsonl")}
	goldens, _ := filepath.Glob(filepath.Join("..", "..", "cmd", "demo", "testdata", "*.golden"))
	seeds = append(seeds, goldens...)
	for _, path := range seeds {
		b, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		if len(b) <= fuzzInputLimit {
			f.Add(b, 0)
		}
		lines := bytes.Split(b, []byte("\n"))
		for i, l := range lines {
			if !bytes.Contains(l, []byte(`"ok":false`)) || len(l) > fuzzInputLimit {
				continue
			}
			// The failure with the next two lines (often a snapshot and
			// a trace), diagnosed by its line and as the first failure.
			end := min(len(lines), i+3)
			chunk := bytes.Join(lines[i:end], []byte("\n"))
			if len(chunk) <= fuzzInputLimit {
				f.Add(chunk, 0)
				f.Add(chunk, lineOf(l))
			}
		}
	}
	f.Add([]byte(`{"line":2,"op":"reserve","ok":false,"state_version":9223372036854775807,"error":{"type":"ResidencyBudgetError","message":"m","location":"cuda:0","budget_bytes":9223372036854775807,"used_bytes":9223372036854775807,"reserved_bytes":9223372036854775807,"requested_bytes":9223372036854775807}}`+"\n"+
		`{"line":3,"op":"snapshot","ok":true,"snapshot":{"state_version":1,"manager_id":"m","locations":[{"location":"cuda:0","budget_bytes":9223372036854775807,"used_bytes":9223372036854775807,"reserved_bytes":9223372036854775807,"peak_bytes":-9223372036854775808,"reservations":[]}],"values":[]}}`), 2)
	f.Fuzz(func(t *testing.T, data []byte, line int) {
		if len(data) > fuzzInputLimit {
			t.Skip()
		}
		ev, err := DecodeEvidence(bytes.NewReader(data), line)
		if err != nil {
			if strings.Contains(err.Error(), "Go struct") || strings.Contains(err.Error(), "Go value") {
				t.Fatalf("a Go type name in the message: %v", err)
			}
			if ev.Err == nil {
				return
			}
		}
		d := DiagnoseEvidence(ev)
		_ = d.String()
	})
}

// fuzzInputLimit bounds a fuzz input of FuzzEvidence.
const fuzzInputLimit = 1 << 20

// lineOf reads the "line" of a replay output line (0 when it has none).
func lineOf(b []byte) int {
	i := bytes.Index(b, []byte(`"line":`))
	if i < 0 {
		return 0
	}
	n := 0
	for _, c := range b[i+len(`"line":`):] {
		if c < '0' || c > '9' {
			break
		}
		n = n*10 + int(c-'0')
	}
	return n
}
