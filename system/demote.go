package system

import "github.com/residency-go/residency/actors"

// How a demotion runs (docs/semantics.md, "Spill"): the ledger admits it
// as a move, and the value's actor carries out its copy, unless a
// DemotionCopier serves the demotion's route. A staging pipeline (package
// staging) serving device cuda:N registers itself for cuda:N → its pinned
// location through ServeDemotions, so that demotions to pinned host run
// on its copy queue at the lowest priority.
type (
	// Demotion is one demotion copy handed to a DemotionCopier.
	Demotion = actors.Demotion
	// DemotionCopier carries out demotion copies for a route.
	DemotionCopier = actors.DemotionCopier
)

// ServeDemotions registers c to carry out the copies of the demotions
// from `from` to `to`, until the returned stop is called (stop is
// idempotent; a copy c has started is c's to see through). While several
// copiers serve one route, the earliest still registered is asked. Only
// the copy changes hands: the ledger charges a demotion as a move
// whoever copies, the runtime allocates and frees the buffers, and a copy
// that c reports failed drops the value, as any failed demotion does.
// Errors: ErrClosed after Close began; [*InvalidInputError] (nothing
// registered) for a nil copier, a location that is not configured, or
// from equal to to.
func (s *System) ServeDemotions(from, to string, c DemotionCopier) (stop func(), err error) {
	if s.closed.Load() {
		return nil, ErrClosed
	}
	return s.eng.ServeDemotions(from, to, c)
}
