package budget

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// The lease path stores its transitions' details as raw ids and formats
// them when they are read. Every place a Transition is observed — the
// trace, a Recording, a run's report, a direct failure's partial report —
// must read exactly as the details were formatted when committed.
func TestTraceDetailsReadAsFormattedAtCommit(t *testing.T) {
	for _, capacity := range []int{1024, 0} {
		t.Run(fmt.Sprint("capacity=", capacity), func(t *testing.T) {
			cfg := stdConfig()
			cfg.TraceCapacity = capacity
			c := newChecked(t, cfg)
			w := c.reg("w", 10, Replicable, "cuda:0")
			// Multi-digit ids: the details must not be cut or padded.
			for range 11 {
				id, err := c.Acquire(w, "cuda:0")
				require.NoError(t, err)
				require.NoError(t, c.Release(id))
				hd, err := c.Hold(w, "cuda:0")
				require.NoError(t, err)
				require.NoError(t, c.Unhold(hd))
			}
			var lease LeaseID
			var event EventID
			var hold HoldID
			rep := c.L.Recording(func() {
				var err error
				lease, err = c.Acquire(w, "cuda:0")
				require.NoError(t, err)
				event, err = c.RecordEvent(lease)
				require.NoError(t, err)
				require.NoError(t, c.ReapEvent(event))
				require.NoError(t, c.Release(lease))
				hold, err = c.Hold(w, "cuda:0")
				require.NoError(t, err)
				require.NoError(t, c.Unhold(hold))
			})
			require.Equal(t, LeaseID(12), lease)
			want := []string{
				"acquire lease 12",
				"record_event event 1 on lease 12",
				"reap_event event 1",
				"release lease 12",
				"hold hold 12",
				"unhold hold 12",
			}
			require.Equal(t, want, kindAndDetail(rep.Transitions), "Recording")
			if capacity > 0 {
				tr := c.L.Trace()
				require.Equal(t, want, kindAndDetail(tr[len(tr)-len(want):]), "Trace")
				require.Equal(t, "lease 1", tr[2].Detail) // the first acquire
			} else {
				require.Empty(t, c.L.Trace())
			}

			// A scope's report lists its leases' acquisitions.
			r, err := c.L.StartRun(Plan{Enter: []Action{{Handle: w, Location: "cuda:1"}}}, RunOptions{Scope: "s"})
			require.NoError(t, err)
			_, ok, err := r.Next()
			require.NoError(t, err)
			require.True(t, ok)
			_, err = r.Complete()
			require.NoError(t, err)
			_, ok, err = r.Next()
			require.NoError(t, err)
			require.False(t, ok)
			report, leases, err := r.Finish()
			require.NoError(t, err)
			require.Equal(t, []LeaseID{13}, leases)
			require.Equal(t, []string{"admit copy from cuda:0", "complete ", "acquire lease 13"}, kindAndDetail(report.Transitions), "run report")
			c.invariants("run")

			// A direct failure's partial report.
			require.NoError(t, c.L.Release(13))
			adm, err := c.L.Place(w, "pinned-host")
			require.NoError(t, err)
			err = c.L.FailDirect(adm.ID, fmt.Errorf("boom"))
			pe := as[*PlanExecutionError](t, err)
			require.Equal(t, []string{"admit copy from cuda:0", "fail transfer failed: boom"}, kindAndDetail(pe.PartialReport.Transitions), "direct failure")
			c.invariants("fail")
		})
	}
}

func kindAndDetail(ts []Transition) []string {
	out := make([]string, len(ts))
	for i, x := range ts {
		out[i] = x.Kind + " " + x.Detail
	}
	return out
}

