package jsonline

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestStringsMustBeUTF8: a string with a byte that is not UTF-8, or an
// escaped surrogate that is not half of a pair, is refused naming the
// column, where encoding/json would turn both into U+FFFD, so that "a\xff"
// and "a\xfe" read as the same name. Valid text, escapes and surrogate
// pairs read exactly.
func TestStringsMustBeUTF8(t *testing.T) {
	for _, c := range []struct{ line, want string }{
		{"{\"n\":\"a\xff\"}", "column 8: bad string: byte 0xff is not valid UTF-8"},
		{"{\"n\":\"a\xfe\"}", "column 8: bad string: byte 0xfe is not valid UTF-8"},
		{"{\"n\":\"\xc3\"}", "byte 0xc3 is not valid UTF-8"},
		{"{\"n\":\"\xed\xa0\x80\"}", "byte 0xed is not valid UTF-8"}, // an encoded surrogate
		{"{\"n\":\"\\u00e9\xff\"}", "byte 0xff is not valid UTF-8"},
		{`{"n":"\ud800"}`, `column 7: bad string: \ud800 is half of a UTF-16 surrogate pair`},
		{`{"n":"\udc00"}`, `\udc00 is half of a UTF-16 surrogate pair`},
		{`{"n":"\ud800\u0041"}`, `\ud800 is half`},
		{`{"n":"x\uDBFF"}`, `column 8: bad string: \uDBFF is half`},
		{"{\"n\xff\":1}", "byte 0xff is not valid UTF-8"},
	} {
		_, err := Parse([]byte(c.line))
		require.Error(t, err, "%q", c.line)
		assert.Contains(t, err.Error(), c.want, "%q", c.line)
	}
	for line, want := range map[string]string{
		`{"n":"é"}`:                "é",
		`{"n":"\u00e9"}`:           "é",
		`{"n":"\ud83d\ude00"}`:     "😀",
		`{"n":"\\ud800"}`:          `\ud800`,
		`{"n":"\ufffd"}`:           "\ufffd",
		"{\"n\":\"\xef\xbf\xbd\"}": "\ufffd",
		`{"n":"tab\t"}`:            "tab\t",
	} {
		v, err := Parse([]byte(line))
		require.NoError(t, err, "%q", line)
		got, ok := v.Get("n")
		require.True(t, ok)
		assert.Equal(t, want, got.Text, "%q", line)
	}
}
