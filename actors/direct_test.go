package actors

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/messages"
)

// sinkRecorder is a ReplySink that keeps what it is given; its caller is
// never parked, so no Wake is due.
type sinkRecorder struct {
	got   chan any
	woken int
}

func (s *sinkRecorder) Deliver(m any) bool { s.got <- m; return false }
func (s *sinkRecorder) Wake()              { s.woken++ }

func (s *sinkRecorder) next(t *testing.T) any {
	t.Helper()
	select {
	case m := <-s.got:
		return m
	case <-time.After(waitFor):
		t.Fatalf("no reply within %s", waitFor)
		return nil
	}
}

// A lease request sent with its reply plumbing is answered in the
// requester's own storage, handed to its sink (nothing goes to ReplyTo),
// and reported to AfterLedger under the plain request's name; without a
// sink the answer goes to ReplyTo, in that storage too.
func TestLeaseRequestsAnswerThroughTheirSink(t *testing.T) {
	var mu sync.Mutex
	var kinds []string
	h := startEngine(t, withHooks(Hooks{AfterLedger: func(kind string) {
		mu.Lock()
		kinds = append(kinds, kind)
		mu.Unlock()
	}}))
	hd := h.mustRegister(budget.ValueSpec{Name: "w", Bytes: 64, At: locHost}, nil)
	box := h.box()
	sink := &sinkRecorder{got: make(chan any, 1)}

	var leaseRep messages.LeaseReply
	h.send(&AcquireRequest{Acquire: messages.Acquire{Handle: hd, Location: locHost, ReplyTo: box.pid}, Reply: &leaseRep, Sink: sink})
	got := sink.next(t)
	require.Same(t, &leaseRep, got, "answered in the requester's storage")
	require.NoError(t, leaseRep.Err)
	assert.NotZero(t, leaseRep.Lease)

	var rep messages.Reply
	h.send(&ReleaseRequest{Release: messages.Release{Lease: leaseRep.Lease, ReplyTo: box.pid}, Reply: &rep, Sink: sink})
	require.Same(t, &rep, sink.next(t))
	require.NoError(t, rep.Err)
	assert.Empty(t, box.ch, "nothing was sent to ReplyTo")
	assert.Zero(t, sink.woken)

	var again messages.Reply
	h.send(&ReleaseRequest{Release: messages.Release{Lease: leaseRep.Lease, ReplyTo: box.pid}, Reply: &again})
	require.Same(t, &again, box.next(t), "no sink: the answer goes to ReplyTo")
	assert.ErrorIs(t, again.Err, budget.ErrInvalidInput, "released twice")

	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"Register", "StateVersion", "Acquire", "Release", "Release"}, kinds)
}
