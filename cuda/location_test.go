package cuda_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/residency-go/residency/cuda"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseLocationAccepts(t *testing.T) {
	tests := []struct {
		in      string
		kind    cuda.Kind
		ordinal int
		node    string
	}{
		{"pageable-host", cuda.KindPageableHost, 0, ""},
		{"pinned-host", cuda.KindPinnedHost, 0, ""},
		{"cuda:0", cuda.KindCUDA, 0, ""},
		{"cuda:7", cuda.KindCUDA, 7, ""},
		{"cuda:10", cuda.KindCUDA, 10, ""},
		{"cuda:999999", cuda.KindCUDA, 999999, ""},
		{"cuda:0@node-b", cuda.KindCUDA, 0, "node-b"},
		{"cuda:3@n_1.example", cuda.KindCUDA, 3, "n_1.example"},
		{"pinned-host@A", cuda.KindPinnedHost, 0, "A"},
		{"pageable-host@node-b", cuda.KindPageableHost, 0, "node-b"},
	}
	for _, tt := range tests {
		kind, ord, err := cuda.ParseLocation(tt.in)
		if err != nil {
			t.Errorf("ParseLocation(%q): unexpected error %v", tt.in, err)
			continue
		}
		if kind != tt.kind || ord != tt.ordinal {
			t.Errorf("ParseLocation(%q) = %v, %d; want %v, %d", tt.in, kind, ord, tt.kind, tt.ordinal)
		}
		n, err := cuda.ParseLocationName(tt.in)
		if err != nil {
			t.Errorf("ParseLocationName(%q): unexpected error %v", tt.in, err)
			continue
		}
		want := cuda.LocationName{Kind: tt.kind, Device: tt.ordinal, Node: tt.node}
		if n != want {
			t.Errorf("ParseLocationName(%q) = %+v, want %+v", tt.in, n, want)
		}
		if got := n.String(); got != tt.in {
			t.Errorf("ParseLocationName(%q).String() = %q, want the input back", tt.in, got)
		}
	}
}

func TestParseLocationRejects(t *testing.T) {
	for _, in := range []string{
		"", "cuda", "cuda:", "cuda:01", "cuda:00", "cuda:+1", "cuda:-1", "cuda: 1",
		"cuda:1x", "cuda:1000000", "CUDA:0", "Pinned-host", "pinned_host", "host",
		"cuda:0@", "cuda:0@a@b", "cuda:0@node b", "@node", "gpu:0", " cuda:0",
		"cuda:0 ", "cuda:٣",
	} {
		kind, ord, err := cuda.ParseLocation(in)
		if err == nil {
			t.Errorf("ParseLocation(%q) = %v, %d; want an error", in, kind, ord)
			continue
		}
		var le *cuda.LocationError
		if !errors.As(err, &le) || le.Name != in {
			t.Errorf("ParseLocation(%q) error %v: want a *LocationError naming the input", in, err)
		}
		if !errors.Is(err, cuda.ErrInvalid) {
			t.Errorf("ParseLocation(%q) error %v does not match ErrInvalid", in, err)
		}
		if !strings.Contains(err.Error(), "\""+in+"\"") && in != "" {
			t.Errorf("ParseLocation(%q) error %q does not quote the input", in, err)
		}
	}
}

func TestKindString(t *testing.T) {
	for k, want := range map[cuda.Kind]string{
		cuda.KindPageableHost: "pageable-host",
		cuda.KindPinnedHost:   "pinned-host",
		cuda.KindCUDA:         "cuda",
		cuda.Kind(9):          "LocationKind(9)",
	} {
		if got := k.String(); got != want {
			t.Errorf("Kind(%d).String() = %q, want %q", int(k), got, want)
		}
	}
}
