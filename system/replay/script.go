package replay

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/residency-go/residency/internal/jsonline"
	"github.com/residency-go/residency/system/wire"
	"io"
	"slices"
	"sort"
	"strings"

	"github.com/residency-go/residency/cuda"
)

// A replay script is parsed and validated completely before anything runs.
// Validation catches what makes a line meaningless: bad JSON, an unknown
// op, a missing, unknown or mistyped field, register with both or neither
// of at/source, a first op that is not start, a bad start. Values that are
// well typed but wrong (bytes ≤ 0, a malformed location inside an op, an
// unknown replica mode) are left for the op, which reports them in field
// order as InvalidInput results.

// ScriptError is a malformed script: a line that is not an op (bad
// JSON, an unknown op or field, a missing or mistyped field, a bad start),
// or a script with no ops. Nothing of such a script runs.
type ScriptError struct {
	Line int    // the physical line (1-based); 0 for the script as a whole
	Msg  string // what is wrong, in the script's terms
}

func (e *ScriptError) Error() string {
	if e.Line <= 0 {
		return e.Msg // about the script as a whole
	}
	return fmt.Sprintf("line %d: %s", e.Line, e.Msg)
}

// Op is one checked operation of a script. Its fields beyond Line, Name
// and Expect are the op's own (docs/replay.md lists them per op); they are
// read by the op's handler.
type Op struct {
	Line   int    // the physical line of the script (1-based)
	Name   string // the op, e.g. "place"
	Expect string // the line's expectation: "ok", an error type, or "" for none

	handle, location, from, to string
	as, lease, event, hold     string
	resName, decision, scope   string
	replica, at, source, kind  string
	bytes                      int64
	index                      int64 // release_scope_lease: the enter action whose lease it releases

	plan            *planSpec
	request         *requestSpec
	cache           *cacheSpec   // the cache ops (cache_ops.go)
	staging         *stagingSpec // the write pipeline ops (staging_ops.go)
	expectedVersion *uint64

	// start
	locations  []locationSpec
	spill      map[string]string // location → spill target; nil for none
	trace      *int64
	stateLimit *int64
}

type locationSpec struct {
	name      string
	hasBudget bool
	budget    int64
}

// planSpec is a plan as written in a script: handles by name.
type planSpec struct {
	reclaim      []actionSpec
	reservations []reservationSpec
	enter        []actionSpec
}

// actionSpec is a plan's action: from only on enter actions, to (a
// demotion) only on reclaim actions.
type actionSpec struct{ handle, location, from, to string }

type reservationSpec struct {
	name, location string
	bytes          int64
}

type requestSpec struct {
	name         string
	requirements []requirementSpec
	reservations []reservationSpec
	mostFree     bool // "tie_break":"most_free"
}

type requirementSpec struct {
	handle string
	tiers  [][]string
}

// Info is what checking a whole script learns.
type Info struct {
	Ops      int // the number of ops, start included
	LastLine int // the line of the last op
	OpWidth  int // the length of the longest op name used
}

// Check reads a whole script and checks every op, running nothing (the
// first pass of a replay: a script malformed anywhere runs nothing). tee
// is as for NewReader.
func Check(ctx context.Context, r io.Reader, tee io.Writer) (Info, error) {
	sr := NewReader(ctx, r, tee)
	var info Info
	for {
		o, ok, err := sr.Next()
		if err != nil {
			return info, err
		}
		if !ok {
			return info, nil
		}
		info.Ops++
		info.LastLine = o.Line
		info.OpWidth = max(info.OpWidth, len(o.Name))
	}
}

// As is the name the op binds (acquire, hold, decide, enter, load,
// cache_pin), "" for other ops.
func (o Op) As() string {
	if o.cache != nil && o.cache.as != "" {
		return o.cache.as
	}
	return o.as
}

// RequestName is the name of a decide op's request ("" for other ops).
func (o Op) RequestName() string {
	if o.request == nil {
		return ""
	}
	return o.request.name
}

// MaxLineBytes bounds one line of a script (1 MiB). An op is a few hundred bytes;
// a plan or request with thousands of entries still fits.
const MaxLineBytes = 1 << 20

