package budget

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type capFigures struct {
	used, held, peak int64
	claims           int
}

func capFiguresOf(b *CapBook) capFigures {
	return capFigures{used: b.Used(), held: b.Held(), peak: b.Peak(), claims: b.Claims()}
}

func TestCapBookNew(t *testing.T) {
	_, err := NewCapBook("clones", -1)
	assert.ErrorIs(t, err, ErrInvalidInput)
	assert.ErrorContains(t, err, `cap "clones": bytes must not be negative, got -1`)

	b, err := NewCapBook("clones", 0)
	require.NoError(t, err)
	assert.Equal(t, "clones", b.Name())
	assert.Zero(t, b.Cap())
	assert.Equal(t, capFigures{}, capFiguresOf(b))
	err = b.Admit(new(CapClaim), 1)
	var ce *CapError
	require.ErrorAs(t, err, &ce, "a cap of 0 admits nothing")
	assert.Equal(t, CapError{Cap: "clones", CapBytes: 0, UsedBytes: 0, RequestedBytes: 1}, *ce)
}

func TestCapBookFitsAndAdmits(t *testing.T) {
	b, err := NewCapBook("c", 100)
	require.NoError(t, err)
	for _, tc := range []struct {
		bytes int64
		fits  bool
	}{{-1, false}, {0, false}, {1, true}, {99, true}, {100, true}, {101, false}} {
		assert.Equal(t, tc.fits, b.Fits(tc.bytes), "Fits(%d)", tc.bytes)
	}
	// Fits does not depend on what is in use; Admits does.
	assert.True(t, b.Admits(100))
	require.NoError(t, b.Admit(new(CapClaim), 60))
	assert.True(t, b.Fits(100))
	for _, tc := range []struct {
		bytes  int64
		admits bool
	}{{0, false}, {1, true}, {40, true}, {41, false}, {100, false}} {
		assert.Equal(t, tc.admits, b.Admits(tc.bytes), "Admits(%d) with 60 of 100 used", tc.bytes)
	}
	assert.Equal(t, capFigures{used: 60, claims: 1}, capFiguresOf(b), "Fits and Admits change nothing")
}

