package cluster

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/messages/clusterpb"
	"github.com/residency-go/residency/system"
)

// AnyNode is the node part of a location that any member may serve:
// "cuda:0@*".
const AnyNode = "*"

// DefaultPlacementAttempts bounds how many nodes one placement asks when
// PlacementRequest.MaxAttempts is 0.
const DefaultPlacementAttempts = 3

// PlacementRequirement asks for the value named Value to be resident at
// one location of one of its tiers, in preference order (as a
// [system.Requirement] does on one node). A location is node-qualified
// ("cuda:0@node-b": that node only), for any member ("cuda:0@*"), or bare
// ("cuda:0": the node placing the request). Values are named, not handled:
// each node has its own handles, and the node asked looks the name up.
type PlacementRequirement struct {
	Value string
	Tiers [][]string
}

// PlacementRequest is a request the cluster places on one node: every
// requirement resident and every reservation admitted there, decided and
// entered by that node's controller in one step ([system.System.Admit]).
type PlacementRequest struct {
	// Name names the request (required); the node's decision carries it.
	Name         string
	Requirements []PlacementRequirement
	// Reservations' locations follow the requirements' rules (qualified,
	// "@*" or bare).
	Reservations []system.ReservationSpec
	// StateLimit is the node controller's search limit (0: the default).
	StateLimit int
	// Hold keeps the entered scope on the node (a lease on every entered
	// endpoint: nothing there can be evicted or moved away) until
	// [Placement.Release]. Without it the node exits the scope right
	// after entering: the values are resident, unprotected.
	Hold bool
	// MaxAttempts bounds the nodes asked, in rank order (0:
	// DefaultPlacementAttempts). A node that refuses (its room went, a
	// race with the summary) or cannot be reached costs one attempt.
	MaxAttempts int
}

// PlacementCandidate is one node the placement considered, with what the
// ranking used. Candidates are listed in rank order: tier ranks
// (lexicographic, first requirement most significant; the caller's
// preference comes first), then more requirements already resident there
// (per the directory), then room for the rest (per the node's gossiped
// summary), then a known summary, then more free bytes, then the name.
type PlacementCandidate struct {
	Node string
	// TierRanks holds, per requirement, the first tier that names a
	// location of this node.
	TierRanks []int
	// Resident lists where requirement values are already resident on
	// this node, node-qualified ("w at cuda:0@node-b").
	Resident []string
	// HasSummary is false when the node had not gossiped a summary yet:
	// its room is unknown (ranked after nodes whose room is known).
	HasSummary bool
	// Fits: every requirement not resident here has at least its bytes
	// free (budget − used − reserved) at some location of its first
	// matching tier, per the summary. Sizes come from the directory;
	// a value resident nowhere counts as fitting.
	Fits bool
	// FreeBytes sums, per requirement, the most free bytes at a location
	// of its first matching tier (math.MaxInt64 when unlimited).
	FreeBytes int64
}

// PlacementAttempt is one node asked: Err is nil when it admitted.
type PlacementAttempt struct {
	Node string
	Err  error
}

// PlacementEviction is one victim of a node's decision.
type PlacementEviction struct {
	Value    string
	Location string
	Bytes    int64
	Reason   string
}

// NodeDecision is the node controller's decision, as evidence: the plan's
// actions in words, its victims and the search work (see [system.Decision]).
type NodeDecision struct {
	Node                 string
	ExpectedStateVersion uint64
	ExploredStates       int
	Exhaustive           bool
	Reclaim              []string
	Reservations         []string
	Enter                []string
	Evictions            []PlacementEviction
}

// Placement is where the cluster placed a request, and why: the
// candidates in rank order, every node asked (the last one admitted), the
// reason in words, and the chosen node's decision.
type Placement struct {
	Request    string
	Node       string
	Why        string
	Candidates []PlacementCandidate
	Attempts   []PlacementAttempt
	Decision   NodeDecision
	// Directory says, per value whose directory lookup failed, what
	// happened and that the ranking went on without it ("directory did
	// not answer for w within 2s: ranked by room only"); also at the end
	// of Why. Empty when every lookup answered.
	Directory []string

	from     *Node
	id       string
	hold     bool
	released atomic.Bool
}

