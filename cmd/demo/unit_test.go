package main

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/system"
)

func TestParseByteString(t *testing.T) {
	good := map[string]int64{
		"0": 0, "4096": 4096, "512B": 512, "512 b": 512,
		"1KB": 1000, "1kb": 1000, "1MB": 1000000, "2GB": 2000000000, "1TB": 1000000000000,
		"1KiB": 1024, "1kib": 1024, "3MiB": 3 << 20, "40GiB": 40 << 30, "1TiB": 1 << 40,
		"1.5MiB": 3 << 19, "0.5KB": 500, "-1KiB": -1024, " 2 GiB ": 2 << 30,
	}
	for in, want := range good {
		got, err := parseByteString(in)
		if err != nil || got != want {
			t.Errorf("parseByteString(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "GiB", "1.3B", "1e3", "0x10", "1/2KiB", "12 parsecs", "1 Gib bytes", "99999999TiB", "1..5MB"} {
		if got, err := parseByteString(in); err == nil {
			t.Errorf("parseByteString(%q) = %d, want an error", in, got)
		}
	}
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1 KiB", 1536: "1.5 KiB", 5 << 20: "5 MiB", 80 << 30: "80 GiB", 3 << 40: "3 TiB"} {
		if got := formatBytes(n); got != want {
			t.Errorf("formatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestLocationOrder(t *testing.T) {
	in := []string{"cuda:10", "cuda:0@b", "pinned-host", "cuda:2", "pageable-host", "cuda:0@a", "pageable-host@a"}
	sortLocations(in)
	want := fmt.Sprint([]string{"pageable-host", "pinned-host", "cuda:2", "cuda:10", "pageable-host@a", "cuda:0@a", "cuda:0@b"})
	if got := fmt.Sprint(in); got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

// TestClassify: the outermost residency error names the type, so a
// PlanExecutionError is not mistaken for its cause; anything else is
// "Error".
func TestClassify(t *testing.T) {
	cause := &system.BudgetError{Location: "cuda:0"}
	pe := &system.PlanExecutionError{Phase: "reserve", FailedActionIndex: -1, FailedReservationIndex: 0,
		FailedReservation: &system.ReservationSpec{Name: "r", Location: "cuda:0", Bytes: 1}, Cause: cause}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{pe, "ResidencyPlanExecutionError"},
		{fmt.Errorf("wrapped: %w", pe), "ResidencyPlanExecutionError"},
		{cause, "ResidencyBudgetError"},
		{&system.SearchLimitError{}, "ResidencySearchLimitError"},
		{&system.StaleStateError{}, "ResidencyStaleStateError"},
		{&system.PlanError{}, "ResidencyPlanError"},
		{&system.InUseError{}, "ResidencyInUseError"},
		{&system.UnavailableError{}, "ResidencyUnavailableError"},
		{&system.InvalidInputError{}, "InvalidInput"},
		{context.DeadlineExceeded, "Error"},
		{errors.New("boom"), "Error"},
	} {
		if got, _ := classify(tc.err); got != tc.want {
			t.Errorf("classify(%v) = %s, want %s", tc.err, got, tc.want)
		}
	}
	b, err := marshal((*runner)(nil).errorObject(pe))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"type":"ResidencyPlanExecutionError","message":"` + pe.Error() + `","phase":"reserve","failed_action":null,"failed_action_index":null,` +
		`"failed_reservation":{"name":"r","location":"cuda:0","bytes":1},"failed_reservation_index":0,"partial_report":{"transitions":[]},` +
		`"cause":{"type":"ResidencyBudgetError","message":"` + cause.Error() + `","location":"cuda:0","budget_bytes":0,"used_bytes":0,"reserved_bytes":0,"requested_bytes":0}}`
	if string(b) != want {
		t.Errorf("got  %s\nwant %s", b, want)
	}
}

// TestTruncatingBackend: large buffers report their full size but keep
// only the first bytes; copies, loads and faults still work.
func TestTruncatingBackend(t *testing.T) {
	ctx := context.Background()
	b, err := newReplayBackend([]string{"pinned-host", "cuda:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const size = 64 << 30
	src, err := b.Allocate(ctx, "pinned-host", size)
	if err != nil {
		t.Fatal(err)
	}
	dst, err := b.Allocate(ctx, "cuda:0", size)
	if err != nil {
		t.Fatal(err)
	}
	if src.Size() != size || src.Location() != "pinned-host" {
		t.Fatalf("buffer %d at %s", src.Size(), src.Location())
	}
	if err := b.Load(ctx, src, "", deterministicLoader("v")); err != nil {
		t.Fatal(err)
	}
	s, err := b.NewStream("cuda:0")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.CopyAsync(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := b.Read(ctx, dst)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, replayBufferLimit)
	fill("v", 0, want)
	if string(got) != string(want) {
		t.Errorf("the kept bytes were not copied")
	}
	b.Faults().Arm(cuda.FaultAlloc, "cuda:0")
	if _, err := b.Allocate(ctx, "cuda:0", 10); !errors.Is(err, cuda.ErrInjectedFault) {
		t.Errorf("armed alloc fault: %v", err)
	}
	small, _ := b.Allocate(ctx, "cuda:0", 10)
	if err := s.CopyAsync(small, src); !errors.Is(err, cuda.ErrInvalid) {
		t.Errorf("copy of different sizes: %v", err)
	}
	for _, buf := range []cuda.Buffer{src, dst, small} {
		if err := b.Free(buf); err != nil {
			t.Error(err)
		}
	}
}

// TestFill: the deterministic content does not depend on how a buffer is
// split, and differs between values.
func TestFill(t *testing.T) {
	whole := make([]byte, 100)
	fill("a", 0, whole)
	part := make([]byte, 37)
	fill("a", 13, part)
	if string(part) != string(whole[13:50]) {
		t.Error("fill at an offset differs from the whole")
	}
	other := make([]byte, 100)
	fill("b", 0, other)
	if string(other) == string(whole) {
		t.Error("two values got the same bytes")
	}
}