// utf8BOM is the byte order mark some editors put at the start of a file.
const utf8BOM = "\xef\xbb\xbf"

// Reader reads a script one op at a time, each op checked. Memory is bounded by the
// longest line (MaxLineBytes), whatever the number of lines.
type Reader struct {
	ctx  context.Context
	br   *bufio.Reader
	tee  io.Writer // when set, every byte read is copied here (spooling stdin)
	buf  []byte
	line int // physical line number of the last line read
	ops  int // ops read so far
}

// NewReader returns a reader of the script r. Its reads stop with ctx's
// error once ctx ends. When tee is not nil, every byte read is copied to
// it (to keep a copy of a script that cannot be read twice); a
// *ScriptError from tee stops the reading with that error.
func NewReader(ctx context.Context, r io.Reader, tee io.Writer) *Reader {
	return &Reader{ctx: ctx, br: bufio.NewReaderSize(r, 64<<10), tee: tee}
}

// readLine returns the next physical line without its line ending; ok is
// false at the end of the input.
func (s *Reader) readLine() (text []byte, ok bool, err error) {
	s.buf = s.buf[:0]
	for {
		chunk, err := s.br.ReadSlice('\n')
		if s.tee != nil && len(chunk) > 0 {
			if _, werr := s.tee.Write(chunk); werr != nil {
				var se *ScriptError
				if errors.As(werr, &se) {
					return nil, false, werr // too long to keep
				}
				return nil, false, fmt.Errorf("keeping a copy of the script: %w", werr)
			}
		}
		if len(s.buf)+len(chunk) > MaxLineBytes+2 { // +2: the line ending
			return nil, false, &ScriptError{s.line + 1, fmt.Sprintf("the line is longer than %s, the most one line may hold", jsonline.FormatBytes(MaxLineBytes))}
		}
		s.buf = append(s.buf, chunk...)
		switch {
		case err == bufio.ErrBufferFull:
			continue
		case err == io.EOF && len(s.buf) == 0:
			return nil, false, nil
		case err != nil && err != io.EOF:
			return nil, false, err
		}
		s.line++
		t := bytes.TrimSuffix(s.buf, []byte("\n"))
		t = bytes.TrimSuffix(t, []byte("\r"))
		if s.line == 1 {
			t = bytes.TrimPrefix(t, []byte(utf8BOM))
		}
		return t, true, nil
	}
}

// Next returns the next op of the script, checked; ok is false at the
// end. A malformed line, or a script without ops, is a *ScriptError; a
// context that ends stops the reading with its error.
func (s *Reader) Next() (o Op, ok bool, err error) {
	for {
		if err := s.ctx.Err(); err != nil {
			return Op{}, false, err
		}
		text, ok, err := s.readLine()
		if err != nil {
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				return Op{}, false, err
			}
			var se *ScriptError
			if errors.As(err, &se) {
				return Op{}, false, err
			}
			return Op{}, false, &ScriptError{s.line + 1, "reading the script: " + err.Error()}
		}
		if !ok {
			if s.ops == 0 {
				what := "the script is empty"
				if s.line > 0 {
					what = "the script has only blank lines and comments"
				}
				return Op{}, false, &ScriptError{0, what + `: it has no ops (the first op must be "start")`}
			}
			return Op{}, false, nil
		}
		text = bytes.TrimSpace(text)
		if len(text) == 0 || text[0] == '#' {
			continue
		}
		o, err := parseOp(s.line, text)
		if err != nil {
			return Op{}, false, err
		}
		if s.ops == 0 && o.Name != "start" {
			return Op{}, false, &ScriptError{s.line, fmt.Sprintf("the first op must be \"start\", not %q", o.Name)}
		}
		if s.ops > 0 && o.Name == "start" {
			return Op{}, false, &ScriptError{s.line, "\"start\" may appear only once, as the first op"}
		}
		s.ops++
		return o, true, nil
	}
}

