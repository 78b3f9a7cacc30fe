package jsonline

import (
	"encoding/json"
	"math/big"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// FuzzByteSize: byte fields of a script are a JSON number or a byte
// string ("40GiB"). Whatever the text: parseByteString never panics,
// agrees with an independent model (exact rational arithmetic on the
// decimal digits), takes its fast path only when it agrees with the
// general one, and finishes in bounded time (the digits' count decides a
// too large or fractional size before any arithmetic); a JSON number's
// integer value (jsonInt) agrees with a rational model; the formatters
// never panic. Seeds: every byte field of cmd/demo/testdata/*.jsonl (the replay scripts), and
// edge cases.
//
//	go test -run '^$' -fuzz '^FuzzByteSize$' -fuzztime 10m ./internal/jsonline/
func FuzzByteSize(f *testing.F) {
	for _, s := range []string{"0", "1", "-1", "1.5KiB", "1.3B", "40GiB", "1 MB", " 2 tb ", "+7kib", "9223372036854775807",
		"9223372036854775808", "8EiB", "8388608TiB", "8388607.99999999TiB", "0.0000000001KB", "1e3", "1.5e3", "-0", "1e30",
		"2.50e1", "1E-2", "0x10", "", ".5KB", "5.KB", "١٢KB", "1\u00a0KB"} {
		f.Add(s)
	}
	for _, field := range scriptByteFields(f) {
		f.Add(field)
	}
	f.Fuzz(func(t *testing.T, s string) {
		start := time.Now()
		got, err := ParseBytes(s)
		if d := time.Since(start); d > time.Second && !raceEnabled {
			t.Errorf("ParseBytes(%d bytes) took %v", len(s), d)
		}
		want, ok := modelByteString(s)
		switch {
		case ok && err != nil:
			t.Fatalf("ParseBytes(%q) = %v, the model says %d", s, err, want)
		case !ok && err == nil:
			t.Fatalf("ParseBytes(%q) = %d, the model refuses it", s, got)
		case ok && got != want:
			t.Fatalf("ParseBytes(%q) = %d, the model says %d", s, got, want)
		}
		if err != nil && !strings.Contains(err.Error(), "byte size") {
			t.Fatalf("ParseBytes(%q): the message does not say what it read: %v", s, err)
		}
		if q, ok := quickByteString(s); ok && (err != nil || q != got) {
			t.Fatalf("quickByteString(%q) = %d, the general path %d, %v", s, q, got, err)
		}
		if err == nil {
			if back, err := ParseBytes(strconv.FormatInt(got, 10)); err != nil || back != got {
				t.Fatalf("%d does not read back: %d, %v", got, back, err)
			}
			_ = BytesText(got)
		}
		// The same text as a JSON number.
		if isJSONNumber(s) {
			n, p := ParseInt(s)
			if mn, mp, known := modelJSONInt(s); known && (mp != p || mp == NumberOK && mn != n) {
				t.Fatalf("ParseInt(%q) = %d, %v; the model says %d, %v", s, n, p, mn, mp)
			}
		}
	})
}

// scriptByteFields returns the byte fields of the test scripts as text.
func scriptByteFields(f *testing.F) []string {
	var out []string
	for _, script := range fuzzScripts(f) {
		for _, line := range strings.Split(string(script), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) != nil {
				continue
			}
			for _, k := range []string{"bytes", "peak", "resident", "slot_bytes", "row_bytes", "clone_budget", "device_bytes"} {
				switch v := m[k].(type) {
				case string:
					out = append(out, v)
				case float64:
					out = append(out, strconv.FormatFloat(v, 'f', -1, 64))
				}
			}
		}
	}
	return out
}

