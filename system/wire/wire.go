// Package wire holds the JSON forms of the runtime's records, each
// declared once: the replay output's (docs/replay.md) snapshot,
// transition, decision, explanation and plan shapes and its statistics,
// which package replay writes, package diagnose reads back from a replay
// output and writes in a diagnosis, and package liveview serves. The
// types are exported: a program that reads the replay output or the live
// view's feeds may decode into them.
//
// Field order is the order of the contract (encoding/json keeps struct
// order). A string that the runtime leaves empty because it does not
// apply is written as null.
package wire

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"

	"github.com/residency-go/residency/cuda"
)

// Field is one member of an ordered JSON object.
type Field struct {
	Key   string
	Value any
}

// Object marshals as a JSON object with keys in slice order.
type Object []Field

// MarshalJSON writes the fields in order.
func (o Object) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, f := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, err := Marshal(f.Key)
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		v, err := Marshal(f.Value)
		if err != nil {
			return nil, err
		}
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// Marshal is json.Marshal without HTML escaping: messages such as
// "used 3 + requested 6 > budget 8" stay readable.
func Marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return escapeJSONControls(bytes.TrimSuffix(b.Bytes(), []byte("\n"))), nil
}

// escapeJSONControls escapes DEL, the C1 control characters (U+0080 to
// U+009F) and the bidirectional overrides (U+202A–U+202E, U+2066–U+2069),
// which encoding/json leaves raw but a terminal may obey (U+009B starts
// an escape sequence) or use to show text out of order. They can only
// occur inside strings, so the result is the same JSON value. C0 controls
// are escaped by the encoder.
func escapeJSONControls(b []byte) []byte {
	i := 0
	for i < len(b) && b[i] != 0x7f && b[i] != 0xc2 && b[i] != 0xe2 {
		i++
	}
	if i == len(b) {
		return b
	}
	out := make([]byte, 0, len(b)+16)
	out = append(out, b[:i]...)
	for ; i < len(b); i++ {
		switch {
		case b[i] == 0x7f:
			out = append(out, `\u007f`...)
		case b[i] == 0xc2 && i+1 < len(b) && b[i+1] >= 0x80 && b[i+1] <= 0x9f:
			out = append(out, fmt.Sprintf(`\u%04x`, b[i+1])...)
			i++
		case b[i] == 0xe2 && i+2 < len(b) && bidiOrSeparator(decodeRune3(b[i:i+3])):
			out = append(out, fmt.Sprintf(`\u%04x`, decodeRune3(b[i:i+3]))...)
			i += 2
		default:
			out = append(out, b[i])
		}
	}
	return out
}

// bidiOrSeparator: the line and paragraph separators and the
// bidirectional overrides, which a terminal may obey.
func bidiOrSeparator(c rune) bool {
	return c == '\u2028' || c == '\u2029' || (c >= '\u202a' && c <= '\u202e') || (c >= '\u2066' && c <= '\u2069')
}

// decodeRune3 decodes a three-byte UTF-8 sequence (or returns 0).
func decodeRune3(b []byte) rune {
	if b[1]&0xc0 != 0x80 || b[2]&0xc0 != 0x80 {
		return 0
	}
	return rune(b[0]&0x0f)<<12 | rune(b[1]&0x3f)<<6 | rune(b[2]&0x3f)
}

// LocationBytes is bytes per location, written as an object in the
// order of a snapshot's locations (SortLocations).
type LocationBytes map[string]int64

// MarshalJSON writes m's locations in order.
func (m LocationBytes) MarshalJSON() ([]byte, error) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	SortLocations(keys)
	o := make(Object, len(keys))
	for i, k := range keys {
		o[i] = Field{k, m[k]}
	}
	return o.MarshalJSON()
}

// Nullable is s, or nil (JSON null) for an empty string.
func Nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// Text is *p, or "" for nil.
func Text(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// LocationLess orders location names as snapshots do: pageable-host,
// pinned-host, cuda:0, cuda:1, … (numeric), node-qualified names after
// unqualified ones, by node. Malformed names sort last, by string.
func LocationLess(a, b string) bool {
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

// SortLocations sorts location names in the order of a snapshot's
// locations: pageable-host, pinned-host, cuda:0, cuda:1, … (numeric).
func SortLocations(names []string) {
	sort.Slice(names, func(i, j int) bool { return LocationLess(names[i], names[j]) })
}