// Parse reads and checks a whole script and returns its ops, the first
// being start. A malformed script is a *ScriptError naming the line (and,
// for JSON syntax, the column). Parse holds every op in memory; a long
// script is better read op by op with a Reader.
func Parse(r io.Reader) ([]Op, error) {
	sr := NewReader(context.Background(), r, nil)
	var ops []Op
	for {
		o, ok, err := sr.Next()
		if err != nil {
			return nil, err
		}
		if !ok {
			return ops, nil
		}
		ops = append(ops, o)
	}
}

func parseOp(line int, text []byte) (Op, error) {
	o := Op{Line: line}
	v, err := jsonline.Parse(text)
	if err != nil {
		return o, &ScriptError{line, "malformed JSON: " + err.Error()}
	}
	if v.Kind != jsonline.Object {
		return o, &ScriptError{line, fmt.Sprintf("not a JSON object: the line holds %s; each line is one op, an object like {\"op\":\"snapshot\"}", v.KindName())}
	}
	f := &jsonline.Fields{Obj: &v}
	o.Name = f.Str("op")
	if f.Err != nil {
		return o, &ScriptError{line, f.Err.Error()}
	}
	spec, ok := ops[o.Name]
	if !ok {
		return o, &ScriptError{line, fmt.Sprintf("unknown op %q (known: %s)", o.Name, opNames())}
	}
	if e, ok := f.OptStr("expect"); ok {
		if e != "ok" && !slices.Contains(errorTypes, e) {
			f.Fail(fmt.Errorf("field \"expect\": %q is neither \"ok\" nor an error type (%s)", e, strings.Join(errorTypes, ", ")))
		}
		o.Expect = e
	}
	for _, k := range spec.required {
		if !v.Has(k) {
			f.Fail(fmt.Errorf("needs field %q", k))
		}
	}
	if f.Err == nil {
		f.RejectUnknown(commonKeys, spec.required, spec.optional)
	}
	if f.Err == nil {
		spec.parse(&o, f)
	}
	if f.Err != nil {
		return o, &ScriptError{line, fmt.Sprintf("op %q: %v", o.Name, f.Err)}
	}
	return o, nil
}

// commonKeys are the fields every op may have.
var commonKeys = []string{"op", "expect"}

// readActions reads a plan's reclaim actions (enter false: handle,
// location, to) or its enter actions (enter true: handle, location,
// from). "to" on an enter action is refused with its own message: a
// demotion is a reclaim.
func readActions(f *jsonline.Fields, key string, enter bool) []actionSpec {
	var out []actionSpec
	for _, it := range f.Objects(key) {
		a := actionSpec{handle: it.Str("handle"), location: it.Str("location")}
		if enter {
			a.from, _ = it.OptStr("from")
			if it.Obj.Has("to") {
				it.Fail(fmt.Errorf("field %q: only a reclaim action may carry \"to\" (a demotion to that location); an enter action names where it enters with \"location\" and where it copies from with \"from\"", it.Path+"to"))
			}
			f.Done(it, "handle", "location", "from", "to")
		} else {
			a.to, _ = it.OptStr("to")
			f.Done(it, "handle", "location", "to")
		}
		out = append(out, a)
	}
	return out
}

func readReservations(f *jsonline.Fields, key string) []reservationSpec {
	var out []reservationSpec
	for _, it := range f.Objects(key) {
		r := reservationSpec{name: it.Str("name"), location: it.Str("location"), bytes: it.Bytes("bytes")}
		f.Done(it, "name", "location", "bytes")
		out = append(out, r)
	}
	return out
}

func readPlan(f *jsonline.Fields, key string) *planSpec {
	v, ok := f.Obj.Get(key)
	if !ok {
		f.Missing(key)
		return nil
	}
	sub := f.Object(f.Path+key, v)
	if sub == nil {
		return nil
	}
	p := &planSpec{
		reclaim:      readActions(sub, "reclaim", false),
		reservations: readReservations(sub, "reservations"),
		enter:        readActions(sub, "enter", true),
	}
	f.Done(sub, "reclaim", "reservations", "enter")
	return p
}

