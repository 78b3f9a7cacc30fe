package jsonline

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Fields reads typed Fields of one JSON object and keeps the first error.
type Fields struct {
	Obj  *Value
	Path string // prefix for messages, e.g. "plan.enter[0]."
	Err  error  // the first error
}

// Fail keeps err unless an error was kept already.
func (f *Fields) Fail(err error) {
	if f.Err == nil {
		f.Err = err
	}
}

// RejectUnknown fails on any key that is in none of the allowed lists.
func (f *Fields) RejectUnknown(allowed ...[]string) {
	var unknown []string
	for _, k := range f.Obj.Keys {
		ok := false
		for _, list := range allowed {
			if slices.Contains(list, k) {
				ok = true
				break
			}
		}
		if !ok {
			unknown = append(unknown, f.Path+k)
		}
	}
	switch len(unknown) {
	case 0:
	case 1:
		f.Fail(fmt.Errorf("unknown field %q", unknown[0]))
	default:
		quoted := make([]string, len(unknown))
		for i, u := range unknown {
			quoted[i] = strconv.Quote(u)
		}
		f.Fail(fmt.Errorf("unknown Fields %s", strings.Join(quoted, ", ")))
	}
}

// Mistyped fails: key holds a value of the wrong kind.
func (f *Fields) Mistyped(key, want string, v *Value) {
	f.Fail(fmt.Errorf("field %q: want %s, got %s", f.Path+key, want, v.KindName()))
}

// Missing fails: key is required and absent.
func (f *Fields) Missing(key string) {
	f.Fail(fmt.Errorf("missing field %q", f.Path+key))
}

// Str reads a required string.
func (f *Fields) Str(key string) string {
	v, ok := f.Obj.Get(key)
	if !ok {
		f.Missing(key)
		return ""
	}
	if v.Kind != String {
		f.Mistyped(key, "a string", v)
		return ""
	}
	return v.Text
}

// OptStr reads an optional string; ok says whether key is present.
func (f *Fields) OptStr(key string) (string, bool) {
	if !f.Obj.Has(key) {
		return "", false
	}
	return f.Str(key), true
}

// NumberError explains why a JSON number is not an acceptable integer;
// unit is what the number counts ("" or "bytes").
func NumberError(text string, p NumberProblem, unit string) error {
	switch p {
	case NumberFractional:
		if unit != "" {
			return fmt.Errorf("%s is not a whole number of %s", text, unit)
		}
		return fmt.Errorf("%s is not a whole number (want an integer)", text)
	case NumberTooLarge:
		return fmt.Errorf("%s is too large: the largest integer accepted is %d", text, int64(math.MaxInt64))
	default:
		return fmt.Errorf("%s is too small: the smallest integer accepted is %d", text, int64(math.MinInt64))
	}
}

// OptInt reads an optional integer (nil when absent).
func (f *Fields) OptInt(key string) *int64 {
	v, ok := f.Obj.Get(key)
	if !ok {
		return nil
	}
	if v.Kind != Number {
		f.Mistyped(key, "an integer", v)
		return nil
	}
	n, p := ParseInt(v.Text)
	if p != NumberOK {
		f.Fail(fmt.Errorf("field %q: %v", f.Path+key, NumberError(v.Text, p, "")))
		return nil
	}
	return &n
}

// MaxMillis bounds every duration field in milliseconds of a script or a
// node command (the fields whose names end in _ms): one day. It keeps
// every such duration far inside the range of a time.Duration.
const MaxMillis = 24 * 60 * 60 * 1000

// OptMillis reads an optional duration in whole milliseconds, 0 to
// MaxMillis (nil when absent); zero says what 0 means ("no wait"). A
// value that is not an integer, is negative or is above MaxMillis fails,
// naming the field and the range: it is never wrapped or clamped.
func (f *Fields) OptMillis(key, zero string) *time.Duration {
	n := f.OptInt(key)
	if n == nil {
		return nil
	}
	if *n < 0 || *n > MaxMillis {
		f.Fail(fmt.Errorf("field %q: %d is outside 0 (%s) to %d (one day), in milliseconds", f.Path+key, *n, zero, MaxMillis))
		return nil
	}
	d := time.Duration(*n) * time.Millisecond
	return &d
}