// Release exits a held placement on its node: its leases and
// reservations are released. A placement without Hold, or already
// released, is a no-op. Errors: the node cannot be reached
// ([*system.UnavailableError]; the node releases the placement itself when this
// node leaves the cluster).
func (p *Placement) Release(ctx context.Context) error {
	if !p.hold || p.released.Swap(true) {
		return nil
	}
	r, err := p.from.request(ctx, p.Node, &clusterpb.ReleasePlacement{PlacementId: p.id})
	if err != nil {
		p.released.Store(false)
		return err
	}
	if rep, ok := r.(*clusterpb.ReleasePlacementReply); ok && rep.Error != nil {
		return placementFromRemote(rep.Error)
	}
	return nil
}

// PlacementError is a cluster request that no node admitted: every node
// asked and its reason (Attempts, in order), and the candidates not asked
// (the attempt bound or the caller's deadline). errors.As finds each
// attempt's typed error ([*system.PlanError], [*system.BudgetError],
// [*system.UnavailableError], …) and errors.Is the caller's context error.
type PlacementError struct {
	Request    string
	Candidates []PlacementCandidate
	Attempts   []PlacementAttempt
	NotTried   []string
	// Directory: per value whose directory lookup failed, what happened
	// (as [Placement.Directory]).
	Directory []string
	// Stage is what the placement was doing when the caller's context
	// ended it before any node was ranked ("asking the directory where w
	// is resident"); empty otherwise.
	Stage string
	// Ctx is the caller's context error when it ended the placement.
	Ctx error
}

func (e *PlacementError) Error() string {
	var b strings.Builder
	switch {
	case e.Stage != "":
		fmt.Fprintf(&b, "residency placement %q: stopped while %s, before any node was asked", e.Request, e.Stage)
	case len(e.Attempts) == 0:
		fmt.Fprintf(&b, "residency placement %q: no node admitted it (no candidate node)", e.Request)
	default:
		fmt.Fprintf(&b, "residency placement %q: no node admitted it", e.Request)
	}
	for _, a := range e.Attempts {
		fmt.Fprintf(&b, "; %s: %v", a.Node, a.Err)
	}
	for _, d := range e.Directory {
		fmt.Fprintf(&b, "; %s", d)
	}
	if len(e.NotTried) > 0 {
		fmt.Fprintf(&b, "; not asked: %s", strings.Join(e.NotTried, ", "))
	}
	if e.Ctx != nil {
		fmt.Fprintf(&b, "; stopped: %v", e.Ctx)
	}
	return b.String()
}

// Unwrap returns every attempt's error, and the context's.
func (e *PlacementError) Unwrap() []error {
	out := make([]error, 0, len(e.Attempts)+1)
	for _, a := range e.Attempts {
		out = append(out, a.Err)
	}
	if e.Ctx != nil {
		out = append(out, e.Ctx)
	}
	return out
}

// locRef is a location as a placement names it.
type locRef struct {
	loc  string // unqualified
	node string // "" local, AnyNode, or a node name
}

func parseLocRef(s string) (locRef, error) {
	if i := strings.LastIndexByte(s, '@'); i >= 0 && s[i+1:] == AnyNode {
		if _, err := budget.ParseLocation(s[:i]); err != nil {
			return locRef{}, err
		}
		return locRef{loc: s[:i], node: AnyNode}, nil
	}
	ln, err := budget.ParseLocation(s)
	if err != nil {
		return locRef{}, err
	}
	r := locRef{node: ln.Node}
	ln.Node = ""
	r.loc = ln.String()
	return r, nil
}

func (r locRef) on(self, node string) bool {
	switch r.node {
	case AnyNode:
		return true
	case "":
		return node == self
	}
	return r.node == node
}

