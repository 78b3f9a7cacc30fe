package jsonline

import (
	"testing"
)

func TestParseByteString(t *testing.T) {
	good := map[string]int64{
		"0": 0, "4096": 4096, "512B": 512, "512 b": 512,
		"1KB": 1000, "1kb": 1000, "1MB": 1000000, "2GB": 2000000000, "1TB": 1000000000000,
		"1KiB": 1024, "1kib": 1024, "3MiB": 3 << 20, "40GiB": 40 << 30, "1TiB": 1 << 40,
		"1.5MiB": 3 << 19, "0.5KB": 500, "-1KiB": -1024, " 2 GiB ": 2 << 30,
	}
	for in, want := range good {
		got, err := ParseBytes(in)
		if err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "GiB", "1.3B", "1e3", "0x10", "1/2KiB", "12 parsecs", "1 Gib bytes", "99999999TiB", "1..5MB"} {
		if got, err := ParseBytes(in); err == nil {
			t.Errorf("ParseBytes(%q) = %d, want an error", in, got)
		}
	}
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1 KiB", 1536: "1.5 KiB", 5 << 20: "5 MiB", 80 << 30: "80 GiB", 3 << 40: "3 TiB"} {
		if got := FormatBytes(n); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
