package budget

import (
	"fmt"
	"math"
)

// ---- a cap's refusal, and what it leaves short -------------------------------

// CapError: a reservation in the group of a cap (Ledger.ReserveCapped)
// would take the group's bytes past the cap. The figures are the group's
// at the refusal. It is not a [*BudgetError]: no location refused
// anything (the cap is checked before the location).
type CapError struct {
	Cap            string // the cap's name
	CapBytes       int64
	UsedBytes      int64 // bytes of the group's reservations
	RequestedBytes int64
}

func (e *CapError) Error() string {
	return fmt.Sprintf("residency cap %q exceeded: used %d + requested %d > cap %d (short by %d bytes)",
		e.Cap, e.UsedBytes, e.RequestedBytes, e.CapBytes, e.Shortfall())
}

// Shortfall returns the bytes the cap lacked for the refused reservation:
// UsedBytes + RequestedBytes − CapBytes (see [CapShortfall]).
func (e *CapError) Shortfall() int64 {
	return CapShortfall(e.CapBytes, e.UsedBytes, e.RequestedBytes)
}

// CapShortfall returns the bytes a cap of capBytes, whose group holds
// usedBytes, lacks for requested more: usedBytes + requested − capBytes,
// or 0 when they fit. Held at math.MaxInt64 instead of wrapping.
func CapShortfall(capBytes, usedBytes, requested int64) int64 {
	return max(0, subSat(addSat(usedBytes, requested), capBytes))
}

// CapRoom returns the bytes a cap of capBytes still admits while its
// group holds usedBytes: capBytes − usedBytes, or 0 when none.
func CapRoom(capBytes, usedBytes int64) int64 {
	return max(0, subSat(capBytes, usedBytes))
}

// Uncovered returns what a shortfall, plus the bytes ahead that reserves
// queued before it wait for, leaves uncovered by onTheWay, the group's
// bytes already on their way back (released without anything further
// being done): shortfall + ahead − onTheWay, or 0 when they are covered.
// An owner waiting for room in a cap frees more of its bytes while this is
// above 0. Negative arguments count as 0; held at math.MaxInt64.
func Uncovered(shortfall, ahead, onTheWay int64) int64 {
	need := addSat(max(0, shortfall), max(0, ahead))
	return max(0, subSat(need, max(0, onTheWay)))
}

// addSat is a + b held within the int64 range instead of wrapping.
func addSat(a, b int64) int64 {
	switch {
	case b > 0 && a > math.MaxInt64-b:
		return math.MaxInt64
	case b < 0 && a < math.MinInt64-b:
		return math.MinInt64
	}
	return a + b
}

// subSat is a − b held within the int64 range instead of wrapping.
func subSat(a, b int64) int64 {
	switch {
	case b < 0 && a > math.MaxInt64+b:
		return math.MaxInt64
	case b > 0 && a < math.MinInt64+b:
		return math.MinInt64
	}
	return a - b
}
