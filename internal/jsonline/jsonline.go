// Package jsonline is the strict JSON reader of the project's JSON-lines
// inputs: replay scripts (system/replay) and the command lines of
// `demo node`. One parser for both, so a node refuses what a replay
// script refuses.
//
// The tokens come from github.com/go-json-experiment/json/jsontext,
// which follows RFC 8259 and refuses by design what encoding/json lets
// through: an object with the same key twice (encoding/json keeps the
// last; a script line with "handle" twice is ambiguous), a byte that is
// not valid UTF-8 and an escaped UTF-16 surrogate that is not half of a
// pair (encoding/json turns both into U+FFFD, so that two different
// names would read as one). This package keeps the order of an object's
// keys, bounds how deep a line may nest, and says each refusal in the
// words of the line: its column, the byte found and what was wanted.
package jsonline

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/go-json-experiment/json/jsontext"
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

// What a parser wants next, for messages.
const (
	wantValue = "a value (object, array, string, number, true, false or null)"
	wantKey   = "a key (a string in double quotes)"
)

type parser struct {
	data  []byte
	dec   *jsontext.Decoder
	depth int
}

// decoders keeps jsontext decoders (and the buffer each reads) for reuse:
// one line allocates none.
var decoders = sync.Pool{New: func() any { return &reader{dec: jsontext.NewDecoder(&bytes.Buffer{})} }}

type reader struct {
	buf bytes.Buffer
	dec *jsontext.Decoder
}

// Parse parses one complete JSON value (a script line).
func Parse(data []byte) (Value, error) {
	r := decoders.Get().(*reader)
	defer decoders.Put(r)
	r.buf = *bytes.NewBuffer(data) // read in place: jsontext does not copy a bytes.Buffer
	r.dec.Reset(&r.buf)
	p := &parser{data: data, dec: r.dec}
	v, err := p.value()
	if err != nil {
		return Value{}, err
	}
	if end := skipSpace(data, int(p.dec.InputOffset())); end < len(data) {
		return Value{}, p.errorf(end, "unexpected %s after the end of the JSON value", describe(data, end))
	}
	return v, nil
}

func (p *parser) errorf(off int, format string, args ...any) error {
	return &SyntaxError{col: off + 1, msg: fmt.Sprintf(format, args...)}
}

// read reads the next token, its error in the line's words.
func (p *parser) read() (jsontext.Token, error) {
	prev := int(p.dec.InputOffset())
	tok, err := p.dec.ReadToken()
	if err != nil {
		return tok, p.syntaxError(err, prev)
	}
	return tok, nil
}

func (p *parser) value() (Value, error) {
	tok, err := p.read()
	if err != nil {
		return Value{}, err
	}
	switch tok.Kind() {
	case '{':
		return p.object()
	case '[':
		return p.array()
	case '"':
		return Value{Kind: String, Text: tok.String()}, nil
	case '0':
		return Value{Kind: Number, Text: tok.String()}, nil
	case 't', 'f':
		return Value{Kind: Bool, Bool: tok.Bool()}, nil
	}
	return Value{Kind: Null}, nil
}

func (p *parser) enter() error {
	p.depth++
	if p.depth > MaxDepth {
		return p.errorf(int(p.dec.InputOffset())-1, "nested more than %d levels deep", MaxDepth)
	}
	return nil
}

// object reads an object's members after its '{'. Duplicate keys are
// refused by the decoder.
func (p *parser) object() (Value, error) {
	v := Value{Kind: Object}
	if err := p.enter(); err != nil {
		return v, err
	}
	for p.dec.PeekKind() != '}' {
		tok, err := p.read()
		if err != nil {
			return v, err
		}
		key := tok.String()
		item, err := p.value()
		if err != nil {
			return v, err
		}
		v.Keys = append(v.Keys, key)
		v.Items = append(v.Items, item)
	}
	p.depth--
	_, err := p.read() // '}'
	return v, err
}

// array reads an array's elements after its '['.
func (p *parser) array() (Value, error) {
	v := Value{Kind: Array}
	if err := p.enter(); err != nil {
		return v, err
	}
	for p.dec.PeekKind() != ']' {
		item, err := p.value()
		if err != nil {
			return v, err
		}
		v.Items = append(v.Items, item)
	}
	p.depth--
	_, err := p.read() // ']'
	return v, err
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
