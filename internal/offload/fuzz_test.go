package offload

import (
	"bytes"
	"testing"
	"time"

	"github.com/residency-go/residency/internal/testsys"
)

// fuzzSlack is the allowance for allocations besides the input's (the
// fuzzing engine allocates a little on the side).
const fuzzSlack = 1 << 20

// FuzzOffloadTrace feeds arbitrary bytes to the trace reader of `demo offload` ([ReadTrace]).
// No input may panic. Bound: at most 16 bytes allocated per input byte
// plus 1 MiB (fuzzSlack): one line (≤ maxTraceLine) at a time, the rows
// kept. A trace accepted has at least one row, timestamps that never go
// back, token counts 0 to maxRowTokens, and as many rows as its
// non-header lines.
//
//	go test -run '^$' -fuzz '^FuzzOffloadTrace$' -fuzztime 30s ./internal/offload/
func FuzzOffloadTrace(f *testing.F) {
	head := "TIMESTAMP,ContextTokens,GeneratedTokens\n"
	for _, s := range []string{
		head + "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n",
		"\xef\xbb\xbf" + head + "2023-11-16 18:15:46.68,1,1\r\n",
		head + `"2023-11-16 18:15:46.68","1","1"`,
		head + "2023-11-16 18:15:46.68,1000000000,1\n",
		head + "2023-11-16 18:15:46.68,99999999999999999999,1\n",
		head + "2023-11-16 18:15:46.68,-1,1\n",
		head + "2023-11-16 18:15:46.68,1,1\n2023-11-16 18:15:45.0,1,1\n",
		head + "2023-11-16 18:15:46.68,1\n",
		head + "2023-11-16 18:15:46.68,1,1,1\n",
		head + "2023-13-45 25:61:61,1,1\n",
		"when,ctx,gen\n1,2,3\n",
		"",
		"\n\n\n",
		string(make([]byte, 5000)),
	} {
		f.Add([]byte(s), uint16(0))
	}
	f.Add([]byte(head+"2023-11-16 18:15:46.68,1,1\n2023-11-16 18:15:47.68,2,2\n2023-11-16 18:15:48.68,3,3\n"), uint16(2))
	f.Fuzz(func(t *testing.T, data []byte, limit uint16) {
		var rows []Row
		var err error
		n := testsys.Allocated(func() { rows, err = ReadTrace(bytes.NewReader(data), int(limit)) })
		if bound := uint64(16*len(data) + fuzzSlack); n > bound {
			t.Fatalf("%d input bytes allocated %d bytes, more than the bound %d", len(data), n, bound)
		}
		if err != nil {
			if rows != nil || err.Error() == "" {
				t.Fatalf("an error comes alone and says something: %v, %d rows", err, len(rows))
			}
			return
		}
		if len(rows) == 0 || limit > 0 && len(rows) > int(limit) {
			t.Fatalf("%d rows with limit %d", len(rows), limit)
		}
		if lines := bytes.Count(data, []byte("\n")) + 1; len(rows) > lines-1 {
			t.Fatalf("%d rows from %d lines", len(rows), lines)
		}
		var last time.Time
		for i, r := range rows {
			if r.Context < 0 || r.Gen < 0 || r.Context > maxRowTokens || r.Gen > maxRowTokens {
				t.Fatalf("row %d: token counts %d, %d out of range", i, r.Context, r.Gen)
			}
			if i > 0 && r.At.Before(last) {
				t.Fatalf("row %d goes back in time", i)
			}
			last = r.At
		}
	})
}
