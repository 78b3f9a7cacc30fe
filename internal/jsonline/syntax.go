package jsonline

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/go-json-experiment/json/jsontext"
)

// syntaxError says what the decoder refused in the line's words: the
// column (1-based), the byte found there and what was wanted. prev is the
// offset where the failed read began.
func (p *parser) syntaxError(err error, prev int) error {
	var se *jsontext.SyntacticError
	if !errors.As(err, &se) { // io.EOF: a line with no value
		return p.errorf(len(p.data), "unexpected end of line: want a value")
	}
	off, msg := int(se.ByteOffset), se.Err.Error()
	switch {
	case errors.Is(se.Err, jsontext.ErrDuplicateName):
		return p.errorf(off, "duplicate key %q in one object (each key may appear once)", se.JSONPointer.LastToken())
	case se.Err == io.ErrUnexpectedEOF:
		if start := tokenStart(p.data, prev); start < len(p.data) && p.data[start] == '"' {
			return p.errorf(start, "unterminated string (no closing '\"' on this line)")
		}
		return p.errorf(len(p.data), "unexpected end of line: want %s", p.wantAtEnd())
	case strings.Contains(msg, "invalid UTF-8"):
		return p.errorf(off, "bad string: byte 0x%02x is not valid UTF-8 (the input must be UTF-8: a name is kept exactly as written, never replaced)", p.data[off])
	case strings.HasPrefix(msg, "invalid surrogate pair"):
		return p.errorf(off, "bad string: %s is half of a UTF-16 surrogate pair, which stands for no character", p.data[off:min(off+6, len(p.data))])
	case strings.Contains(msg, "in string (expecting non-control character)"):
		c := p.data[off]
		return p.errorf(off, "control character 0x%02x inside a string (write it as an escape such as \\u%04x)", c, c)
	case strings.Contains(msg, " in string"):
		return p.errorf(off, "bad string: %s", strings.TrimSuffix(msg, " in string"))
	case strings.Contains(msg, " in number "):
		return p.errorf(off, "bad number: want a digit %s", afterWhat(p.data[off-1]))
	case strings.Contains(msg, " in literal "):
		start := tokenStart(p.data, prev)
		return p.errorf(start, "unexpected %s: want %s", describe(p.data, start), wantValue)
	case strings.Contains(msg, "after object name"):
		if before(p.data, off) == ':' {
			return p.errorf(off, "unexpected %s: want %s", describe(p.data, off), wantValue)
		}
		return p.errorf(off, "unexpected %s: want ':' after key %q", describe(p.data, off), se.JSONPointer.LastToken())
	case off > 0 && isNumberByte(p.data[off]) && isNumberByte(p.data[off-1]):
		start := off
		for start > 0 && isNumberByte(p.data[start-1]) {
			start--
		}
		return p.errorf(off, "bad number %q", p.data[start:off+1])
	case strings.Contains(msg, "after object value"):
		return p.errorf(off, "unexpected %s: want ',' or '}' in an object", describe(p.data, off))
	case strings.Contains(msg, "after array element"):
		return p.errorf(off, "unexpected %s: want ',' or ']' in an array", describe(p.data, off))
	case strings.Contains(msg, "object member name must be a string"):
		return p.errorf(off, "unexpected %s: want %s", describe(p.data, off), wantKey)
	case strings.Contains(msg, "at start of value"):
		want := wantValue
		if off < len(p.data) && p.data[off] == ',' {
			if b := before(p.data, off); b != '{' && b != '[' && b != ',' {
				off = skipSpace(p.data, off+1) // a ',' after a value: what follows is wrong
			}
			if p.inObject() {
				want = wantKey
			}
		}
		return p.errorf(off, "unexpected %s: want %s", describe(p.data, off), want)
	}
	return p.errorf(off, "%s", msg)
}

// wantAtEnd says what a line that ends too early lacks.
func (p *parser) wantAtEnd() string {
	switch last := before(p.data, len(p.data)); {
	case last == 0 || last == ':' || last == '[' || (last == ',' && !p.inObject()):
		return "a value"
	case last == '{' || last == ',':
		return wantKey
	case !p.inObject():
		return "',' or ']' in an array"
	}
	if _, n := p.dec.StackIndex(p.dec.StackDepth()); n%2 == 1 {
		return fmt.Sprintf("':' after key %q", p.dec.StackPointer().LastToken())
	}
	return "',' or '}' in an object"
}

// inObject reports whether the innermost open value is an object.
func (p *parser) inObject() bool {
	kind, _ := p.dec.StackIndex(p.dec.StackDepth())
	return kind == '{'
}

// before is the last byte before off that is not a space (0: none).
func before(data []byte, off int) byte {
	for off > 0 && isSpace(data[off-1]) {
		off--
	}
	if off == 0 {
		return 0
	}
	return data[off-1]
}

// afterWhat names where a number lacks a digit, by the byte before.
func afterWhat(c byte) string {
	switch c {
	case '-', '.':
		return fmt.Sprintf("after '%c'", c)
	}
	return "in the exponent"
}

// tokenStart is the offset of the token after offset prev: past spaces
// and one ',' or ':'.
func tokenStart(data []byte, prev int) int {
	i := skipSpace(data, prev)
	if i < len(data) && (data[i] == ',' || data[i] == ':') {
		i = skipSpace(data, i+1)
	}
	return i
}

func isNumberByte(c byte) bool {
	return c >= '0' && c <= '9' || c == '.' || c == 'e' || c == 'E' || c == '-' || c == '+'
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipSpace(data []byte, i int) int {
	for i < len(data) && isSpace(data[i]) {
		i++
	}
	return i
}

// describe names the byte at off for a message.
func describe(data []byte, off int) string {
	if off >= len(data) {
		return "end of line"
	}
	c := data[off]
	if c < 0x20 || c >= 0x7f {
		return fmt.Sprintf("byte 0x%02x", c)
	}
	return fmt.Sprintf("character %q", rune(c))
}
