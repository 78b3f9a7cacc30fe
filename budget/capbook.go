package budget

import "fmt"

// ---- a cap over a group of reservations --------------------------------------

// CapBook is the bookkeeping of a cap over a group of reservations that one
// owner makes at the ledger: the bytes the group holds never exceed the
// cap, whatever room the locations have. The write pipeline (package
// staging) keeps one for its device clones (Config.CloneBudgetBytes): each
// clone is a claim in the book and, beside it, a named reservation at the
// device location, so a clone must fit both the pipeline's cap and the
// location's budget.
//
// A claim moves unused → admitted → held → released, or admitted →
// released:
//
//   - [CapBook.Admit] takes its bytes from the cap (refused with a
//     [*CapError] when they do not fit), before the owner asks the ledger
//     for its reservation, so two admissions in flight at once cannot both
//     take the last bytes;
//   - [CapBook.Hold] records that the ledger admitted the reservation too;
//   - [CapBook.Release] gives the bytes back, once: when the ledger refused
//     the reservation (the claim was only admitted) or when the reservation
//     is released (it was held).
//
// Figures: Used is admitted + held, what the cap bounds (Used ≤ Cap at
// every moment); Held the bytes of the claims held; Peak the highest Held
// ever, the most the group had reserved at once. An admission the ledger
// then refused never counts in Peak.
//
// The ledger does not see the book, and the book does not see the ledger:
// the cap is the owner's policy, not a location's budget, and the owner
// asks one and then the other. Like the ledger the book is pure and not
// safe for concurrent use; the owner serializes every call (the staging
// pipeline under its mutex, where it also waits and signals). Every method
// is O(1).
type CapBook struct {
	name     string
	capBytes int64
	admitted int64 // bytes of claims admitted, not yet held
	held     int64 // bytes of claims held
	peak     int64 // the highest held ever
	claims   int   // claims admitted or held
}

// CapClaim is one claim of bytes in a [CapBook], from [CapBook.Admit] until
// [CapBook.Release]. The zero value is an unused claim. The caller owns
// its storage, typically a field of its own record of the reservation, so
// that an admission allocates nothing; a claim is used once and must not
// be copied once admitted.
type CapClaim struct {
	book  *CapBook
	bytes int64
	state capClaimState
}

type capClaimState uint8

const (
	claimUnused capClaimState = iota
	claimAdmitted
	claimHeld
	claimReleased
)

func (s capClaimState) String() string {
	switch s {
	case claimUnused:
		return "unused"
	case claimAdmitted:
		return "admitted"
	case claimHeld:
		return "held"
	default:
		return "released"
	}
}

// Bytes returns the claim's bytes (0 while unused).
func (c *CapClaim) Bytes() int64 { return c.bytes }

// NewCapBook returns an empty book named name (it names the cap in a
// [*CapError]) with a cap of capBytes; a cap of 0 admits nothing. Errors:
// a negative cap (invalid input).
func NewCapBook(name string, capBytes int64) (*CapBook, error) {
	if capBytes < 0 {
		return nil, invalidf("cap %q: bytes must not be negative, got %d", name, capBytes)
	}
	return &CapBook{name: name, capBytes: capBytes}, nil
}

// Name returns the book's name.
func (b *CapBook) Name() string { return b.name }

// Cap returns the cap in bytes.
func (b *CapBook) Cap() int64 { return b.capBytes }

// Fits reports whether a claim of bytes could ever be admitted: 0 < bytes
// ≤ Cap. A claim that fits may still have to wait for releases; one that
// does not is refused however empty the book is.
func (b *CapBook) Fits(bytes int64) bool { return bytes > 0 && bytes <= b.capBytes }

// Admits reports whether an admission of bytes would succeed now: 0 <
// bytes ≤ Cap − Used. It changes nothing and, unlike a refused Admit,
// builds no error (for a caller that waits and asks again).
func (b *CapBook) Admits(bytes int64) bool {
	return bytes > 0 && bytes <= b.capBytes-(b.admitted+b.held)
}

// Admit takes bytes from the cap for the unused claim c, which becomes
// admitted. Errors (nothing changed): c nil or used already, bytes ≤ 0
// (invalid input); Used + bytes > Cap ([*CapError], figures as they were;
// its RequestedBytes exceed its CapBytes when the claim could never fit).
func (b *CapBook) Admit(c *CapClaim, bytes int64) error {
	if c == nil {
		return invalidf("cap %q: no claim to admit", b.name)
	}
	if c.state != claimUnused {
		return invalidf("cap %q: a %d-byte claim is %s; admit an unused one", b.name, c.bytes, c.state)
	}
	if bytes <= 0 {
		return invalidf("cap %q: bytes must be positive, got %d", b.name, bytes)
	}
	if !b.Admits(bytes) {
		return &CapError{Cap: b.name, CapBytes: b.capBytes, UsedBytes: b.Used(), RequestedBytes: bytes}
	}
	b.admitted += bytes
	b.claims++
	*c = CapClaim{book: b, bytes: bytes, state: claimAdmitted}
	return nil
}

// Hold records that c's reservation was admitted at the ledger too: c
// moves from admitted to held and Peak follows. Errors (nothing changed):
// c is not an admitted claim of this book (invalid input).
func (b *CapBook) Hold(c *CapClaim) error {
	if err := b.check(c); err != nil {
		return err
	}
	if c.state != claimAdmitted {
		return invalidf("cap %q: a %d-byte claim is %s, not admitted", b.name, c.bytes, c.state)
	}
	c.state = claimHeld
	b.admitted -= c.bytes
	b.held += c.bytes
	b.peak = max(b.peak, b.held)
	return nil
}

// Release gives c's bytes back to the cap, admitted or held. Errors
// (nothing changed): c is not a claim of this book, or it was released
// already (invalid input).
func (b *CapBook) Release(c *CapClaim) error {
	if err := b.check(c); err != nil {
		return err
	}
	switch c.state {
	case claimAdmitted:
		b.admitted -= c.bytes
	case claimHeld:
		b.held -= c.bytes
	default: // claimReleased: an unused claim is no claim of this book
		return invalidf("cap %q: a %d-byte claim released twice", b.name, c.bytes)
	}
	c.state = claimReleased
	b.claims--
	if b.admitted < 0 || b.held < 0 || b.claims < 0 {
		panic("budget: a cap's figures went negative")
	}
	return nil
}

func (b *CapBook) check(c *CapClaim) error {
	if c == nil || c.book != b {
		return invalidf("cap %q: not a claim of this cap", b.name)
	}
	return nil
}

// Used returns the bytes of the claims admitted or held: what the cap
// bounds.
func (b *CapBook) Used() int64 { return b.admitted + b.held }

// Held returns the bytes of the claims held.
func (b *CapBook) Held() int64 { return b.held }

// Peak returns the highest Held ever.
func (b *CapBook) Peak() int64 { return b.peak }

// Claims returns the number of claims admitted or held.
func (b *CapBook) Claims() int { return b.claims }

// CapError: an admission into a [CapBook] would take the group past its
// cap. The figures are those at the refusal. It is not a [*BudgetError]:
// no location refused anything.
type CapError struct {
	Cap            string // the book's name
	CapBytes       int64
	UsedBytes      int64 // admitted + held
	RequestedBytes int64
}

func (e *CapError) Error() string {
	return fmt.Sprintf("residency cap %q exceeded: used %d + requested %d > cap %d (short by %d bytes)",
		e.Cap, e.UsedBytes, e.RequestedBytes, e.CapBytes, e.RequestedBytes-(e.CapBytes-e.UsedBytes))
}
