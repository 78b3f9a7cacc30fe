package offload

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"
)

// Row is one request of a trace: when it arrived, its context (prompt)
// tokens and the tokens it generated.
type Row struct {
	At           time.Time
	Context, Gen int64
}

// Bounds of a trace's input.
const (
	// maxTraceLine bounds one line of a trace; a row is about 40 bytes.
	maxTraceLine = 4 << 10
	// maxRowTokens bounds ContextTokens and GeneratedTokens of one row
	// (far above any model's context; it keeps every sum of a row and
	// its bytes in range).
	maxRowTokens = 1<<31 - 1
)

// ReadTrace reads a trace of the Azure LLM inference format: a
// header, then TIMESTAMP, ContextTokens, GeneratedTokens per line, comma
// separated (a field may be in double quotes; none holds a comma, a quote
// or a line break). limit > 0: the first limit rows. A line longer than
// maxTraceLine, a row of another shape, a bad timestamp, a token count
// that is not an integer 0 to maxRowTokens, or a timestamp that goes back
// in time is an error naming the line. Memory: one line at a time plus
// the rows kept (40 bytes each, and the slice's spare room).
func ReadTrace(r io.Reader, limit int) ([]Row, error) {
	br := bufio.NewReaderSize(r, maxTraceLine+2)
	var fields [3][]byte
	lineNo := 0
	// next returns the fields of the next line; ok false at the end.
	next := func() (ok bool, err error) {
		line, err := br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			return false, fmt.Errorf("line %d: longer than %d bytes: not a trace of TIMESTAMP,ContextTokens,GeneratedTokens", lineNo+1, maxTraceLine)
		}
		if err != nil && err != io.EOF {
			return false, err
		}
		if err == io.EOF && len(line) == 0 {
			return false, nil
		}
		lineNo++
		line = bytes.TrimSuffix(line, []byte("\n"))
		line = bytes.TrimSuffix(line, []byte("\r"))
		if lineNo == 1 {
			line = bytes.TrimPrefix(line, []byte("\xef\xbb\xbf"))
		}
		n := 0
		for rest := line; ; {
			f, tail, more := bytes.Cut(rest, []byte(","))
			if n < len(fields) {
				if len(f) >= 2 && f[0] == '"' && f[len(f)-1] == '"' {
					f = f[1 : len(f)-1]
				}
				fields[n] = f
			}
			n++
			if !more {
				break
			}
			rest = tail
		}
		if n != len(fields) {
			return false, fmt.Errorf("line %d: %d fields, want 3 (TIMESTAMP,ContextTokens,GeneratedTokens)", lineNo, n)
		}
		return true, nil
	}
	ok, err := next()
	if err != nil {
		return nil, fmt.Errorf("reading the header: %w", err)
	}
	if !ok {
		return nil, errors.New("reading the header: the trace is empty")
	}
	if string(fields[0]) != "TIMESTAMP" || string(fields[1]) != "ContextTokens" || string(fields[2]) != "GeneratedTokens" {
		return nil, fmt.Errorf("the header is %q, want TIMESTAMP,ContextTokens,GeneratedTokens", bytes.Join(fields[:], []byte(",")))
	}
	var rows []Row
	for limit <= 0 || len(rows) < limit {
		ok, err := next()
		if err != nil {
			return nil, err
		}
		if !ok {
			break
		}
		at, err := time.Parse("2006-01-02 15:04:05.9999999", string(fields[0]))
		if err != nil {
			return nil, fmt.Errorf("line %d: timestamp %q: want YYYY-MM-DD hh:mm:ss.fffffff", lineNo, fields[0])
		}
		c, err1 := strconv.ParseInt(string(fields[1]), 10, 64)
		g, err2 := strconv.ParseInt(string(fields[2]), 10, 64)
		if err1 != nil || err2 != nil || c < 0 || g < 0 || c > maxRowTokens || g > maxRowTokens {
			return nil, fmt.Errorf("line %d: token counts %q, %q must be integers 0 to %d", lineNo,
				fields[1], fields[2], int64(maxRowTokens))
		}
		if len(rows) > 0 && at.Before(rows[len(rows)-1].At) {
			return nil, fmt.Errorf("line %d: timestamps go back in time", lineNo)
		}
		rows = append(rows, Row{At: at, Context: c, Gen: g})
	}
	if len(rows) == 0 {
		return nil, errors.New("the trace has no requests")
	}
	return rows, nil
}
