package cuda_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/residency-go/residency/budget"
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

	inj := &cuda.InjectedFaultError{Kind: cuda.FaultAlloc, Location: "cuda:0", Backend: "soft backend"}
	if want := "soft backend: injected alloc fault at cuda:0"; inj.Error() != want {
		t.Errorf("message %q, want %q", inj.Error(), want)
	}
	if want := "cuda: injected copy fault at cuda:1"; (&cuda.InjectedFaultError{Kind: cuda.FaultCopy, Location: "cuda:1"}).Error() != want {
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

	_, err := cuda.ParseLocationName("gpu:0")
	var le *cuda.LocationError
	if !errors.As(err, &le) || !errors.Is(err, cuda.ErrInvalid) || errors.Is(err, cuda.ErrUnknownLocation) {
		t.Error("LocationError matches the wrong sentinels")
	}
	if !errors.Is(err, budget.ErrInvalidInput) {
		t.Error("LocationError does not unwrap to the ledger's parse error")
	}
	if want := `cuda: malformed location "gpu:0": want pageable-host, pinned-host or cuda:N`; err.Error() != want {
		t.Errorf("message %q, want %q", err.Error(), want)
	}
}

func TestMemInfoUnlimited(t *testing.T) {
	if !(cuda.MemInfo{}).Unlimited() || (cuda.MemInfo{TotalBytes: 1}).Unlimited() {
		t.Error("Unlimited is wrong")
	}
}