var modelUnits = map[string]int64{"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
	"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}

// modelByteString is the byte-string rule of docs/replay.md, written
// plainly: optional blanks, an optional sign, digits with an optional
// fraction, optional blanks, a unit in any case, optional blanks; the
// value must be a whole number of bytes within int64.
func modelByteString(s string) (int64, bool) {
	t := strings.TrimSpace(s)
	end := len(t)
	for end > 0 && (t[end-1] >= 'a' && t[end-1] <= 'z' || t[end-1] >= 'A' && t[end-1] <= 'Z') {
		end--
	}
	mult, ok := modelUnits[strings.ToLower(t[end:])]
	if !ok {
		return 0, false
	}
	num := strings.TrimSpace(t[:end])
	neg := false
	if num != "" && (num[0] == '+' || num[0] == '-') {
		neg = num[0] == '-'
		num = num[1:]
	}
	ip, fp, hasDot := strings.Cut(num, ".")
	allDigits := func(x string) bool {
		for i := 0; i < len(x); i++ {
			if x[i] < '0' || x[i] > '9' {
				return false
			}
		}
		return x != ""
	}
	if !allDigits(ip) || hasDot && !allDigits(fp) {
		return 0, false
	}
	fp = strings.TrimRight(fp, "0")
	ip = strings.TrimLeft(ip, "0")
	if len(fp) > 60 || len(ip) > 40 { // far beyond any whole int64 (too slow otherwise)
		return 0, false
	}
	// value = (ip·10^len(fp) + fp) · mult / 10^len(fp)
	v, _ := new(big.Int).SetString("0"+ip+fp, 10)
	v.Mul(v, big.NewInt(mult))
	den := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(len(fp))), nil)
	q, r := new(big.Int).QuoRem(v, den, new(big.Int))
	if r.Sign() != 0 {
		return 0, false
	}
	if neg {
		q.Neg(q)
	}
	if !q.IsInt64() {
		return 0, false
	}
	return q.Int64(), true
}

// isJSONNumber reports whether s is exactly one JSON number.
func isJSONNumber(s string) bool {
	if s == "" || !(s[0] == '-' || s[0] >= '0' && s[0] <= '9') || !json.Valid([]byte(s)) {
		return false
	}
	var n json.Number
	return json.Unmarshal([]byte(s), &n) == nil && string(n) == s
}

// modelJSONInt is jsonInt's rule on exact rationals, for exponents small
// enough to compute (known is false otherwise).
func modelJSONInt(s string) (n int64, p NumberProblem, known bool) {
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		e, err := strconv.Atoi(strings.TrimPrefix(s[i+1:], "+"))
		if err != nil || e > 400 || e < -400 {
			return 0, 0, false
		}
	}
	r, ok := new(big.Rat).SetString(s)
	if !ok {
		return 0, 0, false
	}
	switch {
	case !r.IsInt():
		return 0, NumberFractional, true
	case r.Num().IsInt64():
		return r.Num().Int64(), NumberOK, true
	case r.Sign() < 0:
		return 0, NumberTooSmall, true
	}
	return 0, NumberTooLarge, true
}

// TestByteStringLongDigits: a byte string of a million digits (a line
// may hold 1 MiB) is decided from its digits' count, not by exact
// arithmetic on all of them (2.7 s each before, so a script of such lines
// took minutes to check); the answers are the same.
func TestByteStringLongDigits(t *testing.T) {
	long := strings.Repeat("9", 1<<20)
	for _, tc := range []struct{ in, want string }{
		{long + "B", "is too large"},
		{"1." + strings.Repeat("5", 1<<20) + "GiB", "is not a whole number of bytes"},
		{long + ".5B", "is not a whole number of bytes"},
		{long + ".5KiB", "is too large"},
		{"0." + strings.Repeat("0", 1<<20) + "1KiB", "is not a whole number of bytes"},
	} {
		start := time.Now()
		_, err := ParseBytes(tc.in)
		took := time.Since(start)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%.20s…: %v, want %q", tc.in, err, tc.want)
		}
		if !raceEnabled && took > 500*time.Millisecond {
			t.Errorf("%.20s…: took %v", tc.in, took)
		}
	}
	n, err := ParseBytes(strings.Repeat("0", 1<<20) + "1.5" + strings.Repeat("0", 1<<20) + "KiB")
	if err != nil || n != 1536 {
		t.Errorf("leading and trailing zeros: %d, %v", n, err)
	}
}

// fuzzScripts returns the replay scripts of cmd/demo/testdata/*.jsonl,
// whose byte fields seed FuzzByteSize.
func fuzzScripts(f *testing.F) [][]byte {
	paths, err := filepath.Glob(filepath.Join("..", "..", "cmd", "demo", "testdata", "*.jsonl"))
	if err != nil || len(paths) == 0 {
		f.Fatalf("no scripts in cmd/demo/testdata: %v", err)
	}
	var out [][]byte
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}
