package soft_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/soft"
	"go.uber.org/goleak"
)

type ctxKey struct{}

func TestLoadWritesDirectlyIntoTheBuffer(t *testing.T) {
	defer goleak.VerifyNone(t)
	b := newBackend(t, soft.Config{})
	defer mustClose(t, b)
	ctx := context.WithValue(context.Background(), ctxKey{}, "mine")
	buf := mustAlloc(t, b, "cuda:0", 300)
	want := pattern(30, 300)
	err := b.Load(ctx, buf, "cuda:0", func(ctx context.Context, dst []byte) error {
		if ctx.Value(ctxKey{}) != "mine" {
			t.Error("the loader did not get the caller's context")
		}
		if len(dst) != 300 {
			t.Errorf("loader got %d bytes, want 300", len(dst))
		}
		copy(dst, want)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	assertBytes(t, "loaded buffer", mustRead(t, b, buf), want)
}

func TestLoaderErrorIsWrapped(t *testing.T) {
	defer goleak.VerifyNone(t)
	b := newBackend(t, soft.Config{})
	defer mustClose(t, b)
	buf := mustAlloc(t, b, "pinned-host", 16)
	cause := errors.New("source unreadable")
	err := b.Load(context.Background(), buf, "cuda:1", func(context.Context, []byte) error { return cause })
	if !errors.Is(err, cause) {
		t.Fatalf("Load = %v, want it to wrap the loader's error", err)
	}
	if !strings.Contains(err.Error(), "cuda:1") || !strings.Contains(err.Error(), "source unreadable") {
		t.Fatalf("message %q should name the target and the cause", err)
	}
	var p *cuda.LoaderPanicError
	if errors.As(err, &p) {
		t.Fatal("a returned error was reported as a panic")
	}
}

func TestLoaderPanicIsRecovered(t *testing.T) {
	defer goleak.VerifyNone(t)
	b := newBackend(t, soft.Config{})
	defer mustClose(t, b)
	ctx := context.Background()
	buf := mustAlloc(t, b, "cuda:0", 16)

	err := b.Load(ctx, buf, "", func(context.Context, []byte) error { panic("boom") })
	var p *cuda.LoaderPanicError
	if !errors.As(err, &p) || p.Value != "boom" {
		t.Fatalf("Load with a panicking loader = %v, want *LoaderPanicError with value boom", err)
	}
	if !strings.Contains(string(p.Stack), "TestLoaderPanicIsRecovered") {
		t.Fatal("the panic's stack does not show the loader")
	}

	cause := errors.New("typed panic")
	err = b.Load(ctx, buf, "", func(context.Context, []byte) error { panic(cause) })
	if !errors.As(err, &p) || !errors.Is(err, cause) {
		t.Fatalf("Load with a loader panicking with an error = %v", err)
	}

	// The buffer is not left locked: the backend still serves it.
	mustWrite(t, b, buf, pattern(31, 16))
	assertBytes(t, "buffer after a panicking loader", mustRead(t, b, buf), pattern(31, 16))
}
