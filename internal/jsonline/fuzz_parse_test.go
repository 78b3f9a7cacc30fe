package jsonline

import (
	"encoding/json"
	"errors"
	"testing"
)

// FuzzParse: any line is read or refused with a *SyntaxError, never a
// panic; a line read is valid JSON.
func FuzzParse(f *testing.F) {
	for _, s := range []string{`{"op":"snapshot"}`, `{"a":[1,{"b":"\u00e9"}],"c":null}`, `{"a":1,"a":2}`, `[1,]`, "{\"n\":\"\xff\"}", `"\ud800"`, `{"a":-1.5e3}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		_, err := Parse(line)
		var se *SyntaxError
		if err != nil && !errors.As(err, &se) {
			t.Fatalf("%q: %T %v", line, err, err)
		}
		if err == nil && !json.Valid(line) {
			t.Fatalf("%q read, but encoding/json finds it invalid", line)
		}
	})
}
