package nodeproc

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"

	"github.com/residency-go/residency/internal/jsonline"
)

// The command lines of a node are read by the replay's JSON reader and
// typed field readers (internal/jsonline): one parser for both, so a node
// refuses what a replay script refuses — a duplicate key, an unknown or
// mistyped field, a line nested deeper than the reader's bound — and
// names the field. A command line is at most maxCommandLine bytes.

// Bounds of one command.
const (
	// maxCommandLine bounds one command line. A command is a few hundred
	// bytes; a place with a thousand tiers still fits. Parsing a line
	// allocates at most about 256 bytes per byte of it (a long array of
	// numbers is the worst case), so at most 16 MiB for the longest.
	maxCommandLine = 64 << 10
	// maxCommandTimeoutMS bounds timeout_ms (one day, as every
	// millisecond field).
	maxCommandTimeoutMS = jsonline.MaxMillis
	// maxUnbudgetedPattern bounds the bytes of a value registered at (or
	// loaded through) a location without a budget: the node makes them
	// in its own memory, and nothing else would bound them.
	maxUnbudgetedPattern = 1 << 30
	// maxCommandsInFlight bounds the commands a node runs at once; the
	// next line is read when one of them has replied.
	maxCommandsInFlight = 64
)

// opFields lists, per op, its required and optional fields (besides
// "id", "op" and "timeout_ms").
var opFields = map[string]struct{ required, optional []string }{
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

var commonKeys = []string{"id", "op", "timeout_ms"}

func opNames() string {
	names := make([]string, 0, len(opFields))
	for n := range opFields {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// commandError is a command line the node refuses without running it. id
// is the line's when it has one (else 0), so a driver waiting on that id
// gets its reply; op is the line's when it is a known op (else "?").
type commandError struct {
	id  int64
	op  string
	msg string
}

func (e *commandError) Error() string { return e.msg }

func (e *commandError) reply() Reply {
	return Reply{ID: e.id, Op: e.op, Error: e.msg, ErrorType: "InvalidInputError"}
}

// parseCommand reads and checks one command line. Its memory is that of
// the replay's JSON reader: a small multiple of the line's length.
func parseCommand(line []byte) (Command, error) {
	v, err := jsonline.Parse(line)
	if err != nil {
		return Command{}, malformedLine(line, err)
	}
	if v.Kind != jsonline.Object {
		return Command{}, &commandError{op: "?", msg: fmt.Sprintf(`malformed command: not a JSON object: the line holds %s; each line is one command, an object like {"id":1,"op":"members"}`, v.KindName())}
	}
	f := &jsonline.Fields{Obj: &v}
	cmd, err := commandHead(f)
	if err != nil {
		return Command{}, err
	}
	spec := opFields[cmd.Op]
	for _, k := range spec.required {
		if !v.Has(k) {
			f.Fail(fmt.Errorf("needs field %q", k))
		}
	}
	if f.Err == nil {
		f.RejectUnknown(commonKeys, spec.required, spec.optional)
	}
	if f.Err == nil {
		commandFields(f, &cmd)
	}
	if f.Err == nil && cmd.Op == "register" && (cmd.At == "") == (cmd.Source == "") {
		f.Fail(fmt.Errorf(`needs exactly one of "at" (resident there) and "source" (loaded through it when placed)`))
	}
	if f.Err != nil {
		return Command{}, &commandError{id: cmd.ID, op: cmd.Op, msg: fmt.Sprintf("malformed command: op %q: %v", cmd.Op, f.Err)}
	}
	return cmd, nil
}

// malformedLine is the refusal of a line that is no JSON value. It
// carries the line's id when a lenient reading finds one (a duplicate
// key, say), so that its driver is answered.
func malformedLine(line []byte, err error) *commandError {
	e := &commandError{op: "?", msg: "malformed command: " + err.Error()}
	var loose struct {
		ID int64  `json:"id"`
		Op string `json:"op"`
	}
	if json.Unmarshal(line, &loose) == nil {
		e.id = loose.ID
		if _, known := opFields[loose.Op]; known {
			e.op = loose.Op
		}
	}
	return e
}

// commandHead reads a command's id and op, and refuses an op it does not
// know.
func commandHead(f *jsonline.Fields) (Command, error) {
	var cmd Command
	if id := f.OptInt("id"); id != nil {
		cmd.ID = *id
	}
	if f.Err != nil {
		return Command{}, &commandError{op: "?", msg: "malformed command: " + f.Err.Error()}
	}
	cmd.Op = f.Str("op")
	if f.Err != nil {
		return Command{}, &commandError{id: cmd.ID, op: "?", msg: "malformed command: " + f.Err.Error()}
	}
	if _, ok := opFields[cmd.Op]; !ok {
		return Command{}, &commandError{id: cmd.ID, op: "?", msg: fmt.Sprintf("malformed command: unknown op %q (known: %s)", cmd.Op, opNames())}
	}
	return cmd, nil
}

// commandFields reads the fields of cmd's op (their presence checked
// already) into cmd; a bad one is left in f.Err.
func commandFields(f *jsonline.Fields, cmd *Command) {
	if t := f.OptMillis("timeout_ms", "the default, 30 s"); t != nil {
		cmd.TimeoutMS = t.Milliseconds()
	}
	str := func(key string) string {
		s, _ := f.OptStr(key)
		return s
	}
	cmd.Name = str("name")
	cmd.At, cmd.Source = str("at"), str("source")
	cmd.From, cmd.Remote, cmd.Location = str("from"), str("remote"), str("location")
	cmd.Value = str("value")
	if f.Obj.Has("bytes") {
		cmd.Bytes = f.Bytes("bytes")
		if f.Err == nil && cmd.Bytes <= 0 {
			f.Fail(fmt.Errorf("field \"bytes\": must be > 0, got %d", cmd.Bytes))
		}
	}
	if s := f.OptInt("seed"); s != nil {
		cmd.Seed = *s
	}
	if f.Obj.Has("tiers") {
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
}

// commandOfLine is what the node does with one line of its standard input
// (the line without its ending; tooLong: it was longer than
// maxCommandLine and dropped): ok with the command to run, or not ok with
// the error reply to send; a blank line is neither (skip).
func commandOfLine(line []byte, tooLong bool) (cmd Command, reply *Reply, ok bool) {
	if tooLong {
		return cmd, &Reply{Op: "?", Error: fmt.Sprintf("malformed command: the line is longer than %s, the most one command may hold", jsonline.FormatBytes(maxCommandLine)), ErrorType: "InvalidInputError"}, false
	}
	if len(bytes.TrimSpace(line)) == 0 {
		return cmd, nil, false
	}
	cmd, err := parseCommand(line)
	if err != nil {
		r := err.(*commandError).reply()
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
