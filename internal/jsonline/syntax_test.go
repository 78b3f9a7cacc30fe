package jsonline

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSyntaxMessages: each way a line can be malformed is refused with
// the column of the byte at fault (1-based), what was found there and
// what was wanted, in the line's words: never the decoder's.
func TestSyntaxMessages(t *testing.T) {
	for _, c := range []struct{ line, want string }{
		{"not json", "column 1: unexpected character 'n': want a value (object, array, string, number, true, false or null)"},
		{"{\"a\":1,\"a\":2}", "column 8: duplicate key \"a\" in one object (each key may appear once)"},
		{"{\"p\":{\"q\":1,\"q\":2}}", "column 13: duplicate key \"q\" in one object (each key may appear once)"},
		{"{\"a/b\":1,\"a\\/b\":2}", "column 10: duplicate key \"a/b\" in one object (each key may appear once)"},
		{"{\"op\":\"snap", "column 7: unterminated string (no closing '\"' on this line)"},
		{"\"abc", "column 1: unterminated string (no closing '\"' on this line)"},
		{"{\"e\":\"o\x01k\"}", "column 8: control character 0x01 inside a string (write it as an escape such as \\u0001)"},
		{"{\"a\":1} {\"b\":2}", "column 9: unexpected character '{' after the end of the JSON value"},
		{"{\"a\":01}", "column 7: bad number \"01\""},
		{"{\"a\":1.}", "column 8: bad number: want a digit after '.'"},
		{"{\"a\":-}", "column 7: bad number: want a digit after '-'"},
		{"{\"a\":1e}", "column 8: bad number: want a digit in the exponent"},
		{"{\"a\" 1}", "column 6: unexpected character '1': want ':' after key \"a\""},
		{"{\"a\":}", "column 6: unexpected character '}': want a value (object, array, string, number, true, false or null)"},
		{"{\"a\":1 \"b\"}", "column 8: unexpected character '\"': want ',' or '}' in an object"},
		{"[1 2]", "column 4: unexpected character '2': want ',' or ']' in an array"},
		{"{1:2}", "column 2: unexpected character '1': want a key (a string in double quotes)"},
		{"{\"a\":tru}", "column 6: unexpected character 't': want a value (object, array, string, number, true, false or null)"},
		{"{\"op\":\"snapshot\"", "column 17: unexpected end of line: want ',' or '}' in an object"},
		{"\ufeff{}", "column 1: unexpected byte 0xef: want a value (object, array, string, number, true, false or null)"},
		{"{\"a\":1,}", "column 8: unexpected character '}': want a key (a string in double quotes)"},
		{"[1,]", "column 4: unexpected character ']': want a value (object, array, string, number, true, false or null)"},
		{"{,}", "column 2: unexpected character ',': want a key (a string in double quotes)"},
		{"[,]", "column 2: unexpected character ',': want a value (object, array, string, number, true, false or null)"},
		{"", "column 1: unexpected end of line: want a value"},
		{"{\"a\":", "column 6: unexpected end of line: want a value"},
		{"{\"a\"", "column 5: unexpected end of line: want ':' after key \"a\""},
		{"[1,", "column 4: unexpected end of line: want a value"},
		{"{\"a\":1,", "column 8: unexpected end of line: want a key (a string in double quotes)"},
		{"{\"op\":\"snap\\qshot\"}", "column 12: bad string: invalid escape sequence `\\q`"},
		{strings.Repeat("[", 40), "column 33: nested more than 32 levels deep"},
		{`{"a":` + strings.Repeat(`{"a":`, 40), "column 161: nested more than 32 levels deep"},
	} {
		_, err := Parse([]byte(c.line))
		require.Error(t, err, "%q", c.line)
		assert.Equal(t, c.want, err.Error(), "%q", c.line)
	}
}
