// Package jsonline is the strict JSON reader of the project's JSON-lines
// inputs: replay scripts (system/replay) and the command lines of
// `demo node`. One parser for both, so a node refuses what a replay
// script refuses.
//
// encoding/json would accept an
// object with the same key twice (the last one wins) and decodes into maps
// that forget the order of keys; a script line with "handle" twice is
// ambiguous, so this reader rejects duplicate keys, names the key, and
// bounds how deep a line may nest. Everything else follows RFC 8259.
package jsonline

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxDepth bounds the nesting of arrays and objects in one line. The
// deepest legitimate op (a request's tiers) nests four levels.
const MaxDepth = 32

// Kind is the kind of a JSON value.
type Kind uint8

// The kinds of JSON values.
const (
	Null Kind = iota
	Bool
	Number
	String
	Array
	Object
)

// Value is one parsed JSON value.
type Value struct {
	Kind  Kind
	Bool  bool     // a boolean's value
	Text  string   // a string's value, or a number's text as written
	Items []Value  // array elements, or object member values
	Keys  []string // object member names, in order (parallel to Items)
	Col   int      // 1-based column of the value's first byte
}

// Get returns the member named key of an object.
func (v *Value) Get(key string) (*Value, bool) {
	for i, k := range v.Keys {
		if k == key {
			return &v.Items[i], true
		}
	}
	return nil, false
}

// Has reports whether an object has a member named key.
func (v *Value) Has(key string) bool {
	_, ok := v.Get(key)
	return ok
}

// KindName says what a value is, for messages ("got a number").
func (v *Value) KindName() string {
	switch v.Kind {
	case Null:
		return "null"
	case Bool:
		return "a boolean"
	case Number:
		return "a number"
	case String:
		return "a string"
	case Array:
		return "an array"
	default:
		return "an object"
	}
}

// SyntaxError is a syntax error at a column of the line.
type SyntaxError struct {
	col int
	msg string
}

func (e *SyntaxError) Error() string { return fmt.Sprintf("column %d: %s", e.col, e.msg) }

type jparser struct {
	data  []byte
	pos   int
	depth int
	// Members of the objects being parsed, innermost last; each object
	// copies its own out when it ends, so its slices are allocated once,
	// at their exact size.
	keys  []string
	items []Value
}

// internKeys are the keys of script ops: decoding one of them as a key
// allocates nothing.
var internKeys = func() map[string]string {
	m := map[string]string{}
	for _, k := range []string{"op", "expect", "name", "requirements", "reservations", "locations",
		"reclaim", "enter", "from", "to", "handle", "location", "bytes", "as", "lease", "event", "hold",
		"replica", "at", "source", "plan", "request", "decision", "scope", "kind", "expected_version",
		"trace", "search_state_limit"} {
		m[k] = k
	}
	return m
}()

// Parse parses one complete JSON value (a script line).
func Parse(data []byte) (Value, error) {
	p := &jparser{data: data}
	p.space()
	v, err := p.value()
	if err != nil {
		return Value{}, err
	}
	p.space()
	if p.pos < len(p.data) {
		return Value{}, p.errorf("unexpected %s after the end of the JSON value", p.describe())
	}
	return v, nil
}

func (p *jparser) errorf(format string, args ...any) error {
	return &SyntaxError{col: p.pos + 1, msg: fmt.Sprintf(format, args...)}
}

// describe names the byte at pos for a message.
func (p *jparser) describe() string {
	if p.pos >= len(p.data) {
		return "end of line"
	}
	c := p.data[p.pos]
	if c < 0x20 || c >= 0x7f {
		return fmt.Sprintf("byte 0x%02x", c)
	}
	return fmt.Sprintf("character %q", rune(c))
}

