package jsonline

import (
	"fmt"
	"math"
	"math/big"
	"regexp"
	"strconv"
	"strings"
)

// byteUnits maps a lower-case unit suffix to its multiplier: decimal for
// KB…TB, binary for KiB…TiB.
var byteUnits = map[string]int64{
	"":    1,
	"b":   1,
	"kb":  1000,
	"mb":  1000 * 1000,
	"gb":  1000 * 1000 * 1000,
	"tb":  1000 * 1000 * 1000 * 1000,
	"kib": 1 << 10,
	"mib": 1 << 20,
	"gib": 1 << 30,
	"tib": 1 << 40,
}

var decimalRE = regexp.MustCompile(`^[+-]?[0-9]+(\.[0-9]+)?$`)

// ParseBytes parses a size such as "40GiB", "1.5 MB", "512b" or
// "4096" into an exact number of bytes. The number may be negative or zero
// (the runtime, not the parser, refuses sizes ≤ 0) and may have a
// fraction, as long as the result is a whole number of bytes.
func ParseBytes(s string) (int64, error) {
	if n, ok := quickByteString(s); ok {
		return n, nil
	}
	t := strings.TrimSpace(s)
	i := len(t)
	for i > 0 {
		c := t[i-1]
		if (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') {
			i--
			continue
		}
		break
	}
	num, unit := strings.TrimSpace(t[:i]), strings.ToLower(t[i:])
	mult, ok := byteUnits[unit]
	if !ok {
		return 0, fmt.Errorf("byte size %q: unknown unit %q (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)", s, t[i:])
	}
	if !decimalRE.MatchString(num) {
		return 0, fmt.Errorf("byte size %q: want a decimal number followed by a unit, like \"40GiB\"", s)
	}
	// Decide what the digits' count decides, so that exact arithmetic
	// runs on a few dozen digits, never on a line's million: a fraction
	// of more than 40 significant digits is never whole (a unit is at most
	// 2^40 or 10^12), an integer part of more than 19 is too large.
	sign, digits := "", num
	if num[0] == '+' || num[0] == '-' {
		sign, digits = num[:1], num[1:]
	}
	intPart, frac, _ := strings.Cut(digits, ".")
	intPart = strings.TrimLeft(intPart, "0")
	frac = strings.TrimRight(frac, "0")
	if len(frac) > 40 {
		return 0, fmt.Errorf("byte size %q is not a whole number of bytes", s)
	}
	if len(intPart) > 19 {
		if fr, _ := new(big.Rat).SetString("0." + frac + "0"); !fr.Mul(fr, new(big.Rat).SetInt64(mult)).IsInt() {
			return 0, fmt.Errorf("byte size %q is not a whole number of bytes", s)
		}
		return 0, fmt.Errorf("byte size %q is too large", s)
	}
	r, ok := new(big.Rat).SetString(sign + "0" + intPart + "." + frac + "0")
	if !ok {
		return 0, fmt.Errorf("byte size %q: %q is not a number", s, num)
	}
	r.Mul(r, new(big.Rat).SetInt64(mult))
	if !r.IsInt() {
		return 0, fmt.Errorf("byte size %q is not a whole number of bytes", s)
	}
	n := r.Num()
	if !n.IsInt64() {
		return 0, fmt.Errorf("byte size %q is too large", s)
	}
	return n.Int64(), nil
}

// quickByteString parses the common forms ("4096", "64KiB", "1MB": a
// non-negative whole number of at most 15 digits and a unit) without the
// general path's regular expression and rationals; ok is false for
// anything else, which the general path then decides.
func quickByteString(s string) (int64, bool) {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	if i == 0 || i > 15 {
		return 0, false
	}
	n, err := strconv.ParseInt(s[:i], 10, 64)
	if err != nil {
		return 0, false
	}
	unit := s[i:]
	var mult int64
	switch unit {
	case "", "B", "b":
		mult = 1
	case "KiB":
		mult = 1 << 10
	case "MiB":
		mult = 1 << 20
	case "GiB":
		mult = 1 << 30
	case "KB":
		mult = 1000
	case "MB":
		mult = 1000 * 1000
	case "GB":
		mult = 1000 * 1000 * 1000
	default:
		return 0, false
	}
	if n > math.MaxInt64/mult {
		return 0, false
	}
	return n * mult, true
}

// FormatBytes renders n for people: exact bytes below 1 KiB, otherwise a
// binary unit with up to two decimals ("1.50 MiB").
func FormatBytes(n int64) string {
	abs := n
	if abs < 0 {
		abs = -abs
	}
	units := []string{"KiB", "MiB", "GiB", "TiB"}
	if abs < 1<<10 {
		return fmt.Sprintf("%d B", n)
	}
	v, u := float64(n)/1024, 0
	for u < len(units)-1 && (abs>>(10*(u+1))) >= 1<<10 {
		v /= 1024
		u++
	}
	s := fmt.Sprintf("%.2f", v)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s + " " + units[u]
}

// BytesText renders a byte figure for a table: the size for people and,
// from 1 KiB on, the exact integer too ("26 GiB (27917287424)"), so that
// a figure can be checked against the script and the JSON output.
func BytesText(n int64) string {
	if n > -1<<10 && n < 1<<10 {
		return FormatBytes(n)
	}
	return FormatBytes(n) + " (" + strconv.FormatInt(n, 10) + ")"
}
