// Package kvtrace reads KV-cache traces of LLM serving in the Mooncake
// JSON-lines format and plays them against cache policies: a prefix
// cache of fixed-size KV blocks where a request needs all of its blocks
// resident at once.
//
// A trace line is one request:
//
//	{"timestamp": 27482, "input_length": 6955, "output_length": 52,
//	 "hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59]}
//
// Each hash id names one KV block (512 tokens in Mooncake's traces); two
// requests that list the same id share that block, so a block still
// resident when a later request lists it again is a prefix-cache hit.
//
// Reading is pure (no I/O besides the reader given), and so are the
// reference policies of policies.go (LRU, an exclusive two-tier LRU and
// Belady's optimum). Run (runtime.go) plays a trace through the residency
// runtime itself, on the soft backend (a simulation in Go memory).
package kvtrace

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
)

// Request is one trace line: its arrival (milliseconds), its prompt and
// output lengths in tokens, and its KV blocks as dense block numbers
// (0, 1, … in order of first appearance in the trace; Trace.IDs maps
// them back to the trace's hash ids). A hash id listed twice in one
// request counts once.
type Request struct {
	Timestamp    int64
	InputLength  int64
	OutputLength int64
	Blocks       []int32
}

// Trace is a read trace.
type Trace struct {
	Requests []Request
	// IDs[b] is the hash id of block b.
	IDs []int64
	// Uses is the number of block uses: the blocks of every request.
	Uses int64
	// Repeats counts hash ids listed again within the same request
	// (counted once there, not in Uses).
	Repeats int64
}

// Blocks is the number of distinct blocks.
func (t *Trace) Blocks() int { return len(t.IDs) }

// Limits bound what Read accepts; a zero field takes its default.
type Limits struct {
	// MaxRequests stops reading after this many requests (default: no
	// limit but MaxBlocks).
	MaxRequests int
	// MaxLineBytes is the longest line accepted (default 4 MiB).
	MaxLineBytes int
	// MaxRequestBlocks is the most blocks one request may list (default
	// 1,000,000).
	MaxRequestBlocks int
	// MaxUses is the most block uses in the whole trace (default
	// 100,000,000).
	MaxUses int64
}

// Defaults of [Limits].
const (
	DefaultMaxLineBytes     = 4 << 20
	DefaultMaxRequestBlocks = 1_000_000
	DefaultMaxUses          = 100_000_000
)

func (l Limits) withDefaults() Limits {
	if l.MaxLineBytes <= 0 {
		l.MaxLineBytes = DefaultMaxLineBytes
	}
	if l.MaxRequestBlocks <= 0 {
		l.MaxRequestBlocks = DefaultMaxRequestBlocks
	}
	if l.MaxUses <= 0 {
		l.MaxUses = DefaultMaxUses
	}
	return l
}

// LineError is a problem with one line of a trace.
type LineError struct {
	Line int // 1-based
	Err  error
}

func (e *LineError) Error() string { return fmt.Sprintf("line %d: %v", e.Line, e.Err) }

func (e *LineError) Unwrap() error { return e.Err }

// ErrTooLong: a line, a request or the whole trace exceeds its limit.
var ErrTooLong = errors.New("over the limit")

// line is a trace line as JSON; unknown fields are ignored.
type line struct {
	Timestamp    *json.Number   `json:"timestamp"`
	InputLength  *json.Number   `json:"input_length"`
	OutputLength *json.Number   `json:"output_length"`
	HashIDs      *[]json.Number `json:"hash_ids"`
}

// Read reads a trace in the Mooncake JSON-lines format: one JSON object a
// line with hash_ids (a non-empty list of integers in [0, 2^63)), and
// timestamp, input_length and output_length (integers ≥ 0; each may be
// absent, then 0). Blank lines are skipped; other fields are ignored.
// Errors name the line: a line that is not a JSON object, a field of the
// wrong type or range, a missing or empty hash_ids, or a limit exceeded
// ([ErrTooLong]). A trace with no request is an error too.
func Read(r io.Reader, lim Limits) (*Trace, error) {
	lim = lim.withDefaults()
	t := &Trace{}
	index := map[int64]int32{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, min(64<<10, lim.MaxLineBytes)), lim.MaxLineBytes)
	n := 0
	for sc.Scan() {
		n++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		if lim.MaxRequests > 0 && len(t.Requests) == lim.MaxRequests {
			break
		}
		req, err := t.parse(b, index, lim)
		if err != nil {
			return nil, &LineError{Line: n, Err: err}
		}
		t.Requests = append(t.Requests, req)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, &LineError{Line: n + 1, Err: fmt.Errorf("%w: a line longer than %d bytes", ErrTooLong, lim.MaxLineBytes)}
		}
		return nil, err
	}
	if len(t.Requests) == 0 {
		return nil, errors.New("the trace has no request")
	}
	return t, nil
}

// parse decodes one line into a request, numbering new blocks.
func (t *Trace) parse(b []byte, index map[int64]int32, lim Limits) (Request, error) {
	var ln line
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&ln); err != nil {
		return Request{}, fmt.Errorf("not a JSON object of a request: %v", err)
	}
	if dec.More() {
		return Request{}, errors.New("more than one JSON value on the line")
	}
	var req Request
	var err error
	for _, f := range []struct {
		name string
		n    *json.Number
		dst  *int64
	}{{"timestamp", ln.Timestamp, &req.Timestamp}, {"input_length", ln.InputLength, &req.InputLength}, {"output_length", ln.OutputLength, &req.OutputLength}} {
		if *f.dst, err = integer(f.name, f.n); err != nil {
			return Request{}, err
		}
	}
	if ln.HashIDs == nil || len(*ln.HashIDs) == 0 {
		return Request{}, errors.New("hash_ids is missing or empty (want the request's KV block ids)")
	}
	ids := *ln.HashIDs
	if len(ids) > lim.MaxRequestBlocks {
		return Request{}, fmt.Errorf("%w: %d hash ids in one request (at most %d)", ErrTooLong, len(ids), lim.MaxRequestBlocks)
	}
	if t.Uses+int64(len(ids)) > lim.MaxUses {
		return Request{}, fmt.Errorf("%w: more than %d block uses in the trace", ErrTooLong, lim.MaxUses)
	}
	req.Blocks = make([]int32, 0, len(ids))
	seen := make(map[int32]bool, len(ids))
	for i := range ids {
		id, err := integer(fmt.Sprintf("hash_ids[%d]", i), &ids[i])
		if err != nil {
			return Request{}, err
		}
		blk, ok := index[id]
		if !ok {
			if len(t.IDs) == math.MaxInt32 {
				return Request{}, fmt.Errorf("%w: more than %d distinct blocks", ErrTooLong, math.MaxInt32)
			}
			blk = int32(len(t.IDs))
			index[id] = blk
			t.IDs = append(t.IDs, id)
		}
		if seen[blk] {
			t.Repeats++
			continue
		}
		seen[blk] = true
		req.Blocks = append(req.Blocks, blk)
	}
	t.Uses += int64(len(req.Blocks))
	return req, nil
}

// integer reads a JSON number that must be an integer in [0, 2^63); a
// nil number (the field absent) is 0.
func integer(name string, n *json.Number) (int64, error) {
	if n == nil {
		return 0, nil
	}
	v, err := n.Int64()
	if err != nil || v < 0 {
		return 0, fmt.Errorf("%s is %s: want an integer from 0 to %d", name, n.String(), int64(math.MaxInt64))
	}
	return v, nil
}