// ByteValue decodes an integer or a byte string such as "40GiB".
func ByteValue(v *Value) (int64, error) {
	switch v.Kind {
	case Number:
		n, p := ParseInt(v.Text)
		if p != NumberOK {
			return 0, NumberError(v.Text, p, "bytes")
		}
		return n, nil
	case String:
		return ParseBytes(v.Text)
	}
	return 0, fmt.Errorf("want an integer or a byte string like \"40GiB\", got %s", v.KindName())
}

// Bytes reads a required byte count: an integer or a byte string like "40GiB".
func (f *Fields) Bytes(key string) int64 {
	v, ok := f.Obj.Get(key)
	if !ok {
		f.Missing(key)
		return 0
	}
	n, err := ByteValue(v)
	if err != nil {
		f.Fail(fmt.Errorf("field %q: %v", f.Path+key, err))
	}
	return n
}

// Objects decodes an array of objects; a missing key is an empty list.
func (f *Fields) Objects(key string) []*Fields {
	v, ok := f.Obj.Get(key)
	if !ok {
		return nil
	}
	if v.Kind != Array {
		f.Mistyped(key, "an array", v)
		return nil
	}
	out := make([]*Fields, 0, len(v.Items))
	for i := range v.Items {
		sub := f.Object(fmt.Sprintf("%s%s[%d]", f.Path, key, i), &v.Items[i])
		if sub == nil {
			return nil
		}
		out = append(out, sub)
	}
	return out
}

// Object wraps v, which must be a JSON object whose fields are reported
// under name.
func (f *Fields) Object(name string, v *Value) *Fields {
	if v.Kind != Object {
		f.Fail(fmt.Errorf("field %q: want an object, got %s", name, v.KindName()))
		return nil
	}
	return &Fields{Obj: v, Path: name + "."}
}

// Done merges a nested reader's error and unknown-field check into f.
func (f *Fields) Done(sub *Fields, keys ...string) {
	if sub.Err == nil {
		sub.RejectUnknown(keys)
	}
	if sub.Err != nil {
		f.Fail(sub.Err)
	}
}

// Int reads a required integer.
func (f *Fields) Int(key string) int64 {
	if !f.Obj.Has(key) {
		f.Missing(key)
		return 0
	}
	if v := f.OptInt(key); v != nil {
		return *v
	}
	return 0
}

// OptBool reads an optional boolean (false when absent).
func (f *Fields) OptBool(key string) bool {
	v, ok := f.Obj.Get(key)
	if !ok {
		return false
	}
	if v.Kind != Bool {
		f.Mistyped(key, "true or false", v)
		return false
	}
	return v.Bool
}

// Strings reads a required array of strings.
func (f *Fields) Strings(key string) []string {
	v, ok := f.Obj.Get(key)
	if !ok {
		f.Missing(key)
		return nil
	}
	if v.Kind != Array {
		f.Mistyped(key, "an array of strings", v)
		return nil
	}
	out := make([]string, 0, len(v.Items))
	for i := range v.Items {
		if v.Items[i].Kind != String {
			f.Fail(fmt.Errorf("field %q: want a string, got %s", fmt.Sprintf("%s%s[%d]", f.Path, key, i), v.Items[i].KindName()))
			return nil
		}
		out = append(out, v.Items[i].Text)
	}
	return out
}

// Tiers decodes a requirement's locations: each element is a location (a
// tier of one) or an array of equally preferred locations.
func (f *Fields) Tiers(key string) [][]string {
	v, ok := f.Obj.Get(key)
	if !ok {
		f.Missing(key)
		return nil
	}
	if v.Kind != Array {
		f.Mistyped(key, "an array of locations or arrays of locations", v)
		return nil
	}
	tiers := make([][]string, 0, len(v.Items))
	for i := range v.Items {
		it := &v.Items[i]
		where := fmt.Sprintf("%s%s[%d]", f.Path, key, i)
		switch it.Kind {
		case String:
			tiers = append(tiers, []string{it.Text})
			continue
		case Array:
			many := make([]string, 0, len(it.Items))
			for j := range it.Items {
				if it.Items[j].Kind != String {
					f.Fail(fmt.Errorf("field %q: want a location (a string), got %s", fmt.Sprintf("%s[%d]", where, j), it.Items[j].KindName()))
					return nil
				}
				many = append(many, it.Items[j].Text)
			}
			tiers = append(tiers, many)
			continue
		}
		f.Fail(fmt.Errorf("field %q: want a location or an array of locations, got %s", where, it.KindName()))
		return nil
	}
	return tiers
}