// Every transition whose detail names a lease, hold, event, reservation or
// kind of failure carries the same in its structured fields, so that no
// program reads them back out of the words.
func TestTraceStructuredFieldsMatchTheDetail(t *testing.T) {
	c := newChecked(t, stdConfig())
	w := c.reg("w", 10, Replicable, "cuda:0")
	lease, err := c.Acquire(w, "cuda:0")
	require.NoError(t, err)
	event, err := c.RecordEvent(lease)
	require.NoError(t, err)
	require.NoError(t, c.ReapEvent(event))
	require.NoError(t, c.Release(lease))
	hold, err := c.Hold(w, "cuda:0")
	require.NoError(t, err)
	require.NoError(t, c.Unhold(hold))
	require.NoError(t, c.Reserve("cuda:1", "ws", 5))
	require.NoError(t, c.Unreserve("ws"))
	adm, err := c.L.Place(w, "pinned-host")
	require.NoError(t, err)
	require.NoError(t, c.L.Fail(adm.ID, fmt.Errorf("boom")))
	_, reg, err := c.Register(ValueSpec{Name: "r", Bytes: 1, At: "cuda:0"})
	require.NoError(t, err)
	require.NoError(t, c.L.Fail(reg.ID, nil))

	type fields struct {
		Kind, Detail string
		ID, Lease    uint64
		Name         string
		Failure      FailureKind
	}
	var got []fields
	for _, x := range c.L.Trace()[2:] { // after w's registration
		got = append(got, fields{x.Kind, x.Detail, x.ID, x.Lease, x.Name, x.Failure})
	}
	l, e, h := uint64(lease), uint64(event), uint64(hold)
	require.Equal(t, []fields{
		{"acquire", fmt.Sprintf("lease %d", l), l, 0, "", FailureNone},
		{"record_event", fmt.Sprintf("event %d on lease %d", e, l), e, l, "", FailureNone},
		{"reap_event", fmt.Sprintf("event %d", e), e, 0, "", FailureNone},
		{"release", fmt.Sprintf("lease %d", l), l, 0, "", FailureNone},
		{"hold", fmt.Sprintf("hold %d", h), h, 0, "", FailureNone},
		{"unhold", fmt.Sprintf("hold %d", h), h, 0, "", FailureNone},
		{"reserve", "ws", 0, 0, "ws", FailureNone},
		{"unreserve", "ws", 0, 0, "ws", FailureNone},
		{"admit", "copy from cuda:0", 0, 0, "", FailureNone},
		{"fail", "transfer failed: boom", 0, 0, "", FailureTransfer},
		{"admit", "register at", 0, 0, "", FailureNone},
		{"fail", "registration failed; handle retired", 0, 0, "", FailureRegistration},
	}, got)

	// A refusal of an inactive lifetime names it in fields, too.
	var ie *InvalidInputError
	require.ErrorAs(t, c.Release(lease), &ie)
	require.Equal(t, LifetimeLease, ie.Inactive)
	require.Equal(t, l, ie.ID)
	require.ErrorAs(t, c.ReapEvent(event), &ie)
	require.Equal(t, LifetimeEvent, ie.Inactive)
	require.ErrorAs(t, c.Unreserve("ws"), &ie)
	require.Equal(t, LifetimeNone, ie.Inactive, "a reservation is named by its name, not an id")
}

func TestKindsReadBackAsWritten(t *testing.T) {
	for _, k := range []FailureKind{FailureNone, FailureTransfer, FailureRegistration} {
		b, err := k.MarshalText()
		require.NoError(t, err)
		var back FailureKind
		require.NoError(t, back.UnmarshalText(b))
		require.Equal(t, k, back)
	}
	for _, k := range []LifetimeKind{LifetimeNone, LifetimeLease, LifetimeHold, LifetimeEvent} {
		b, err := k.MarshalText()
		require.NoError(t, err)
		var back LifetimeKind
		require.NoError(t, back.UnmarshalText(b))
		require.Equal(t, k, back)
	}
	require.Equal(t, "other", FailureKind(9).String())
	require.Equal(t, "other", LifetimeKind(9).String())
}
