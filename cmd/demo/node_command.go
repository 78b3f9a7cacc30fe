package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"github.com/residency-go/residency/internal/jsonline"
	"io"
	"math"
	"sort"
	"strings"
	"sync/atomic"

	"github.com/residency-go/residency/internal/nodeproc"
	"github.com/residency-go/residency/system"
)

// The command lines of `demo node` are read by the replay's JSON reader
// and typed field readers (internal/jsonline): one parser for both,
// so a node refuses what a replay script refuses — a duplicate key, an
// unknown or mistyped field, a line nested deeper than maxDepth — and
// names the field. A command line is at most maxCommandLine bytes.

// Bounds of one command.
const (
	// maxCommandLine bounds one command line. A command is a few hundred
	// bytes; a place with a thousand tiers still fits. Parsing a line
	// allocates at most about 256 bytes per byte of it (a long array of
	// numbers is the worst case), so at most 16 MiB for the longest.
	maxCommandLine = 64 << 10
	// maxCommandTimeoutMS bounds timeout_ms (one day).
	maxCommandTimeoutMS = 24 * 60 * 60 * 1000
	// maxUnbudgetedPattern bounds the bytes of a value registered at (or
	// loaded through) a location without a budget: the node makes them
	// in its own memory, and nothing else would bound them.
	maxUnbudgetedPattern = 1 << 30
	// maxCommandsInFlight bounds the commands a node runs at once; the
	// next line is read when one of them has replied.
	maxCommandsInFlight = 64
)

// nodeOpFields lists, per op, its required and optional fields (besides
// "id", "op" and "timeout_ms").
var nodeOpFields = map[string]struct{ required, optional []string }{
	"register":  {[]string{"name", "bytes"}, []string{"at", "source", "seed"}},
	"copy":      {[]string{"name", "bytes", "from", "at"}, []string{"remote", "source", "location"}},
	"read":      {[]string{"name", "at"}, nil},
	"discard":   {[]string{"name"}, nil},
	"whereis":   {[]string{"name"}, nil},
	"members":   {nil, nil},
	"summaries": {nil, nil},
	"refresh":   {nil, nil},
	"place":     {[]string{"name", "value", "tiers"}, []string{"hold", "max_attempts"}},
	"release":   {[]string{"name"}, nil},
	"inspect":   {[]string{"name"}, nil},
}

var nodeCommonKeys = []string{"id", "op", "timeout_ms"}

