package nodeproc

import (
	"bufio"
	"bytes"
	"io"
	"math"
	"testing"

	"github.com/residency-go/residency/internal/testsys"
)

// fuzzSlack is the allowance for allocations besides the input's (the
// fuzzing engine allocates a little on the side).
const fuzzSlack = 1 << 20

// FuzzNodeCommand feeds arbitrary bytes to a node's command reader, as
// a node reads its standard input ([Server.Serve]): line by line (a line longer than
// maxCommandLine is dropped), each line parsed into a command or an error
// reply. No input may panic. Bound: reading and parsing allocate at most
// 256 bytes per input byte plus 1 MiB (fuzzSlack), whatever the input.
// Every command accepted is one the node can run as given: a known op,
// bytes > 0 where it has bytes, exactly one of at and source for
// register, timeout_ms and max_attempts in range; every refusal is an
// InvalidInputError reply for a known op or "?".
//
//	go test -run '^$' -fuzz '^FuzzNodeCommand$' -fuzztime 30s ./internal/nodeproc/
func FuzzNodeCommand(f *testing.F) {
	for _, s := range []string{
		`{"id":1,"op":"register","name":"w","bytes":16,"at":"cuda:0","seed":7}`,
		`{"id":2,"op":"register","name":"w","bytes":"16MiB","source":"pageable-host"}`,
		`{"id":3,"op":"copy","name":"w","bytes":4,"from":"a","at":"cuda:0","remote":"v","source":"pinned-host","location":"cuda:1","timeout_ms":5000}`,
		`{"id":4,"op":"place","name":"r","value":"w","tiers":[["cuda:0@*"],"pinned-host"],"hold":true,"max_attempts":2}`,
		`{"id":5,"op":"read","name":"w","at":"cuda:0"}` + "\n" + `{"op":"members"}` + "\r\n\n" + `{"op":"release","name":"r"}`,
		`{"id":6,"op":"register","name":"a","name":"b","bytes":5,"at":"cuda:0"}`,
		`{"id":7,"op":"register","name":"a","bytes":-5,"at":"cuda:0","color":1}`,
		`{"id":8,"op":"register","name":"a","bytes":9223372036854775807,"at":"cuda:0"}`,
		`{"id":9,"op":"members","timeout_ms":1e300}`,
		`{"id":1.5,"op":"inspect","name":"\u00e9\ud800"}`,
		`[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[`,
		"\xef\xbb\xbf{\"op\":\"summaries\"}",
		`not json`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var lines int
		n := testsys.Allocated(func() {
			br := bufio.NewReaderSize(bytes.NewReader(data), 64<<10)
			var buf []byte
			for {
				line, tooLong, err := readCommandLine(br, buf, maxCommandLine)
				if err == io.EOF {
					return
				}
				if err != nil {
					t.Fatalf("reading from memory: %v", err)
				}
				lines++
				buf = line[:0:cap(line)]
				cmd, reply, ok := commandOfLine(line, tooLong)
				if !ok {
					if reply != nil {
						checkRefusal(t, *reply)
					}
					continue
				}
				checkCommand(t, cmd)
			}
		})
		if bound := uint64(256*len(data) + fuzzSlack); n > bound {
			t.Fatalf("%d input bytes (%d lines) allocated %d bytes, more than the bound %d", len(data), lines, n, bound)
		}
	})
}

func checkRefusal(t *testing.T, r Reply) {
	t.Helper()
	if r.OK || r.Error == "" || r.ErrorType != "InvalidInputError" {
		t.Fatalf("a refusal must be an InvalidInputError reply with a message: %+v", r)
	}
	if _, known := opFields[r.Op]; !known && r.Op != "?" {
		t.Fatalf("a refusal's op is a known op or \"?\": %+v", r)
	}
}

func checkCommand(t *testing.T, c Command) {
	t.Helper()
	spec, known := opFields[c.Op]
	if !known {
		t.Fatalf("unknown op accepted: %+v", c)
	}
	for _, k := range spec.required {
		if k == "bytes" && c.Bytes <= 0 {
			t.Fatalf("bytes ≤ 0 accepted: %+v", c)
		}
	}
	if c.Op == "register" && (c.At == "") == (c.Source == "") {
		t.Fatalf("register without exactly one of at and source: %+v", c)
	}
	if c.TimeoutMS < 0 || c.TimeoutMS > maxCommandTimeoutMS {
		t.Fatalf("timeout_ms out of range accepted: %+v", c)
	}
	if c.MaxAttempts < 0 || c.MaxAttempts > math.MaxInt32 {
		t.Fatalf("max_attempts out of range accepted: %+v", c)
	}
}
