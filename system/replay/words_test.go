package replay

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/residency-go/residency/system"
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

// A message is rewritten only where the error's fields name a lifetime,
// and only that lifetime's whole words: not "release 1", not "lease 12".
func TestScriptMessageReplacesTheNamedLifetimeOnly(t *testing.T) {
	r := &Runner{
		leaseNames:     map[uint64]scriptName{1: {kind: "lease", name: "s", scope: true}, 12: {kind: "lease", name: "other"}},
		holdNames:      map[uint64]scriptName{},
		eventNames:     map[uint64]scriptName{},
		leaseEndpoints: map[uint64]string{1: "x at cuda:0"},
	}
	cause := &system.InvalidInputError{Message: "lease 1 is not active (already released or never issued)", Inactive: system.LifetimeLease, ID: 1}
	err := fmt.Errorf("exit: %w", cause)
	ps := r.inactiveWords(err)
	require.Len(t, ps, 1)
	got := r.scriptMessage("release 1; lease 12; lease 1 is not active; lease 1", ps)
	assert.Equal(t, `release 1; lease 12; lease of scope "s" on x at cuda:0 is not active; lease of scope "s" on x at cuda:0`, got)
	// Without the fields nothing is rewritten.
	assert.Empty(t, r.inactiveWords(errors.New("lease 1 is not active")))
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