func nodeOpNames() string {
	names := make([]string, 0, len(nodeOpFields))
	for n := range nodeOpFields {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// nodeCommandError is a command line the node refuses without running
// it. id is the line's when it has one (else 0), so a driver waiting on
// that id gets its reply; op is the line's when it is a known op (else
// "?").
type nodeCommandError struct {
	id  int64
	op  string
	msg string
}

func (e *nodeCommandError) Error() string { return e.msg }

func (e *nodeCommandError) reply() nodeproc.Reply {
	return nodeproc.Reply{ID: e.id, Op: e.op, Error: e.msg, ErrorType: "InvalidInputError"}
}

// parseNodeCommand reads and checks one command line. Its memory is that
// of the replay's JSON reader: a small multiple of the line's length.
func parseNodeCommand(line []byte) (nodeproc.Command, error) {
	var cmd nodeproc.Command
	v, err := jsonline.Parse(line)
	if err != nil {
		e := &nodeCommandError{op: "?", msg: "malformed command: " + err.Error()}
		// The reply carries the line's id when a lenient reading finds
		// one (a duplicate key, say), so that its driver is answered.
		var loose struct {
			ID int64  `json:"id"`
			Op string `json:"op"`
		}
		if json.Unmarshal(line, &loose) == nil {
			e.id = loose.ID
			if _, known := nodeOpFields[loose.Op]; known {
				e.op = loose.Op
			}
		}
		return cmd, e
	}
	if v.Kind != jsonline.Object {
		return cmd, &nodeCommandError{op: "?", msg: fmt.Sprintf(`malformed command: not a JSON object: the line holds %s; each line is one command, an object like {"id":1,"op":"members"}`, v.KindName())}
	}
	f := &jsonline.Fields{Obj: &v}
	if id := f.OptInt("id"); id != nil {
		cmd.ID = *id
	}
	if f.Err != nil {
		return nodeproc.Command{}, &nodeCommandError{op: "?", msg: "malformed command: " + f.Err.Error()}
	}
	fail := func(err error) (nodeproc.Command, error) {
		op := cmd.Op
		if op == "" {
			op = "?"
		}
		return nodeproc.Command{}, &nodeCommandError{id: cmd.ID, op: op, msg: fmt.Sprintf("malformed command: op %q: %v", cmd.Op, err)}
	}
	cmd.Op = f.Str("op")
	if f.Err != nil {
		return nodeproc.Command{}, &nodeCommandError{id: cmd.ID, op: "?", msg: "malformed command: " + f.Err.Error()}
	}
	spec, ok := nodeOpFields[cmd.Op]
	if !ok {
		return nodeproc.Command{}, &nodeCommandError{id: cmd.ID, op: "?", msg: fmt.Sprintf("malformed command: unknown op %q (known: %s)", cmd.Op, nodeOpNames())}
	}
	for _, k := range spec.required {
		if !v.Has(k) {
			f.Fail(fmt.Errorf("needs field %q", k))
		}
	}
	if f.Err == nil {
		f.RejectUnknown(nodeCommonKeys, spec.required, spec.optional)
	}
	if f.Err != nil {
		return fail(f.Err)
	}
	if t := f.OptInt("timeout_ms"); t != nil {
		if *t < 0 || *t > maxCommandTimeoutMS {
			f.Fail(fmt.Errorf("field \"timeout_ms\": %d is outside 0 (the default, 30 s) to %d (one day)", *t, maxCommandTimeoutMS))
		}
		cmd.TimeoutMS = *t
	}
	str := func(key string) string {
		s, _ := f.OptStr(key)
		return s
	}
	cmd.Name = str("name")
	cmd.At, cmd.Source = str("at"), str("source")
	cmd.From, cmd.Remote, cmd.Location = str("from"), str("remote"), str("location")
	cmd.Value = str("value")
	if v.Has("bytes") {
		cmd.Bytes = f.Bytes("bytes")
		if f.Err == nil && cmd.Bytes <= 0 {
			f.Fail(fmt.Errorf("field \"bytes\": must be > 0, got %d", cmd.Bytes))
		}
	}
	if s := f.OptInt("seed"); s != nil {
		cmd.Seed = *s
	}
	if v.Has("tiers") {
		cmd.Tiers = f.Tiers("tiers")
	}
	if b, ok := f.Obj.Get("hold"); ok {
		if b.Kind != jsonline.Bool {
			f.Mistyped("hold", "true or false", b)
		}
		cmd.Hold = b.Bool
	}
	if n := f.OptInt("max_attempts"); n != nil {
		if *n < 0 || *n > math.MaxInt32 {
			f.Fail(fmt.Errorf("field \"max_attempts\": %d is outside 0 (the default) to %d", *n, math.MaxInt32))
		}
		cmd.MaxAttempts = int(*n)
	}
	if f.Err == nil && cmd.Op == "register" && (cmd.At == "") == (cmd.Source == "") {
		f.Fail(fmt.Errorf(`needs exactly one of "at" (resident there) and "source" (loaded through it when placed)`))
	}
	if f.Err != nil {
		return fail(f.Err)
	}
	return cmd, nil
}

// commandOfLine is what the node does with one line of its standard input
// (the line without its ending; tooLong: it was longer than
// maxCommandLine and dropped): ok with the command to run, or not ok with
// the error reply to send; a blank line is neither (skip).
func commandOfLine(line []byte, tooLong bool) (cmd nodeproc.Command, reply *nodeproc.Reply, ok bool) {
	if tooLong {
		return cmd, &nodeproc.Reply{Op: "?", Error: fmt.Sprintf("malformed command: the line is longer than %s, the most one command may hold", formatBytes(maxCommandLine)), ErrorType: "InvalidInputError"}, false
	}
	if len(bytes.TrimSpace(line)) == 0 {
		return cmd, nil, false
	}
	cmd, err := parseNodeCommand(line)
	if err != nil {
		r := err.(*nodeCommandError).reply()
		return cmd, &r, false
	}
	return cmd, nil, true
}

// readCommandLine returns the next line of br without its line ending. A
// line longer than max is read to its end and dropped: tooLong is true and
// the line nil. err is io.EOF after the last line.
func readCommandLine(br *bufio.Reader, buf []byte, max int) (line []byte, tooLong bool, err error) {
	buf = buf[:0]
	for {
		chunk, err := br.ReadSlice('\n')
		if !tooLong {
			if len(buf)+len(chunk) > max+2 { // +2: the line ending
				tooLong, buf = true, buf[:0]
			} else {
				buf = append(buf, chunk...)
			}
		}
		switch {
		case err == bufio.ErrBufferFull:
			continue
		case err == io.EOF && len(buf) == 0 && !tooLong:
			return nil, false, io.EOF
		case err != nil && err != io.EOF:
			return nil, false, err
		}
		if tooLong {
			return nil, true, nil
		}
		return bytes.TrimRight(buf, "\r\n"), false, nil
	}
}

var registerSeq atomic.Uint64

// register runs a register command. Nothing is made before the runtime
// admitted it: with At, the bytes are reserved at At first (a refusal is
// the runtime's *BudgetError, and nothing was allocated), then the
// pattern is made, the reservation dropped and the value registered in
// its place; with Source, the loader makes the pattern into the runtime's
// own buffer when the value is placed, and the digest is computed piece
// by piece. A location without a budget takes at most
// maxUnbudgetedPattern bytes. It returns the pattern's SHA-256.
func registerPattern(ctx context.Context, sys *system.System, cmd nodeproc.Command) (string, error) {
	if cmd.Bytes <= 0 {
		return "", &system.InvalidInputError{Message: fmt.Sprintf("register %q: bytes must be > 0, got %d", cmd.Name, cmd.Bytes)}
	}
	if cmd.At != "" {
		res := fmt.Sprintf("demo-node register #%d", registerSeq.Add(1))
		if err := sys.Reserve(ctx, cmd.At, res, cmd.Bytes); err != nil {
			return "", err
		}
		reserved := true
		defer func() {
			if reserved {
				_ = sys.Unreserve(context.WithoutCancel(ctx), res)
			}
		}()
		if err := patternBound(ctx, sys, cmd.Name, cmd.At, cmd.Bytes); err != nil {
			return "", err
		}
		data := nodeproc.Pattern(cmd.Seed, cmd.Bytes)
		if err := sys.Unreserve(context.WithoutCancel(ctx), res); err != nil {
			return "", err
		}
		reserved = false
		if _, err := sys.Register(ctx, system.Value{Name: cmd.Name, Bytes: cmd.Bytes, At: cmd.At, Data: data}); err != nil {
			return "", err
		}
		return digestOf(data), nil
	}
	if err := patternBound(ctx, sys, cmd.Name, cmd.Source, cmd.Bytes); err != nil {
		return "", err
	}
	seed := cmd.Seed
	// Resident nowhere: the loader makes the same bytes when the value is
	// placed.
	if _, err := sys.Register(ctx, system.Value{Name: cmd.Name, Bytes: cmd.Bytes, Source: cmd.Source, Loader: func(_ context.Context, dst []byte) error {
		nodeproc.NewPatternStream(seed).Fill(dst)
		return nil
	}}); err != nil {
		return "", err
	}
	return patternDigest(ctx, seed, cmd.Bytes)
}

// patternBound refuses bytes that loc's budget could never hold, or, at a
// location without a budget, more than maxUnbudgetedPattern. A location
// the snapshot does not list is left to the runtime to refuse.
func patternBound(ctx context.Context, sys *system.System, name, loc string, n int64) error {
	snap, err := sys.Snapshot(ctx)
	if err != nil {
		return err
	}
	l, ok := snap.Location(loc)
	if !ok {
		if base, _, cut := strings.Cut(loc, "@"); cut {
			l, ok = snap.Location(base)
		}
	}
	switch {
	case !ok:
		return nil
	case l.HasBudget && n > l.BudgetBytes:
		return &system.InvalidInputError{Message: fmt.Sprintf("register %q: %d bytes can never fit %s (budget %d bytes)", name, n, loc, l.BudgetBytes)}
	case !l.HasBudget && n > maxUnbudgetedPattern:
		return &system.InvalidInputError{Message: fmt.Sprintf("register %q: %d bytes at %s, which has no budget: a node makes at most %d bytes for one value there (give the location a budget)", name, n, loc, int64(maxUnbudgetedPattern))}
	}
	return nil
}

// patternDigest is the SHA-256 of Pattern(seed, n), computed in 1 MiB
// pieces; it stops when ctx ends.
func patternDigest(ctx context.Context, seed, n int64) (string, error) {
	h := sha256.New()
	ps := nodeproc.NewPatternStream(seed)
	buf := make([]byte, min(n, 1<<20))
	for left := n; left > 0; {
		if err := ctx.Err(); err != nil {
			return "", err
		}
		b := buf[:min(left, int64(len(buf)))]
		ps.Fill(b)
		h.Write(b)
		left -= int64(len(b))
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func digestOf(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