func readRequest(f *jsonline.Fields, key string) *requestSpec {
	v, ok := f.Obj.Get(key)
	if !ok {
		f.Missing(key)
		return nil
	}
	sub := f.Object(f.Path+key, v)
	if sub == nil {
		return nil
	}
	r := &requestSpec{name: sub.Str("name")}
	if !sub.Obj.Has("requirements") {
		sub.Missing("requirements")
	}
	for _, it := range sub.Objects("requirements") {
		req := requirementSpec{handle: it.Str("handle"), tiers: it.Tiers("locations")}
		sub.Done(it, "handle", "locations")
		r.requirements = append(r.requirements, req)
	}
	r.reservations = readReservations(sub, "reservations")
	if tie, ok := sub.OptStr("tie_break"); ok {
		switch tie {
		case "first_listed":
		case "most_free":
			r.mostFree = true
		default:
			sub.Fail(fmt.Errorf("field %q: unknown tie-break %q (want \"first_listed\" or \"most_free\")", sub.Path+"tie_break", tie))
		}
	}
	f.Done(sub, "name", "requirements", "reservations", "tie_break")
	return r
}

// locations decodes start's map from location name to budget (integer,
// byte string or null) and checks every name and budget: a bad start makes
// the whole script malformed.
func readLocations(f *jsonline.Fields, key string) []locationSpec {
	v, _ := f.Obj.Get(key)
	if v.Kind != jsonline.Object {
		f.Mistyped(key, "an object mapping location names to budgets", v)
		return nil
	}
	if len(v.Keys) == 0 {
		f.Fail(fmt.Errorf("field %q: configure at least one location", key))
		return nil
	}
	out := make([]locationSpec, 0, len(v.Keys))
	for i, name := range v.Keys {
		b := &v.Items[i]
		if _, err := cuda.ParseLocationName(name); err != nil {
			f.Fail(fmt.Errorf("field %q: malformed location %q (use pageable-host, pinned-host or cuda:N)", key, name))
			return nil
		}
		ls := locationSpec{name: name}
		if b.Kind != jsonline.Null {
			n, err := jsonline.ByteValue(b)
			switch {
			case err != nil:
				f.Fail(fmt.Errorf("field %q: budget of %s: %v", key, name, err))
				return nil
			case n <= 0:
				f.Fail(fmt.Errorf("field %q: budget of %s must be > 0 (use null for no budget), got %d", key, name, n))
				return nil
			}
			ls.hasBudget, ls.budget = true, n
		}
		out = append(out, ls)
	}
	sort.Slice(out, func(i, j int) bool { return wire.LocationLess(out[i].name, out[j].name) })
	return out
}

// readSpill decodes start's optional map from location name to spill
// target. Its shape and names are checked here, as those of "locations"
// are (a malformed script); the rules — both ends configured, a target
// other than its location — are the runtime's, and system.Start refuses
// a start that breaks them (a bad start: nothing runs, exit status 2).
func readSpill(f *jsonline.Fields, key string) map[string]string {
	v, ok := f.Obj.Get(key)
	if !ok {
		return nil
	}
	if v.Kind != jsonline.Object {
		f.Mistyped(key, "an object mapping locations to their spill targets", v)
		return nil
	}
	out := make(map[string]string, len(v.Keys))
	for i, from := range v.Keys {
		t := &v.Items[i]
		if _, err := cuda.ParseLocationName(from); err != nil {
			f.Fail(fmt.Errorf("field %q: malformed location %q (use pageable-host, pinned-host or cuda:N)", key, from))
			return nil
		}
		if t.Kind != jsonline.String {
			f.Fail(fmt.Errorf("field %q: the spill target of %s: want a location name, got %s", key, from, t.KindName()))
			return nil
		}
		if _, err := cuda.ParseLocationName(t.Text); err != nil {
			f.Fail(fmt.Errorf("field %q: the spill target of %s: malformed location %q (use pageable-host, pinned-host or cuda:N)", key, from, t.Text))
			return nil
		}
		out[from] = t.Text
	}
	return out
}

// SortLocations sorts location names in the order of a snapshot's
// locations ([wire.SortLocations]).
func SortLocations(names []string) { wire.SortLocations(names) }