// Place places req on one node of the cluster, in four steps: it
// validates the request, gathers what the directory, the gossiped
// summaries and the member list say, ranks the candidate nodes (a pure
// function of those), and asks them in rank order.
//
// The candidates are the nodes with a location in every requirement and
// reservation (named for them, and in their summary when they published
// one). Place ranks them (see [PlacementCandidate]) from the directory
// (one [Node.WhereIs] per distinct value, up to 8 at once, each bounded by
// RequestTimeout and half the caller's time left) and the gossiped
// summaries — never a node's snapshot. A lookup that fails (the member
// hosting the value's directory entry crashed, or it did not answer
// within its bound) does not stop the placement: the ranking goes on
// without it, and [Placement.Directory] says so. Place then asks the best
// node's controller to decide and enter the request in one step, with the
// requirements restricted to that node's locations. When a node refuses
// (its room went since its summary, the value is not registered there, …)
// or cannot be reached, Place asks the next one, up to MaxAttempts, each
// attempt bounded by RequestTimeout and the caller's deadline (at most
// half the time left while other candidates remain, so one hung node
// cannot use it all). It returns the placement with its evidence, or a
// [*PlacementError] listing each node's reason;
// [*system.InvalidInputError] for a malformed request (nothing asked). A
// node named in a location that is not a member is an attempt that
// failed with [*system.UnavailableError] (nothing sent).
func (n *Node) Place(ctx context.Context, req PlacementRequest) (*Placement, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p, err := parsePlacement(req)
	if err != nil {
		return nil, err
	}
	view, err := n.gather(ctx, req)
	if err != nil {
		return nil, err
	}
	return n.attempts(ctx, p, rankCandidates(p, view), view)
}

// parsedPlacement is a request that passed validation: its locations
// parsed, the nodes it names, its attempt bound.
type parsedPlacement struct {
	req         PlacementRequest
	tiers       [][][]locRef // per requirement, per tier
	resv        []locRef     // per reservation
	named       []string     // nodes named in a location, sorted
	maxAttempts int
}

// parsePlacement validates req: a name, something to place, a value name
// per requirement and well-formed locations. Its errors are
// [*system.InvalidInputError].
func parsePlacement(req PlacementRequest) (parsedPlacement, error) {
	if req.Name == "" {
		return parsedPlacement{}, &budget.InvalidInputError{Message: "placement: request name is empty"}
	}
	if len(req.Requirements) == 0 && len(req.Reservations) == 0 {
		return parsedPlacement{}, &budget.InvalidInputError{Message: fmt.Sprintf("placement %q: no requirements and no reservations", req.Name)}
	}
	p := parsedPlacement{req: req, tiers: make([][][]locRef, len(req.Requirements)), resv: make([]locRef, len(req.Reservations)),
		maxAttempts: req.MaxAttempts}
	if p.maxAttempts <= 0 {
		p.maxAttempts = DefaultPlacementAttempts
	}
	named := map[string]bool{}
	name := func(ref locRef) {
		if ref.node != "" && ref.node != AnyNode {
			named[ref.node] = true
		}
	}
	for i, r := range req.Requirements {
		if r.Value == "" {
			return parsedPlacement{}, &budget.InvalidInputError{Message: fmt.Sprintf("placement %q: requirement %d has no value name", req.Name, i)}
		}
		p.tiers[i] = make([][]locRef, len(r.Tiers))
		for t, tier := range r.Tiers {
			for _, s := range tier {
				ref, err := parseLocRef(s)
				if err != nil {
					return parsedPlacement{}, &budget.InvalidInputError{Message: fmt.Sprintf("placement %q: requirement %d (%s): %v", req.Name, i, r.Value, err)}
				}
				name(ref)
				p.tiers[i][t] = append(p.tiers[i][t], ref)
			}
		}
	}
	for i, r := range req.Reservations {
		ref, err := parseLocRef(r.Location)
		if err != nil {
			return parsedPlacement{}, &budget.InvalidInputError{Message: fmt.Sprintf("placement %q: reservation %q: %v", req.Name, r.Name, err)}
		}
		name(ref)
		p.resv[i] = ref
	}
	p.named = slices.Sorted(maps.Keys(named))
	return p, nil
}
