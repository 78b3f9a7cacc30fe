package replay

import (
	"context"
	"fmt"
	"testing"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/diagnose"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Details are put in the script's words by the ids the transitions carry,
// never by their text: a reservation named like a lease stays as it is.
func TestDetailWordsFromTheTransitionsIDs(t *testing.T) {
	r := &Runner{
		leaseNames: map[uint64]scriptName{1: {kind: "lease", name: "reader"}, 2: {kind: "lease", name: "s", scope: true}},
		holdNames:  map[uint64]scriptName{1: {kind: "hold", name: "pin"}},
		eventNames: map[uint64]scriptName{3: {kind: "event", name: "read"}},
	}
	for _, c := range []struct {
		t    system.Transition
		want string
	}{
		{system.Transition{Kind: "acquire", Detail: "lease 1", ID: 1}, `lease "reader"`},
		{system.Transition{Kind: "release", Detail: "lease 2", ID: 2}, `lease of scope "s"`},
		{system.Transition{Kind: "release", Detail: "lease 9", ID: 9}, "lease 9"},
		{system.Transition{Kind: "unhold", Detail: "hold 1", ID: 1}, `hold "pin"`},
		{system.Transition{Kind: "record_event", Detail: "event 3 on lease 1", ID: 3, Lease: 1}, `event "read" on lease "reader"`},
		{system.Transition{Kind: "record_event", Detail: "event 3 on lease 9", ID: 3, Lease: 9}, "event 3 on lease 9"},
		{system.Transition{Kind: "reap_event", Detail: "event 3", ID: 3}, `event "read"`},
		{system.Transition{Kind: "reserve", Detail: "lease 1", Name: "lease 1"}, "lease 1"},
	} {
		assert.Equal(t, c.want, r.detail(c.t), "%s %s", c.t.Kind, c.t.Detail)
	}
}

// A refusal of an inactive lease is shown by the script's name, found by
// the error's fields (Inactive, ID) and built into the message by the
// error itself: no message text is rewritten, and an error without those
// fields keeps its words.
func TestInactiveRefusalNamedByFields(t *testing.T) {
	ctx := context.Background()
	r, done := newTestRunner(t, locationSpec{name: "pageable-host"})
	defer done()
	require.True(t, r.Do(ctx, Op{Name: "register", handle: "x", bytes: 10, at: "pageable-host"}).OK)
	require.True(t, r.Do(ctx, Op{Name: "acquire", handle: "x", location: "pageable-host", as: "reader"}).OK)
	l := r.leases["reader"].lease
	require.NoError(t, r.sys.ReleaseByID(ctx, l.ID()))
	refused := r.sys.ReleaseByID(ctx, l.ID())
	var ie *system.InvalidInputError
	require.ErrorAs(t, refused, &ie)
	require.Equal(t, system.LifetimeLease, ie.Inactive)

	names := r.inactiveNames(fmt.Errorf("exit: %w", refused))
	require.Equal(t, map[diagnose.LifetimeRef]string{{Kind: system.LifetimeLease, ID: uint64(l.ID())}: `lease "reader"`}, names)
	got := r.scriptError(refused, names)
	assert.Equal(t, `residency invalid input: lease "reader" is not active (already released or never issued)`, got.Error())
	require.ErrorAs(t, got, &ie)
	assert.Equal(t, `lease "reader" is not active (already released or never issued)`, ie.Message)
	assert.Equal(t, uint64(l.ID()), ie.ID, "the fields stay")

	// Without the fields nothing is named.
	plain := &system.InvalidInputError{Message: fmt.Sprintf("lease %d is not active", l.ID())}
	assert.Empty(t, r.inactiveNames(plain))
	assert.Equal(t, plain.Error(), r.scriptError(plain, nil).Error())
}

// An unknown replica mode is the replay's own refusal, in the script's
// words, once the fields before it pass; a duplicate name comes first.
// Either way nothing changes.
func TestUnknownReplicaModeInFieldOrder(t *testing.T) {
	ctx := context.Background()
	r, done := newTestRunner(t, locationSpec{name: "pageable-host"})
	defer done()
	res := r.Do(ctx, Op{Name: "register", handle: "a", bytes: 10, at: "pageable-host"})
	require.True(t, res.OK)
	before := res.StateVersion

	res = r.Do(ctx, Op{Name: "register", handle: "b", bytes: 10, replica: "shared", at: "pageable-host"})
	require.False(t, res.OK)
	assert.Equal(t, `residency invalid input: value "b": unknown replica mode "shared" (use exclusive or replicable)`, res.Error.Message)
	var ie *system.InvalidInputError
	assert.ErrorAs(t, res.Err(), &ie)

	res = r.Do(ctx, Op{Name: "register", handle: "a", bytes: 10, replica: "shared", at: "pageable-host"})
	require.False(t, res.OK)
	assert.Equal(t, `residency invalid input: duplicate value name "a"`, res.Error.Message)

	v, err := r.sys.StateVersion(ctx)
	require.NoError(t, err)
	assert.Equal(t, before, v)
}
