package system

import (
	"bytes"
	"context"
	"testing"
)

func TestSmokeRuntime(t *testing.T) {
	ctx := context.Background()
	s, err := startSoft(t, ctx, Options{Locations: []LocationConfig{NoLimit("pageable-host"), Limit("pinned-host", 1<<20), Limit("cuda:0", 1<<20)}})
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte{7, 8, 9}, 100)
	h, err := s.Register(ctx, Value{Name: "w", Bytes: int64(len(data)), At: "pageable-host", Data: data})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Place(ctx, h, "cuda:0"); err != nil {
		t.Fatal(err)
	}
	got, err := s.Read(ctx, h, "cuda:0")
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read %v %v", err, len(got))
	}
	snap, _ := s.Snapshot(ctx)
	t.Logf("%+v", snap)
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
}