// TestCapBookTransitions walks a book of cap 100 through a table of steps;
// every step's outcome and the figures after it are checked.
func TestCapBookTransitions(t *testing.T) {
	type step struct {
		op    string // admit, hold, release
		claim string // the claim's name in the table (admit of a new name makes it)
		bytes int64  // admit
		err   string // "" for success; "cap" for a *CapError; otherwise a message part (invalid input)
		after capFigures
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"admit, hold, release", []step{
			{op: "admit", claim: "a", bytes: 40, after: capFigures{used: 40, claims: 1}},
			{op: "hold", claim: "a", after: capFigures{used: 40, held: 40, peak: 40, claims: 1}},
			{op: "release", claim: "a", after: capFigures{peak: 40}},
		}},
		{"an admission the ledger refused is released without a hold: no peak", []step{
			{op: "admit", claim: "a", bytes: 70, after: capFigures{used: 70, claims: 1}},
			{op: "release", claim: "a", after: capFigures{}},
		}},
		{"admitted bytes count against the cap before the hold", []step{
			{op: "admit", claim: "a", bytes: 60, after: capFigures{used: 60, claims: 1}},
			{op: "admit", claim: "b", bytes: 41, err: "cap", after: capFigures{used: 60, claims: 1}},
			{op: "admit", claim: "b", bytes: 40, after: capFigures{used: 100, claims: 2}},
			{op: "hold", claim: "b", after: capFigures{used: 100, held: 40, peak: 40, claims: 2}},
			{op: "hold", claim: "a", after: capFigures{used: 100, held: 100, peak: 100, claims: 2}},
			{op: "admit", claim: "c", bytes: 1, err: "cap", after: capFigures{used: 100, held: 100, peak: 100, claims: 2}},
			{op: "release", claim: "a", after: capFigures{used: 40, held: 40, peak: 100, claims: 1}},
			{op: "admit", claim: "c", bytes: 60, after: capFigures{used: 100, held: 40, peak: 100, claims: 2}},
		}},
		{"peak is the highest held, not the highest used", []step{
			{op: "admit", claim: "a", bytes: 30, after: capFigures{used: 30, claims: 1}},
			{op: "hold", claim: "a", after: capFigures{used: 30, held: 30, peak: 30, claims: 1}},
			{op: "admit", claim: "b", bytes: 70, after: capFigures{used: 100, held: 30, peak: 30, claims: 2}},
			{op: "release", claim: "b", after: capFigures{used: 30, held: 30, peak: 30, claims: 1}},
		}},
		{"a claim larger than the cap", []step{
			{op: "admit", claim: "a", bytes: 101, err: "cap", after: capFigures{}},
		}},
		{"bytes must be positive", []step{
			{op: "admit", claim: "a", bytes: 0, err: `cap "c": bytes must be positive, got 0`, after: capFigures{}},
			{op: "admit", claim: "a", bytes: -5, err: `cap "c": bytes must be positive, got -5`, after: capFigures{}},
		}},
		{"released twice", []step{
			{op: "admit", claim: "a", bytes: 10, after: capFigures{used: 10, claims: 1}},
			{op: "release", claim: "a", after: capFigures{}},
			{op: "release", claim: "a", err: `cap "c": a 10-byte claim released twice`, after: capFigures{}},
			{op: "hold", claim: "a", err: `cap "c": a 10-byte claim is released, not admitted`, after: capFigures{}},
		}},
		{"held twice", []step{
			{op: "admit", claim: "a", bytes: 10, after: capFigures{used: 10, claims: 1}},
			{op: "hold", claim: "a", after: capFigures{used: 10, held: 10, peak: 10, claims: 1}},
			{op: "hold", claim: "a", err: `cap "c": a 10-byte claim is held, not admitted`, after: capFigures{used: 10, held: 10, peak: 10, claims: 1}},
		}},
		{"another book's claim, an unused one, or none", []step{
			{op: "admit", claim: "a", bytes: 10, after: capFigures{used: 10, claims: 1}},
			{op: "hold", claim: "foreign", err: `cap "c": not a claim of this cap`, after: capFigures{used: 10, claims: 1}},
			{op: "release", claim: "foreign", err: `cap "c": not a claim of this cap`, after: capFigures{used: 10, claims: 1}},
			{op: "hold", claim: "unused", err: `cap "c": not a claim of this cap`, after: capFigures{used: 10, claims: 1}},
			{op: "release", claim: "unused", err: `cap "c": not a claim of this cap`, after: capFigures{used: 10, claims: 1}},
			{op: "release", claim: "nil", err: `cap "c": not a claim of this cap`, after: capFigures{used: 10, claims: 1}},
			{op: "admit", claim: "nil", bytes: 5, err: `cap "c": no claim to admit`, after: capFigures{used: 10, claims: 1}},
		}},
		{"a claim is admitted once", []step{
			{op: "admit", claim: "a", bytes: 10, after: capFigures{used: 10, claims: 1}},
			{op: "admit", claim: "a", bytes: 5, err: `cap "c": a 10-byte claim is admitted; admit an unused one`, after: capFigures{used: 10, claims: 1}},
			{op: "hold", claim: "a", after: capFigures{used: 10, held: 10, peak: 10, claims: 1}},
			{op: "admit", claim: "a", bytes: 5, err: `cap "c": a 10-byte claim is held; admit an unused one`, after: capFigures{used: 10, held: 10, peak: 10, claims: 1}},
			{op: "release", claim: "a", after: capFigures{peak: 10}},
			{op: "admit", claim: "a", bytes: 5, err: `cap "c": a 10-byte claim is released; admit an unused one`, after: capFigures{peak: 10}},
			{op: "admit", claim: "foreign", bytes: 5, err: `cap "c": a 10-byte claim is admitted; admit an unused one`, after: capFigures{peak: 10}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := NewCapBook("c", 100)
			require.NoError(t, err)
			other, err := NewCapBook("other", 100)
			require.NoError(t, err)
			foreign := new(CapClaim)
			require.NoError(t, other.Admit(foreign, 10))
			claims := map[string]*CapClaim{"foreign": foreign, "nil": nil, "unused": new(CapClaim)}
			for i, s := range tc.steps {
				before := capFiguresOf(b)
				switch s.op {
				case "admit":
					c, ok := claims[s.claim]
					if !ok {
						c = new(CapClaim)
						claims[s.claim] = c
					}
					var was CapClaim
					if c != nil {
						was = *c
					}
					err = b.Admit(c, s.bytes)
					switch {
					case err == nil:
						assert.Equal(t, s.bytes, c.Bytes(), "step %d", i)
					case c != nil:
						assert.Equal(t, was, *c, "step %d: a refused admission leaves the claim as it was", i)
					}
				case "hold":
					err = b.Hold(claims[s.claim])
				case "release":
					err = b.Release(claims[s.claim])
				}
				switch s.err {
				case "":
					require.NoError(t, err, "step %d", i)
				case "cap":
					var ce *CapError
					require.ErrorAs(t, err, &ce, "step %d", i)
					assert.Equal(t, CapError{Cap: "c", CapBytes: 100, UsedBytes: before.used, RequestedBytes: s.bytes}, *ce, "step %d: figures as they were", i)
					assert.NotErrorIs(t, err, ErrInvalidInput)
				default:
					assert.ErrorIs(t, err, ErrInvalidInput, "step %d", i)
					assert.ErrorContains(t, err, s.err, "step %d", i)
				}
				if err != nil {
					assert.Equal(t, before, capFiguresOf(b), "step %d: a refusal changes nothing", i)
				}
				assert.Equal(t, s.after, capFiguresOf(b), "step %d", i)
			}
			assert.Equal(t, capFigures{used: 10, claims: 1}, capFiguresOf(other), "the other book is untouched")
		})
	}
}

