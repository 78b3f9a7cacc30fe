package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/residency-go/residency/cuda"
)

// A replay script is parsed and validated completely before anything runs.
// Validation catches what makes a line meaningless: bad JSON, an unknown
// op, a missing, unknown or mistyped field, register with both or neither
// of at/source, a first op that is not start, a bad start. Values that are
// well typed but wrong (bytes ≤ 0, a malformed location inside an op, an
// unknown replica mode) are left for the runtime, which reports them as
// InvalidInput results.

// scriptError is a malformed script: exit status 2.
type scriptError struct {
	line int
	msg  string
}

func (e *scriptError) Error() string {
	if e.line <= 0 {
		return e.msg // about the script as a whole
	}
	return fmt.Sprintf("line %d: %s", e.line, e.msg)
}

// op is one validated operation of a script. Which fields are meaningful
// depends on name.
type op struct {
	line   int
	name   string
	expect string // "" when the line has no expectation

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

type actionSpec struct{ handle, location, from string }

type reservationSpec struct {
	name, location string
	bytes          int64
}

type requestSpec struct {
	name         string
	requirements []requirementSpec
	reservations []reservationSpec
}

type requirementSpec struct {
	handle string
	tiers  [][]string
}

// errorTypes are the names an expect may use besides "ok".
var errorTypes = []string{
	"ResidencyBudgetError",
	"ResidencyPlanError",
	"ResidencySearchLimitError",
	"ResidencyStaleStateError",
	"ResidencyInUseError",
	"ResidencyUnavailableError",
	"ResidencyPlanExecutionError",
	"InvalidInput",
	"Error",
}

// opFields lists, per op, its required and optional fields (besides "op"
// and "expect").
var opFields = map[string]struct{ required, optional []string }{
	"start":               {[]string{"locations"}, []string{"trace", "search_state_limit"}},
	"register":            {[]string{"handle", "bytes"}, []string{"replica", "at", "source"}},
	"place":               {[]string{"handle", "location"}, nil},
	"copy":                {[]string{"handle", "from", "to"}, nil},
	"move":                {[]string{"handle", "from", "to"}, nil},
	"evict":               {[]string{"handle", "location"}, nil},
	"discard":             {[]string{"handle"}, nil},
	"acquire":             {[]string{"handle", "location", "as"}, nil},
	"release":             {[]string{"lease"}, nil},
	"record_event":        {[]string{"lease", "event"}, nil},
	"complete_event":      {[]string{"event"}, nil},
	"hold":                {[]string{"handle", "location", "as"}, nil},
	"unhold":              {[]string{"hold"}, nil},
	"reserve":             {[]string{"location", "bytes", "name"}, nil},
	"unreserve":           {[]string{"name"}, nil},
	"explain":             {[]string{"plan"}, nil},
	"execute":             {[]string{"plan"}, nil},
	"decide":              {[]string{"request", "as"}, nil},
	"enter":               {[]string{"as"}, []string{"decision", "plan", "expected_version"}},
	"exit":                {[]string{"scope"}, nil},
	"release_scope_lease": {[]string{"scope", "enter"}, nil},
	"snapshot":            {nil, nil},
	"trace":               {nil, nil},
	"fail_next":           {[]string{"kind", "location"}, nil},
}

// opNames returns the known ops, sorted (for messages).
func opNames() string {
	names := make([]string, 0, len(opFields))
	for n := range opFields {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// utf8BOM is the byte order mark some editors put at the start of a file.
const utf8BOM = "\xef\xbb\xbf"

// scriptReader reads a script one op at a time. Memory is bounded by the
// longest line (maxLineBytes), whatever the number of lines.
type scriptReader struct {
	ctx  context.Context
	br   *bufio.Reader
	tee  io.Writer // when set, every byte read is copied here (spooling stdin)
	buf  []byte
	line int // physical line number of the last line read
	ops  int // ops read so far
}

func newScriptReader(ctx context.Context, r io.Reader, tee io.Writer) *scriptReader {
	return &scriptReader{ctx: ctx, br: bufio.NewReaderSize(r, 64<<10), tee: tee}
}

// readLine returns the next physical line without its line ending; ok is
// false at the end of the input.
func (s *scriptReader) readLine() (text []byte, ok bool, err error) {
	s.buf = s.buf[:0]
	for {
		chunk, err := s.br.ReadSlice('\n')
		if s.tee != nil && len(chunk) > 0 {
			if _, werr := s.tee.Write(chunk); werr != nil {
				var se *scriptError
				if errors.As(werr, &se) {
					return nil, false, werr // too long to keep
				}
				return nil, false, fmt.Errorf("keeping a copy of the script: %w", werr)
			}
		}
		if len(s.buf)+len(chunk) > maxLineBytes+2 { // +2: the line ending
			return nil, false, &scriptError{s.line + 1, fmt.Sprintf("the line is longer than %s, the most one line may hold", formatBytes(maxLineBytes))}
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

// next returns the next op of the script, checked; ok is false at the end.
// A context that ends stops the reading with its error.
func (s *scriptReader) next() (o op, ok bool, err error) {
	for {
		if err := s.ctx.Err(); err != nil {
			return op{}, false, err
		}
		text, ok, err := s.readLine()
		if err != nil {
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				return op{}, false, err
			}
			var se *scriptError
			if errors.As(err, &se) {
				return op{}, false, err
			}
			return op{}, false, &scriptError{s.line + 1, "reading the script: " + err.Error()}
		}
		if !ok {
			if s.ops == 0 {
				what := "the script is empty"
				if s.line > 0 {
					what = "the script has only blank lines and comments"
				}
				return op{}, false, &scriptError{0, what + `: it has no ops (the first op must be "start")`}
			}
			return op{}, false, nil
		}
		text = bytes.TrimSpace(text)
		if len(text) == 0 || text[0] == '#' {
			continue
		}
		o, err := parseOp(s.line, text)
		if err != nil {
			return op{}, false, err
		}
		if s.ops == 0 && o.name != "start" {
			return op{}, false, &scriptError{s.line, fmt.Sprintf("the first op must be \"start\", not %q", o.name)}
		}
		if s.ops > 0 && o.name == "start" {
			return op{}, false, &scriptError{s.line, "\"start\" may appear only once, as the first op"}
		}
		s.ops++
		return o, true, nil
	}
}

// parseScript reads and checks a whole script held in memory (tests and
// small tools; the replay itself streams).
func parseScript(r io.Reader) ([]op, error) {
	sr := newScriptReader(context.Background(), r, nil)
	var ops []op
	for {
		o, ok, err := sr.next()
		if err != nil {
			return nil, err
		}
		if !ok {
			return ops, nil
		}
		ops = append(ops, o)
	}
}

func parseOp(line int, text []byte) (op, error) {
	o := op{line: line}
	v, err := parseJSON(text)
	if err != nil {
		return o, &scriptError{line, "malformed JSON: " + err.Error()}
	}
	if v.kind != jObject {
		return o, &scriptError{line, fmt.Sprintf("not a JSON object: the line holds %s; each line is one op, an object like {\"op\":\"snapshot\"}", v.kindName())}
	}
	f := &fields{obj: &v}
	o.name = f.str("op")
	if f.err != nil {
		return o, &scriptError{line, f.err.Error()}
	}
	spec, ok := opFields[o.name]
	if !ok {
		return o, &scriptError{line, fmt.Sprintf("unknown op %q (known: %s)", o.name, opNames())}
	}
	if e, ok := f.optStr("expect"); ok {
		if e != "ok" && !contains(errorTypes, e) {
			f.fail(fmt.Errorf("field \"expect\": %q is neither \"ok\" nor an error type (%s)", e, strings.Join(errorTypes, ", ")))
		}
		o.expect = e
	}
	for _, k := range spec.required {
		if !v.has(k) {
			f.fail(fmt.Errorf("needs field %q", k))
		}
	}
	if f.err == nil {
		f.rejectUnknown(commonKeys, spec.required, spec.optional)
	}
	if f.err == nil {
		o.fill(f)
	}
	if f.err != nil {
		return o, &scriptError{line, fmt.Sprintf("op %q: %v", o.name, f.err)}
	}
	return o, nil
}

// fill reads the op's fields; presence of required ones was checked.
func (o *op) fill(f *fields) {
	switch o.name {
	case "start":
		o.locations = f.locations("locations")
		o.trace = f.optInt("trace")
		o.stateLimit = f.optInt("search_state_limit")
		if o.trace != nil && *o.trace < 0 {
			f.fail(fmt.Errorf("field \"trace\": the trace capacity must be ≥ 0 (0 disables the trace)"))
		}
		if o.stateLimit != nil && *o.stateLimit < 0 {
			f.fail(fmt.Errorf("field \"search_state_limit\": must be ≥ 0 (0 means the default)"))
		}
	case "register":
		o.handle = f.str("handle")
		o.bytes = f.bytes("bytes")
		o.replica, _ = f.optStr("replica")
		at, hasAt := f.optStr("at")
		src, hasSrc := f.optStr("source")
		switch {
		case hasAt && hasSrc:
			f.fail(fmt.Errorf("give either \"at\" (resident at registration) or \"source\" (reconstructible), not both"))
		case !hasAt && !hasSrc:
			f.fail(fmt.Errorf("needs \"at\" (resident at registration) or \"source\" (reconstructible)"))
		}
		o.at, o.source = at, src
	case "place", "evict":
		o.handle, o.location = f.str("handle"), f.str("location")
	case "copy", "move":
		o.handle, o.from, o.to = f.str("handle"), f.str("from"), f.str("to")
	case "discard":
		o.handle = f.str("handle")
	case "acquire", "hold":
		o.handle, o.location, o.as = f.str("handle"), f.str("location"), f.str("as")
	case "release":
		o.lease = f.str("lease")
	case "record_event":
		o.lease, o.event = f.str("lease"), f.str("event")
	case "complete_event":
		o.event = f.str("event")
	case "unhold":
		o.hold = f.str("hold")
	case "reserve":
		o.location, o.bytes, o.resName = f.str("location"), f.bytes("bytes"), f.str("name")
	case "unreserve":
		o.resName = f.str("name")
	case "explain", "execute":
		o.plan = f.plan("plan")
	case "decide":
		o.request = f.request("request")
		o.as = f.str("as")
	case "enter":
		o.as = f.str("as")
		d, hasD := f.optStr("decision")
		hasP := f.obj.has("plan")
		switch {
		case hasD && hasP:
			f.fail(fmt.Errorf("give either \"decision\" or \"plan\", not both"))
		case !hasD && !hasP:
			f.fail(fmt.Errorf("needs \"decision\" (a decision's name) or \"plan\""))
		case hasP:
			o.plan = f.plan("plan")
		}
		o.decision = d
		if v := f.optInt("expected_version"); v != nil {
			switch {
			case hasD:
				f.fail(fmt.Errorf("\"expected_version\" goes with \"plan\"; a decision carries its own"))
			case *v < 0:
				f.fail(fmt.Errorf("field \"expected_version\": must be ≥ 0"))
			default:
				u := uint64(*v)
				o.expectedVersion = &u
			}
		}
	case "exit":
		o.scope = f.str("scope")
	case "release_scope_lease":
		o.scope = f.str("scope")
		if n := f.optInt("enter"); n != nil {
			if *n < 0 {
				f.fail(fmt.Errorf("field \"enter\": an index into the plan's enter actions, ≥ 0"))
			}
			o.index = *n
		}
	case "snapshot", "trace":
	case "fail_next":
		o.kind, o.location = f.str("kind"), f.str("location")
	case "cache_open", "load", "load_fail", "cache_release", "cache_pin", "cache_unpin", "cache_evict", "cache_stats", "cache_close":
		o.fillCache(f)
	default:
		if isStagingOp(o.name) {
			o.fillStaging(f)
		}
	}
}

// commonKeys are the fields every op may have.
var commonKeys = []string{"op", "expect"}

// fields reads typed fields of one JSON object and keeps the first error.
type fields struct {
	obj  *jval
	path string // prefix for messages, e.g. "plan.enter[0]."
	err  error
}

func (f *fields) fail(err error) {
	if f.err == nil {
		f.err = err
	}
}

// rejectUnknown fails on any key that is in none of the allowed lists.
func (f *fields) rejectUnknown(allowed ...[]string) {
	var unknown []string
	for _, k := range f.obj.keys {
		ok := false
		for _, list := range allowed {
			if contains(list, k) {
				ok = true
				break
			}
		}
		if !ok {
			unknown = append(unknown, f.path+k)
		}
	}
	switch len(unknown) {
	case 0:
	case 1:
		f.fail(fmt.Errorf("unknown field %q", unknown[0]))
	default:
		quoted := make([]string, len(unknown))
		for i, u := range unknown {
			quoted[i] = strconv.Quote(u)
		}
		f.fail(fmt.Errorf("unknown fields %s", strings.Join(quoted, ", ")))
	}
}

func (f *fields) mistyped(key, want string, v *jval) {
	f.fail(fmt.Errorf("field %q: want %s, got %s", f.path+key, want, v.kindName()))
}

func (f *fields) missing(key string) {
	f.fail(fmt.Errorf("missing field %q", f.path+key))
}

func (f *fields) str(key string) string {
	v, ok := f.obj.get(key)
	if !ok {
		f.missing(key)
		return ""
	}
	if v.kind != jString {
		f.mistyped(key, "a string", v)
		return ""
	}
	return v.s
}

func (f *fields) optStr(key string) (string, bool) {
	if !f.obj.has(key) {
		return "", false
	}
	return f.str(key), true
}

// numberError explains why a JSON number is not an acceptable integer;
// unit is what the number counts ("" or "bytes").
func numberError(text string, p numberProblem, unit string) error {
	switch p {
	case numberFractional:
		if unit != "" {
			return fmt.Errorf("%s is not a whole number of %s", text, unit)
		}
		return fmt.Errorf("%s is not a whole number (want an integer)", text)
	case numberTooLarge:
		return fmt.Errorf("%s is too large: the largest integer accepted is %d", text, int64(math.MaxInt64))
	default:
		return fmt.Errorf("%s is too small: the smallest integer accepted is %d", text, int64(math.MinInt64))
	}
}

func (f *fields) optInt(key string) *int64 {
	v, ok := f.obj.get(key)
	if !ok {
		return nil
	}
	if v.kind != jNumber {
		f.mistyped(key, "an integer", v)
		return nil
	}
	n, p := jsonInt(v.s)
	if p != numberOK {
		f.fail(fmt.Errorf("field %q: %v", f.path+key, numberError(v.s, p, "")))
		return nil
	}
	return &n
}

// byteValue decodes an integer or a byte string such as "40GiB".
func byteValue(v *jval) (int64, error) {
	switch v.kind {
	case jNumber:
		n, p := jsonInt(v.s)
		if p != numberOK {
			return 0, numberError(v.s, p, "bytes")
		}
		return n, nil
	case jString:
		return parseByteString(v.s)
	}
	return 0, fmt.Errorf("want an integer or a byte string like \"40GiB\", got %s", v.kindName())
}

func (f *fields) bytes(key string) int64 {
	v, ok := f.obj.get(key)
	if !ok {
		f.missing(key)
		return 0
	}
	n, err := byteValue(v)
	if err != nil {
		f.fail(fmt.Errorf("field %q: %v", f.path+key, err))
	}
	return n
}

// objects decodes an array of objects; a missing key is an empty list.
func (f *fields) objects(key string) []*fields {
	v, ok := f.obj.get(key)
	if !ok {
		return nil
	}
	if v.kind != jArray {
		f.mistyped(key, "an array", v)
		return nil
	}
	out := make([]*fields, 0, len(v.items))
	for i := range v.items {
		sub := f.object(fmt.Sprintf("%s%s[%d]", f.path, key, i), &v.items[i])
		if sub == nil {
			return nil
		}
		out = append(out, sub)
	}
	return out
}

// object wraps v, which must be a JSON object whose fields are reported
// under name.
func (f *fields) object(name string, v *jval) *fields {
	if v.kind != jObject {
		f.fail(fmt.Errorf("field %q: want an object, got %s", name, v.kindName()))
		return nil
	}
	return &fields{obj: v, path: name + "."}
}

// done merges a nested reader's error and unknown-field check into f.
func (f *fields) done(sub *fields, keys ...string) {
	if sub.err == nil {
		sub.rejectUnknown(keys)
	}
	if sub.err != nil {
		f.fail(sub.err)
	}
}

func (f *fields) actions(key string, withFrom bool) []actionSpec {
	var out []actionSpec
	for _, it := range f.objects(key) {
		a := actionSpec{handle: it.str("handle"), location: it.str("location")}
		if withFrom {
			a.from, _ = it.optStr("from")
			f.done(it, "handle", "location", "from")
		} else {
			f.done(it, "handle", "location")
		}
		out = append(out, a)
	}
	return out
}

func (f *fields) reservations(key string) []reservationSpec {
	var out []reservationSpec
	for _, it := range f.objects(key) {
		r := reservationSpec{name: it.str("name"), location: it.str("location"), bytes: it.bytes("bytes")}
		f.done(it, "name", "location", "bytes")
		out = append(out, r)
	}
	return out
}

func (f *fields) plan(key string) *planSpec {
	v, ok := f.obj.get(key)
	if !ok {
		f.missing(key)
		return nil
	}
	sub := f.object(f.path+key, v)
	if sub == nil {
		return nil
	}
	p := &planSpec{
		reclaim:      sub.actions("reclaim", false),
		reservations: sub.reservations("reservations"),
		enter:        sub.actions("enter", true),
	}
	f.done(sub, "reclaim", "reservations", "enter")
	return p
}

func (f *fields) request(key string) *requestSpec {
	v, ok := f.obj.get(key)
	if !ok {
		f.missing(key)
		return nil
	}
	sub := f.object(f.path+key, v)
	if sub == nil {
		return nil
	}
	r := &requestSpec{name: sub.str("name")}
	if !sub.obj.has("requirements") {
		sub.missing("requirements")
	}
	for _, it := range sub.objects("requirements") {
		req := requirementSpec{handle: it.str("handle"), tiers: it.tiers("locations")}
		sub.done(it, "handle", "locations")
		r.requirements = append(r.requirements, req)
	}
	r.reservations = sub.reservations("reservations")
	f.done(sub, "name", "requirements", "reservations")
	return r
}

// tiers decodes a requirement's locations: each element is a location (a
// tier of one) or an array of equally preferred locations.
func (f *fields) tiers(key string) [][]string {
	v, ok := f.obj.get(key)
	if !ok {
		f.missing(key)
		return nil
	}
	if v.kind != jArray {
		f.mistyped(key, "an array of locations or arrays of locations", v)
		return nil
	}
	tiers := make([][]string, 0, len(v.items))
	for i := range v.items {
		it := &v.items[i]
		where := fmt.Sprintf("%s%s[%d]", f.path, key, i)
		switch it.kind {
		case jString:
			tiers = append(tiers, []string{it.s})
			continue
		case jArray:
			many := make([]string, 0, len(it.items))
			for j := range it.items {
				if it.items[j].kind != jString {
					f.fail(fmt.Errorf("field %q: want a location (a string), got %s", fmt.Sprintf("%s[%d]", where, j), it.items[j].kindName()))
					return nil
				}
				many = append(many, it.items[j].s)
			}
			tiers = append(tiers, many)
			continue
		}
		f.fail(fmt.Errorf("field %q: want a location or an array of locations, got %s", where, it.kindName()))
		return nil
	}
	return tiers
}

// locations decodes start's map from location name to budget (integer,
// byte string or null) and checks every name and budget: a bad start makes
// the whole script malformed.
func (f *fields) locations(key string) []locationSpec {
	v, _ := f.obj.get(key)
	if v.kind != jObject {
		f.mistyped(key, "an object mapping location names to budgets", v)
		return nil
	}
	if len(v.keys) == 0 {
		f.fail(fmt.Errorf("field %q: configure at least one location", key))
		return nil
	}
	out := make([]locationSpec, 0, len(v.keys))
	for i, name := range v.keys {
		b := &v.items[i]
		if _, err := cuda.ParseLocationName(name); err != nil {
			f.fail(fmt.Errorf("field %q: malformed location %q (use pageable-host, pinned-host or cuda:N)", key, name))
			return nil
		}
		ls := locationSpec{name: name}
		if b.kind != jNull {
			n, err := byteValue(b)
			switch {
			case err != nil:
				f.fail(fmt.Errorf("field %q: budget of %s: %v", key, name, err))
				return nil
			case n <= 0:
				f.fail(fmt.Errorf("field %q: budget of %s must be > 0 (use null for no budget), got %d", key, name, n))
				return nil
			}
			ls.hasBudget, ls.budget = true, n
		}
		out = append(out, ls)
	}
	sort.Slice(out, func(i, j int) bool { return locationLess(out[i].name, out[j].name) })
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// locationLess orders location names as snapshots do: pageable-host,
// pinned-host, cuda:0, cuda:1, … (numeric), node-qualified names after
// unqualified ones, by node. Malformed names sort last, by string.
func locationLess(a, b string) bool {
	la, ea := cuda.ParseLocationName(a)
	lb, eb := cuda.ParseLocationName(b)
	switch {
	case ea != nil || eb != nil:
		if (ea == nil) != (eb == nil) {
			return ea == nil
		}
		return a < b
	case la.Node != lb.Node:
		if (la.Node == "") != (lb.Node == "") {
			return la.Node == ""
		}
		return la.Node < lb.Node
	case la.Kind != lb.Kind:
		return la.Kind < lb.Kind
	default:
		return la.Device < lb.Device
	}
}

// sortLocations sorts location names in location order.
func sortLocations(names []string) {
	sort.Slice(names, func(i, j int) bool { return locationLess(names[i], names[j]) })
}