func (p *jparser) space() {
	for p.pos < len(p.data) {
		switch p.data[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

func (p *jparser) value() (Value, error) {
	if p.pos >= len(p.data) {
		return Value{}, p.errorf("unexpected end of line: want a value")
	}
	col := p.pos + 1
	switch c := p.data[p.pos]; {
	case c == '{':
		return p.object()
	case c == '[':
		return p.array()
	case c == '"':
		s, err := p.str()
		return Value{Kind: String, Text: s, Col: col}, err
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	case c == 't':
		return Value{Kind: Bool, Bool: true, Col: col}, p.literal("true")
	case c == 'f':
		return Value{Kind: Bool, Col: col}, p.literal("false")
	case c == 'n':
		return Value{Kind: Null, Col: col}, p.literal("null")
	}
	return Value{}, p.errorf("unexpected %s: want a value (object, array, string, number, true, false or null)", p.describe())
}

func (p *jparser) literal(word string) error {
	if !strings.HasPrefix(string(p.data[p.pos:min(len(p.data), p.pos+len(word))]), word) {
		return p.errorf("unexpected %s: want a value (object, array, string, number, true, false or null)", p.describe())
	}
	p.pos += len(word)
	return nil
}

func (p *jparser) enter() error {
	p.depth++
	if p.depth > MaxDepth {
		return p.errorf("nested more than %d levels deep", MaxDepth)
	}
	return nil
}

func (p *jparser) object() (Value, error) {
	v := Value{Kind: Object, Col: p.pos + 1}
	if err := p.enter(); err != nil {
		return v, err
	}
	p.pos++ // {
	p.space()
	if p.pos < len(p.data) && p.data[p.pos] == '}' {
		p.pos++
		p.depth--
		return v, nil
	}
	base := len(p.keys)
	defer func() { p.keys, p.items = p.keys[:base], p.items[:base] }()
	var seen map[string]bool // only for large objects; small ones scan keys
	for {
		p.space()
		if p.pos >= len(p.data) || p.data[p.pos] != '"' {
			return v, p.errorf("unexpected %s: want a key (a string in double quotes)", p.describe())
		}
		keyCol := p.pos + 1
		key, err := p.key()
		if err != nil {
			return v, err
		}
		dup := false
		if seen != nil {
			dup = seen[key]
		} else {
			for _, k := range p.keys[base:] {
				if k == key {
					dup = true
					break
				}
			}
		}
		if dup {
			return v, &SyntaxError{col: keyCol, msg: fmt.Sprintf("duplicate key %q in one object (each key may appear once)", key)}
		}
		if len(p.keys)-base == 16 {
			seen = make(map[string]bool, 32)
			for _, k := range p.keys[base:] {
				seen[k] = true
			}
		}
		if seen != nil {
			seen[key] = true
		}
		p.space()
		if p.pos >= len(p.data) || p.data[p.pos] != ':' {
			return v, p.errorf("unexpected %s: want ':' after key %q", p.describe(), key)
		}
		p.pos++
		p.space()
		item, err := p.value()
		if err != nil {
			return v, err
		}
		p.keys = append(p.keys, key)
		p.items = append(p.items, item)
		p.space()
		if p.pos < len(p.data) {
			switch p.data[p.pos] {
			case ',':
				p.pos++
				continue
			case '}':
				p.pos++
				p.depth--
				v.Keys = append([]string(nil), p.keys[base:]...)
				v.Items = append([]Value(nil), p.items[base:]...)
				return v, nil
			}
		}
		return v, p.errorf("unexpected %s: want ',' or '}' in an object", p.describe())
	}
}

// key reads an object key: a string, interned when it is a known one.
func (p *jparser) key() (string, error) {
	start := p.pos
	if end := indexQuote(p.data, start+1); end > 0 {
		if k, ok := internKeys[string(p.data[start+1:end])]; ok {
			p.pos = end + 1
			return k, nil
		}
	}
	return p.str()
}

// indexQuote returns the index of the first '"' at or after from when no
// escape or control character comes before it, else -1.
func indexQuote(b []byte, from int) int {
	for i := from; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			return i
		case c == '\\' || c < 0x20:
			return -1
		}
	}
	return -1
}

func (p *jparser) array() (Value, error) {
	v := Value{Kind: Array, Col: p.pos + 1}
	if err := p.enter(); err != nil {
		return v, err
	}
	p.pos++ // [
	p.space()
	if p.pos < len(p.data) && p.data[p.pos] == ']' {
		p.pos++
		p.depth--
		return v, nil
	}
	for {
		p.space()
		item, err := p.value()
		if err != nil {
			return v, err
		}
		v.Items = append(v.Items, item)
		p.space()
		if p.pos < len(p.data) {
			switch p.data[p.pos] {
			case ',':
				p.pos++
				continue
			case ']':
				p.pos++
				p.depth--
				return v, nil
			}
		}
		return v, p.errorf("unexpected %s: want ',' or ']' in an array", p.describe())
	}
}

// str reads a string starting at its opening quote.
func (p *jparser) str() (string, error) {
	start := p.pos
	p.pos++
	simple := true
	for p.pos < len(p.data) {
		c := p.data[p.pos]
		switch {
		case c == '"':
			raw := p.data[start+1 : p.pos]
			p.pos++
			if simple {
				return string(raw), nil
			}
			if err := checkText(raw, start+2); err != nil {
				return "", err
			}
			if !hasByte(raw, '\\') {
				return string(raw), nil
			}
			// Escapes are decoded by encoding/json (the string is valid
			// UTF-8 and has no lone surrogate: nothing becomes U+FFFD).
			var s string
			if err := json.Unmarshal(p.data[start:p.pos], &s); err != nil {
				return "", &SyntaxError{col: start + 1, msg: "bad string: " + strings.TrimPrefix(err.Error(), "json: ")}
			}
			return s, nil
		case c == '\\':
			simple = false
			p.pos += 2
		case c < 0x20:
			return "", p.errorf("control character 0x%02x inside a string (write it as an escape such as \\u%04x)", c, c)
		default:
			if c >= 0x80 {
				simple = false
			}
			p.pos++
		}
	}
	return "", &SyntaxError{col: start + 1, msg: "unterminated string (no closing '\"' on this line)"}
}

// checkText refuses what encoding/json would silently turn into U+FFFD,
// so that a string is exactly what its line said and two different
// strings never read as one: a byte that is not valid UTF-8, and an
// escaped UTF-16 surrogate (\ud800 to \udfff) that is not part of a
// pair. raw is a string's body; col is the column of its first byte.
func checkText(raw []byte, col int) error {
	for i := 0; i < len(raw); {
		c := raw[i]
		switch {
		case c == '\\' && i+1 < len(raw) && raw[i+1] == 'u':
			hi, ok := hex4(raw[i+2:])
			if !ok || hi < 0xd800 || hi > 0xdfff {
				i += 2
				continue
			}
			if hi <= 0xdbff && i+12 <= len(raw) && raw[i+6] == '\\' && raw[i+7] == 'u' {
				if lo, ok := hex4(raw[i+8:]); ok && lo >= 0xdc00 && lo <= 0xdfff {
					i += 12
					continue
				}
			}
			return &SyntaxError{col: col + i, msg: fmt.Sprintf("bad string: %s is half of a UTF-16 surrogate pair, which stands for no character", raw[i:i+6])}
		case c == '\\':
			i += 2
		case c < utf8.RuneSelf:
			i++
		default:
			r, n := utf8.DecodeRune(raw[i:])
			if r == utf8.RuneError && n <= 1 {
				return &SyntaxError{col: col + i, msg: fmt.Sprintf("bad string: byte 0x%02x is not valid UTF-8 (the input must be UTF-8: a name is kept exactly as written, never replaced)", c)}
			}
			i += n
		}
	}
	return nil
}

// hex4 decodes the 4 hex digits at the start of b.
func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

func hasByte(b []byte, c byte) bool {
	for _, x := range b {
		if x == c {
			return true
		}
	}
	return false
}

// number reads a number per the JSON grammar and keeps its text.
func (p *jparser) number() (Value, error) {
	start := p.pos
	digits := func() int {
		n := 0
		for p.pos < len(p.data) && p.data[p.pos] >= '0' && p.data[p.pos] <= '9' {
			p.pos++
			n++
		}
		return n
	}
	if p.data[p.pos] == '-' {
		p.pos++
	}
	if p.pos < len(p.data) && p.data[p.pos] == '0' {
		p.pos++
	} else if digits() == 0 {
		return Value{}, p.errorf("bad number: want a digit after '-'")
	}
	if p.pos < len(p.data) && p.data[p.pos] == '.' {
		p.pos++
		if digits() == 0 {
			return Value{}, p.errorf("bad number: want a digit after '.'")
		}
	}
	if p.pos < len(p.data) && (p.data[p.pos] == 'e' || p.data[p.pos] == 'E') {
		p.pos++
		if p.pos < len(p.data) && (p.data[p.pos] == '+' || p.data[p.pos] == '-') {
			p.pos++
		}
		if digits() == 0 {
			return Value{}, p.errorf("bad number: want a digit in the exponent")
		}
	}
	if p.pos < len(p.data) {
		if c := p.data[p.pos]; c >= '0' && c <= '9' || c == '.' || c == 'e' || c == 'E' || c == '-' || c == '+' {
			return Value{}, p.errorf("bad number %q", string(p.data[start:p.pos+1]))
		}
	}
	return Value{Kind: Number, Text: string(p.data[start:p.pos]), Col: start + 1}, nil
}

// NumberProblem says why a JSON number is not an int64.
type NumberProblem int

// The problems a number may have.
const (
	NumberOK NumberProblem = iota
	NumberFractional
	NumberTooLarge
	NumberTooSmall
)

// ParseInt converts the text of a JSON number (already checked against the
// grammar) to an int64, exactly: "1e3" is 1000 and "2.50e1" is 25, while
// "1.5" is fractional and "1e30" too large. Huge exponents are decided
// without computing the number.
func ParseInt(text string) (int64, NumberProblem) {
	if n, err := strconv.ParseInt(text, 10, 64); err == nil {
		return n, NumberOK
	}
	neg := strings.HasPrefix(text, "-")
	t := strings.TrimPrefix(text, "-")
	mant, exp := t, 0
	if i := strings.IndexAny(t, "eE"); i >= 0 {
		mant = t[:i]
		e := strings.TrimPrefix(t[i+1:], "+")
		eneg := strings.HasPrefix(e, "-")
		e = strings.TrimLeft(strings.TrimPrefix(e, "-"), "0")
		if len(e) > 7 {
			e = "9999999" // any exponent this large decides the answer alike
		}
		exp, _ = strconv.Atoi("0" + e)
		if eneg {
			exp = -exp
		}
	}
	intPart, frac := mant, ""
	if i := strings.IndexByte(mant, '.'); i >= 0 {
		intPart, frac = mant[:i], mant[i+1:]
	}
	digits := strings.TrimLeft(intPart+frac, "0")
	exp -= len(frac)
	for strings.HasSuffix(digits, "0") {
		digits = digits[:len(digits)-1]
		exp++
	}
	if digits == "" {
		return 0, NumberOK // a zero, however written
	}
	if exp < 0 {
		return 0, NumberFractional
	}
	big := func() NumberProblem {
		if neg {
			return NumberTooSmall
		}
		return NumberTooLarge
	}
	if len(digits)+exp > 19 {
		return 0, big()
	}
	s := digits + strings.Repeat("0", exp)
	if neg {
		s = "-" + s
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, big()
	}
	return n, NumberOK
}