func TestCapErrorMessage(t *testing.T) {
	err := error(&CapError{Cap: "staging/clones", CapBytes: 100, UsedBytes: 70, RequestedBytes: 50})
	assert.Equal(t, `residency cap "staging/clones" exceeded: used 70 + requested 50 > cap 100 (short by 20 bytes)`, err.Error())
	var be *BudgetError
	assert.False(t, errors.As(err, &be), "a cap refusal is not a location's budget refusal")
	assert.NotErrorIs(t, err, ErrBusy)
}

// TestCapBookProperty drives books with random admissions, holds and
// releases (valid and invalid) and checks each step against a model that
// keeps every claim's state in a list: Used never exceeds the cap and is
// the sum of the live claims; an admission is refused exactly when it does
// not fit; Peak is exactly the highest Held so far; every claim is released
// exactly once (a second release, or a hold after one, is refused and
// changes nothing).
func TestCapBookProperty(t *testing.T) {
	for seed := uint64(1); seed <= 200; seed++ {
		r := rand.New(rand.NewPCG(seed, 0x5eed))
		capBytes := r.Int64N(200) // 0 included
		b, err := NewCapBook("p", capBytes)
		require.NoError(t, err)
		type modelClaim struct {
			c     *CapClaim // admitted at least once
			bytes int64
			state capClaimState
		}
		var claims []*modelClaim
		var peak int64
		sums := func() (admitted, held int64, live int) {
			for _, m := range claims {
				switch m.state {
				case claimAdmitted:
					admitted += m.bytes
					live++
				case claimHeld:
					held += m.bytes
					live++
				}
			}
			return admitted, held, live
		}
		for step := range 300 {
			admitted, held, _ := sums()
			switch op := r.IntN(10); {
			case op < 4 || len(claims) == 0: // admit: sometimes too big, sometimes not positive
				n := r.Int64N(capBytes/2+2) - 1
				c, reused := new(CapClaim), false
				if len(claims) > 0 && r.IntN(8) == 0 { // a claim admitted before, whatever its state now
					c, reused = claims[r.IntN(len(claims))].c, true
				}
				admits := b.Admits(n)
				err := b.Admit(c, n)
				require.Equal(t, !reused && admits, err == nil, "seed %d step %d: Admits(%d) says %v", seed, step, n, admits)
				switch {
				case reused || n <= 0:
					require.ErrorIs(t, err, ErrInvalidInput, "seed %d step %d", seed, step)
				case admitted+held+n > capBytes:
					var ce *CapError
					require.ErrorAs(t, err, &ce, "seed %d step %d: %d does not fit", seed, step, n)
					require.Equal(t, CapError{Cap: "p", CapBytes: capBytes, UsedBytes: admitted + held, RequestedBytes: n}, *ce)
				default:
					require.NoError(t, err, "seed %d step %d: %d fits", seed, step, n)
					claims = append(claims, &modelClaim{c: c, bytes: n, state: claimAdmitted})
				}
			case op < 7: // hold any claim, live or not
				m := claims[r.IntN(len(claims))]
				err := b.Hold(m.c)
				if m.state == claimAdmitted {
					require.NoError(t, err, "seed %d step %d", seed, step)
					m.state = claimHeld
					peak = max(peak, held+m.bytes)
				} else {
					require.ErrorIs(t, err, ErrInvalidInput, "seed %d step %d: hold of a %s claim", seed, step, m.state)
				}
			default: // release any claim, live or not
				m := claims[r.IntN(len(claims))]
				err := b.Release(m.c)
				if m.state != claimReleased {
					require.NoError(t, err, "seed %d step %d", seed, step)
					m.state = claimReleased
				} else {
					require.ErrorIs(t, err, ErrInvalidInput, "seed %d step %d: second release", seed, step)
				}
			}
			admitted, held, live := sums()
			require.Equal(t, capFigures{used: admitted + held, held: held, peak: peak, claims: live}, capFiguresOf(b), "seed %d step %d", seed, step)
			require.LessOrEqual(t, b.Used(), b.Cap(), "seed %d step %d", seed, step)
		}
		// Releasing every live claim empties the book; the peak stays.
		for _, m := range claims {
			if m.state != claimReleased {
				require.NoError(t, b.Release(m.c))
			}
		}
		require.Equal(t, capFigures{peak: peak}, capFiguresOf(b), "seed %d", seed)
	}
}
