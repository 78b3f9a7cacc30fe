package cuda_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/residency-go/residency/cuda"
)

func TestErrorTypesMatchTheirSentinels(t *testing.T) {
	oom := fmt.Errorf("wrapped: %w", &cuda.OutOfMemoryError{Location: "cuda:0", Requested: 10, Free: 3})
	if !errors.Is(oom, cuda.ErrOutOfMemory) || errors.Is(oom, cuda.ErrInjectedFault) {
		t.Errorf("OutOfMemoryError matches the wrong sentinels: %v", oom)
	}
	var o *cuda.OutOfMemoryError
	if !errors.As(oom, &o) || o.Location != "cuda:0" || o.Requested != 10 || o.Free != 3 {
		t.Errorf("errors.As(OutOfMemoryError) = %+v", o)
	}
	if want := "cuda: out of memory at cuda:0: requested 10 bytes, 3 free"; o.Error() != want {
		t.Errorf("message %q, want %q", o.Error(), want)
	}

	inj := &cuda.InjectedFaultError{Kind: cuda.FaultAlloc, Location: "cuda:0"}
	if want := "soft backend: injected alloc fault at cuda:0"; inj.Error() != want {
		t.Errorf("message %q, want %q", inj.Error(), want)
	}
	if !errors.Is(inj, cuda.ErrInjectedFault) || errors.Is(inj, cuda.ErrOutOfMemory) {
		t.Error("InjectedFaultError matches the wrong sentinels")
	}

	cause := errors.New("disk on fire")
	p := &cuda.LoaderPanicError{Value: cause}
	if !errors.Is(p, cause) {
		t.Error("LoaderPanicError with an error value does not unwrap to it")
	}
	if (&cuda.LoaderPanicError{Value: "boom"}).Unwrap() != nil {
		t.Error("LoaderPanicError with a string value unwraps to something")
	}
	if want := "cuda: loader panicked: boom"; (&cuda.LoaderPanicError{Value: "boom"}).Error() != want {
		t.Errorf("message %q", (&cuda.LoaderPanicError{Value: "boom"}).Error())
	}

	if le := (&cuda.LocationError{Name: "gpu:0", Reason: "x"}); !errors.Is(le, cuda.ErrInvalid) || errors.Is(le, cuda.ErrUnknownLocation) {
		t.Error("LocationError matches the wrong sentinels")
	}
}

func TestMemInfoUnlimited(t *testing.T) {
	if !(cuda.MemInfo{}).Unlimited() || (cuda.MemInfo{TotalBytes: 1}).Unlimited() {
		t.Error("Unlimited is wrong")
	}
}
