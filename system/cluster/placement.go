package cluster

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	protocluster "github.com/asynkron/protoactor-go/cluster"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

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

// Place places req on one node of the cluster. The candidates are the
// nodes with a location in every requirement and reservation (named for
// them, and in their summary when they published one). Place ranks them
// (see [PlacementCandidate]) from the directory (one [Node.WhereIs]
// per distinct value, up to 8 at once, each bounded by RequestTimeout and
// half the caller's time left) and the gossiped summaries — never a
// node's snapshot. A lookup that fails (the member hosting the value's
// directory entry crashed, or it did not answer within its bound) does
// not stop the placement: the ranking goes on without it, and
// [Placement.Directory] says so. Place then asks the best node's
// controller to decide and enter the request in one step, with the
// requirements restricted to that node's locations. When a node refuses (its room went since its summary, the
// value is not registered there, …) or cannot be reached, Place asks the
// next one, up to MaxAttempts, each attempt bounded by RequestTimeout and
// the caller's deadline (at most half the time left while other
// candidates remain, so one hung node cannot use it all). It returns the
// placement with its evidence, or a [*PlacementError] listing each node's
// reason; [*system.InvalidInputError] for a malformed request (nothing asked).
// A node named in a location that is not a member is an attempt that
// failed with [*system.UnavailableError] (nothing sent).
func (n *Node) Place(ctx context.Context, req PlacementRequest) (*Placement, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if req.Name == "" {
		return nil, &budget.InvalidInputError{Message: "placement: request name is empty"}
	}
	if len(req.Requirements) == 0 && len(req.Reservations) == 0 {
		return nil, &budget.InvalidInputError{Message: fmt.Sprintf("placement %q: no requirements and no reservations", req.Name)}
	}
	reqRefs := make([][][]locRef, len(req.Requirements))
	named := map[string]bool{}
	for i, r := range req.Requirements {
		if r.Value == "" {
			return nil, &budget.InvalidInputError{Message: fmt.Sprintf("placement %q: requirement %d has no value name", req.Name, i)}
		}
		reqRefs[i] = make([][]locRef, len(r.Tiers))
		for t, tier := range r.Tiers {
			for _, s := range tier {
				ref, err := parseLocRef(s)
				if err != nil {
					return nil, &budget.InvalidInputError{Message: fmt.Sprintf("placement %q: requirement %d (%s): %v", req.Name, i, r.Value, err)}
				}
				if ref.node != "" && ref.node != AnyNode {
					named[ref.node] = true
				}
				reqRefs[i][t] = append(reqRefs[i][t], ref)
			}
		}
	}
	resvRefs := make([]locRef, len(req.Reservations))
	for i, r := range req.Reservations {
		ref, err := parseLocRef(r.Location)
		if err != nil {
			return nil, &budget.InvalidInputError{Message: fmt.Sprintf("placement %q: reservation %q: %v", req.Name, r.Name, err)}
		}
		if ref.node != "" && ref.node != AnyNode {
			named[ref.node] = true
		}
		resvRefs[i] = ref
	}
	maxAttempts := req.MaxAttempts
	if maxAttempts <= 0 {
		maxAttempts = DefaultPlacementAttempts
	}

	// What the directory and the summaries say.
	where, notes, err := n.lookUp(ctx, req)
	if err != nil {
		return nil, err
	}
	sums, err := n.Summaries(ctx)
	if err != nil {
		return nil, err
	}
	sumOf := map[string]map[string]LocationSummary{}
	for _, s := range sums {
		m := map[string]LocationSummary{}
		for _, l := range s.Locations {
			m[l.Location] = l
		}
		sumOf[s.Node] = m
	}
	members := n.Members()
	live := map[string]bool{}
	for _, m := range members {
		live[m] = true
	}
	nodes := append([]string(nil), members...)
	for m := range named {
		if !live[m] {
			nodes = append(nodes, m)
		}
	}

	// has: the node has loc, as far as its summary says (a node without
	// a summary yet is given the benefit of the doubt; its controller
	// refuses an unknown location).
	has := func(node, loc string) bool {
		s, known := sumOf[node]
		if !known {
			return true
		}
		_, ok := s[loc+"@"+node]
		return ok
	}
	type cand struct {
		PlacementCandidate
		reqs  []*clusterpb.PlacementRequirement
		resv  []*clusterpb.PlacementReservation
		known int // requirements resident
	}
	var cands []*cand
	for _, node := range nodes {
		c := &cand{PlacementCandidate: PlacementCandidate{Node: node, TierRanks: make([]int, len(req.Requirements)), Fits: true}}
		ok := true
		for i, r := range req.Requirements {
			pr := &clusterpb.PlacementRequirement{Value: r.Value}
			first := -1
			for t, tier := range reqRefs[i] {
				var locs []string
				for _, ref := range tier {
					if ref.on(n.name, node) && has(node, ref.loc) {
						locs = append(locs, ref.loc)
					}
				}
				if len(locs) == 0 {
					continue
				}
				if first < 0 {
					first = t
				}
				pr.Tiers = append(pr.Tiers, &clusterpb.PlacementTier{Locations: locs})
			}
			if first < 0 {
				ok = false
				break
			}
			c.TierRanks[i] = first
			c.reqs = append(c.reqs, pr)
			// Residency and room.
			var size int64
			resident := false
			for _, x := range where[r.Value] {
				size = x.Bytes
				if x.Node == node && x.State != "leaving" {
					resident = true
					c.Resident = append(c.Resident, r.Value+" at "+x.Location)
				}
			}
			if resident {
				c.known++
			}
			free, have := int64(-1), false
			if s, has := sumOf[node]; has {
				c.HasSummary = true
				for _, loc := range pr.Tiers[0].Locations {
					l, there := s[loc+"@"+node]
					if !there {
						continue
					}
					f := int64(math.MaxInt64)
					if l.HasBudget {
						f = l.BudgetBytes - l.UsedBytes - l.ReservedBytes
					}
					if !have || f > free {
						free, have = f, true
					}
				}
			}
			if have {
				if c.FreeBytes < math.MaxInt64-max(free, 0) {
					c.FreeBytes += max(free, 0)
				} else {
					c.FreeBytes = math.MaxInt64
				}
			}
			if !resident && (!have || free < size) {
				c.Fits = false
			}
		}
		if !ok {
			continue
		}
		for i, r := range req.Reservations {
			if !resvRefs[i].on(n.name, node) || !has(node, resvRefs[i].loc) {
				ok = false
				break
			}
			c.resv = append(c.resv, &clusterpb.PlacementReservation{Name: r.Name, Location: resvRefs[i].loc, Bytes: r.Bytes})
		}
		if !ok {
			continue
		}
		if !c.HasSummary {
			c.Fits = false
		}
		cands = append(cands, c)
	}
	sort.SliceStable(cands, func(i, j int) bool {
		a, b := cands[i], cands[j]
		for k := range a.TierRanks {
			if a.TierRanks[k] != b.TierRanks[k] {
				return a.TierRanks[k] < b.TierRanks[k]
			}
		}
		if a.known != b.known {
			return a.known > b.known
		}
		if a.Fits != b.Fits {
			return a.Fits
		}
		if a.HasSummary != b.HasSummary {
			return a.HasSummary
		}
		if a.FreeBytes != b.FreeBytes {
			return a.FreeBytes > b.FreeBytes
		}
		return a.Node < b.Node
	})
	evidence := make([]PlacementCandidate, len(cands))
	for i, c := range cands {
		evidence[i] = c.PlacementCandidate
	}
	perr := &PlacementError{Request: req.Name, Candidates: evidence, Directory: notes}
	for i, c := range cands {
		if len(perr.Attempts) == maxAttempts || ctx.Err() != nil {
			for _, rest := range cands[i:] {
				perr.NotTried = append(perr.NotTried, rest.Node)
			}
			break
		}
		if !live[c.Node] {
			perr.Attempts = append(perr.Attempts, PlacementAttempt{Node: c.Node, Err: &budget.UnavailableError{Location: "@" + c.Node, Reason: budget.UnavailableLocation,
				Detail: fmt.Sprintf("node %q is not a member of cluster %q (members: %v)", c.Node, n.opts.ClusterName, members)}})
			continue
		}
		id := fmt.Sprintf("%s/%d/%d", n.name, n.epoch, n.placeSeq.Add(1))
		t := n.timeout(ctx)
		if dl, has := ctx.Deadline(); has && len(cands)-i > 1 && len(perr.Attempts)+1 < maxAttempts {
			// Leave the other candidates half of the time left.
			t = min(t, max(time.Until(dl)/2, time.Millisecond))
		}
		attemptDL := time.Now().Add(t)
		callerDL, hasDL := ctx.Deadline()
		callerBound := hasDL && !callerDL.After(attemptDL)
		actx, cancel := context.WithDeadline(ctx, attemptDL)
		msg := &clusterpb.AdmitPlacement{PlacementId: id, Owner: n.name, Name: req.Name, Requirements: c.reqs, Reservations: c.resv,
			StateLimit: int32(req.StateLimit), TimeoutMs: t.Milliseconds(), Hold: req.Hold}
		r, err := n.request(actx, c.Node, msg)
		cancel()
		if err != nil && ctx.Err() == nil && time.Until(attemptDL) < 50*time.Millisecond {
			if callerBound {
				// The request's timer fired a hair before the caller's
				// deadline: that deadline is what ended it.
				<-ctx.Done()
			} else {
				err = &budget.UnavailableError{Location: "@" + c.Node, Reason: budget.UnavailableLocation,
					Detail: fmt.Sprintf("node %q did not answer the placement within this attempt's bound (%s: RequestTimeout, at most half the caller's time left while other candidates remain)", c.Node, t)}
			}
		}
		if err != nil {
			// The node may still admit after we stopped waiting: tell it
			// to exit the placement when it does.
			if pid, perr := n.endpointOf(c.Node); perr == nil {
				n.csys.Root.Send(pid, &clusterpb.ReleasePlacement{PlacementId: id})
			}
			perr.Attempts = append(perr.Attempts, PlacementAttempt{Node: c.Node, Err: err})
			continue
		}
		rep, ok := r.(*clusterpb.AdmitPlacementReply)
		if !ok {
			perr.Attempts = append(perr.Attempts, PlacementAttempt{Node: c.Node, Err: fmt.Errorf("residency: node %q answered AdmitPlacement with %T", c.Node, r)})
			continue
		}
		if !rep.Admitted {
			var e error = &budget.UnavailableError{Location: "@" + c.Node, Reason: budget.UnavailableLocation, Detail: "refused without a reason"}
			if rep.Error != nil {
				e = placementFromRemote(rep.Error)
			}
			perr.Attempts = append(perr.Attempts, PlacementAttempt{Node: c.Node, Err: e})
			continue
		}
		p := &Placement{Request: req.Name, Node: c.Node, Candidates: evidence, Directory: notes, from: n, id: id, hold: req.Hold,
			Attempts: append(perr.Attempts, PlacementAttempt{Node: c.Node}),
			Decision: NodeDecision{Node: c.Node, ExpectedStateVersion: rep.ExpectedStateVersion, ExploredStates: int(rep.ExploredStates),
				Exhaustive: rep.Exhaustive, Reclaim: rep.Reclaim, Reservations: rep.Reservations, Enter: rep.Enter}}
		for _, e := range rep.Evictions {
			p.Decision.Evictions = append(p.Decision.Evictions, PlacementEviction{Value: e.Value, Location: e.Location, Bytes: e.Bytes, Reason: e.Reason})
		}
		p.Why = placementWhy(c.PlacementCandidate, len(p.Attempts))
		if len(notes) > 0 {
			p.Why += "; " + strings.Join(notes, "; ")
		}
		return p, nil
	}
	if err := ctx.Err(); err != nil {
		perr.Ctx = err
	}
	return nil, perr
}

// maxLookups bounds the directory lookups one placement runs at once.
const maxLookups = 8

// lookUp asks the directory where each distinct requirement value is
// resident, up to maxLookups at once, each lookup bounded by
// RequestTimeout and half the caller's time left (the rest is for the
// nodes). A lookup that fails (its grain's member is gone, or it did not
// answer within its bound) is a note, and the ranking goes on without
// it. The caller's context ending during the lookups is a
// [*PlacementError] saying so.
func (n *Node) lookUp(ctx context.Context, req PlacementRequest) (map[string][]Residency, []string, error) {
	var values []string
	seen := map[string]bool{}
	for _, r := range req.Requirements {
		if !seen[r.Value] {
			seen[r.Value] = true
			values = append(values, r.Value)
		}
	}
	t := n.timeout(ctx)
	if dl, ok := ctx.Deadline(); ok {
		t = min(t, max(time.Until(dl)/2, time.Millisecond))
	}
	lookupDL := time.Now().Add(t)
	lctx, cancel := context.WithDeadline(ctx, lookupDL)
	defer cancel()
	res := make([][]Residency, len(values))
	errs := make([]error, len(values))
	late := make([]bool, len(values)) // failed at the lookup bound
	look := func(i int) {
		res[i], errs[i] = n.WhereIs(lctx, values[i])
		late[i] = !time.Now().Before(lookupDL)
	}
	if len(values) == 1 {
		look(0)
	} else {
		sem := make(chan struct{}, maxLookups)
		var wg sync.WaitGroup
		for i := range values {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				look(i)
			}()
		}
		wg.Wait()
	}
	where := map[string][]Residency{}
	var notes []string
	for i, v := range values {
		where[v] = res[i]
		err := errs[i]
		if err == nil {
			continue
		}
		if cerr := ctx.Err(); cerr != nil {
			return nil, nil, &PlacementError{Request: req.Name, Stage: fmt.Sprintf("asking the directory where %s is resident", v), Ctx: cerr}
		}
		// The directory is a preference, not a must: rank without it.
		var un *budget.UnavailableError
		switch {
		case errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &un) && late[i]):
			notes = append(notes, fmt.Sprintf("directory did not answer for %s within %s: ranked by room only", v, t.Round(time.Millisecond)))
		default:
			notes = append(notes, fmt.Sprintf("directory lookup for %s failed (%v): ranked by room only", v, err))
		}
		n.log.Debug().Err(err).Str("value", v).Msg("residency placement: directory lookup failed")
	}
	return where, notes, nil
}

func placementWhy(c PlacementCandidate, attempt int) string {
	var parts []string
	if len(c.Resident) > 0 {
		parts = append(parts, "already resident there: "+strings.Join(c.Resident, ", "))
	}
	switch {
	case !c.HasSummary:
		parts = append(parts, "room unknown (no summary yet)")
	case c.Fits && c.FreeBytes == math.MaxInt64:
		parts = append(parts, "room: unlimited")
	case c.Fits:
		parts = append(parts, fmt.Sprintf("room: %d bytes free", c.FreeBytes))
	default:
		parts = append(parts, fmt.Sprintf("short of room per its summary (%d bytes free): its controller may evict", c.FreeBytes))
	}
	s := fmt.Sprintf("node %s ranked %d; %s; tiers %v", c.Node, attempt, strings.Join(parts, "; "), c.TierRanks)
	if attempt > 1 {
		s += fmt.Sprintf("; admitted at attempt %d after %d refusal(s)", attempt, attempt-1)
	}
	return s
}

// ---- the node asked --------------------------------------------------------

// heldTable is what this node holds for other nodes: placements' scopes
// and remote leases, by the caller's id.
type heldTable struct {
	mu        sync.Mutex
	m         map[string]*heldEntry
	cancelled map[string]time.Time // released before their admission completed
}

type heldEntry struct {
	owner string
	scope *system.Scope
	lease *system.Lease
}

func (e *heldEntry) release(ctx context.Context) error {
	if e.scope != nil {
		return e.scope.Exit(ctx)
	}
	return e.lease.Release(ctx)
}

// keep stores e under id, unless its release already came, the node is
// closing, or the caller stopped waiting (deadline): then e is released
// and false returned.
func (t *heldTable) keep(ctx context.Context, n *Node, id string, e *heldEntry, deadline time.Time) bool {
	t.mu.Lock()
	_, gone := t.cancelled[id]
	delete(t.cancelled, id)
	late := time.Now().After(deadline)
	if !gone && !late && !n.closed.Load() {
		if t.m == nil {
			t.m = map[string]*heldEntry{}
		}
		t.m[id] = e
		t.mu.Unlock()
		return true
	}
	t.mu.Unlock()
	if err := e.release(context.WithoutCancel(ctx)); err != nil && !errors.Is(err, system.ErrClosed) {
		n.log.Warn().Err(err).Str("id", id).Msg("residency node: releasing what a caller no longer waits for")
	}
	return false
}

// drop releases id; an id not held yet is remembered so that its
// admission, when it completes, is released at once.
func (t *heldTable) drop(ctx context.Context, n *Node, id string) error {
	t.mu.Lock()
	e := t.m[id]
	delete(t.m, id)
	if e == nil {
		if t.cancelled == nil {
			t.cancelled = map[string]time.Time{}
		}
		now := time.Now()
		for k, at := range t.cancelled {
			if now.Sub(at) > 10*n.opts.RequestTimeout {
				delete(t.cancelled, k)
			}
		}
		t.cancelled[id] = now
	}
	t.mu.Unlock()
	if e == nil {
		return nil
	}
	return e.release(ctx)
}

// releaseOrphans releases what nodes that left the cluster held here, or
// everything when all (the node closes).
func (t *heldTable) releaseOrphans(ctx context.Context, n *Node, all bool) {
	live := map[string]bool{}
	if !all {
		for _, m := range n.Members() {
			live[m] = true
		}
	}
	var gone []*heldEntry
	t.mu.Lock()
	for id, e := range t.m {
		if all || !live[e.owner] {
			gone = append(gone, e)
			delete(t.m, id)
		}
	}
	t.mu.Unlock()
	for _, e := range gone {
		if err := e.release(context.WithoutCancel(ctx)); err != nil && !errors.Is(err, system.ErrClosed) {
			n.log.Warn().Err(err).Str("owner", e.owner).Msg("residency node: releasing what a departed node held")
		}
	}
}

// receivePlacement handles the placement and remote lease messages;
// false for any other message.
func (n *Node) receivePlacement(ctx actor.Context) bool {
	switch m := ctx.Message().(type) {
	case *clusterpb.AdmitPlacement:
		n.serveHeld(ctx, m.TimeoutMs, func(c context.Context, deadline time.Time) any { return n.admitPlacement(c, m, deadline) },
			&clusterpb.AdmitPlacementReply{PlacementId: m.PlacementId, Error: toRemote(system.ErrClosed)})
	case *clusterpb.ReleasePlacement:
		n.serveHeld(ctx, 0, func(c context.Context, _ time.Time) any {
			return &clusterpb.ReleasePlacementReply{Error: placementToRemote(n.held.drop(c, n, m.PlacementId))}
		}, &clusterpb.ReleasePlacementReply{})
	case *clusterpb.AcquireLease:
		n.serveHeld(ctx, m.TimeoutMs, func(c context.Context, deadline time.Time) any { return n.acquireLease(c, m, deadline) },
			&clusterpb.AcquireLeaseReply{LeaseId: m.LeaseId, Error: toRemote(system.ErrClosed)})
	case *clusterpb.ReleaseLease:
		n.serveHeld(ctx, 0, func(c context.Context, _ time.Time) any {
			return &clusterpb.ReleaseLeaseReply{Error: placementToRemote(n.held.drop(c, n, m.LeaseId))}
		}, &clusterpb.ReleaseLeaseReply{})
	default:
		return false
	}
	return true
}

// serveHeld runs handle on its own goroutine with a context bounded by
// timeoutMs (the caller's wait; RequestTimeout when 0) and answers the
// sender; a closed node answers closed at once.
func (n *Node) serveHeld(ctx actor.Context, timeoutMs int64, handle func(context.Context, time.Time) any, closed any) {
	sender := ctx.Sender()
	if n.closed.Load() {
		if sender != nil {
			ctx.Respond(closed)
		}
		return
	}
	t := n.opts.RequestTimeout
	if timeoutMs > 0 {
		t = time.Duration(timeoutMs) * time.Millisecond
	}
	deadline := time.Now().Add(t)
	n.workWG.Add(1)
	go func() {
		defer n.workWG.Done()
		c, cancel := context.WithDeadline(context.Background(), deadline)
		defer cancel()
		reply := handle(c, deadline)
		if sender != nil {
			n.csys.Root.Send(sender, reply)
		}
	}()
}

func (n *Node) admitPlacement(ctx context.Context, m *clusterpb.AdmitPlacement, deadline time.Time) *clusterpb.AdmitPlacementReply {
	rep := &clusterpb.AdmitPlacementReply{PlacementId: m.PlacementId}
	fail := func(err error) *clusterpb.AdmitPlacementReply { rep.Error = placementToRemote(err); return rep }
	req := system.Request{Name: m.Name}
	for _, r := range m.Requirements {
		h, err := n.sys.Lookup(ctx, r.Value)
		if err != nil {
			return fail(&budget.UnavailableError{Handle: r.Value, Location: "@" + n.name, Reason: budget.UnavailableSource,
				Detail: fmt.Sprintf("node %q has no value named %q: %v", n.name, r.Value, err)})
		}
		rq := system.Requirement{Handle: h}
		for _, t := range r.Tiers {
			rq.Tiers = append(rq.Tiers, t.Locations)
		}
		req.Requirements = append(req.Requirements, rq)
	}
	for _, r := range m.Reservations {
		req.Reservations = append(req.Reservations, system.ReservationSpec{Name: r.Name, Location: r.Location, Bytes: r.Bytes})
	}
	sc, d, err := n.sys.AdmitWithLimit(ctx, req, int(m.StateLimit))
	rep.ExpectedStateVersion, rep.ExploredStates, rep.Exhaustive = d.ExpectedStateVersion, int64(d.ExploredStates), d.Exhaustive
	for _, a := range d.Plan.Reclaim {
		rep.Reclaim = append(rep.Reclaim, a.String())
	}
	for _, r := range d.Plan.Reservations {
		rep.Reservations = append(rep.Reservations, r.String())
	}
	for _, a := range d.Plan.Enter {
		rep.Enter = append(rep.Enter, a.String())
	}
	for _, e := range d.Evictions {
		rep.Evictions = append(rep.Evictions, &clusterpb.PlacementEviction{Value: e.Handle.Name, Location: e.Location + "@" + n.name, Bytes: e.Bytes, Reason: e.Reason})
	}
	if err != nil {
		return fail(err)
	}
	if !m.Hold {
		if err := sc.Exit(context.WithoutCancel(ctx)); err != nil {
			return fail(err)
		}
		rep.Admitted = true
		return rep
	}
	if !n.held.keep(ctx, n, m.PlacementId, &heldEntry{owner: m.Owner, scope: sc}, deadline) {
		return fail(&budget.UnavailableError{Location: "@" + n.name, Reason: budget.UnavailableLocation,
			Detail: fmt.Sprintf("node %q admitted placement %s after its caller stopped waiting (or released it); it was exited", n.name, m.PlacementId)})
	}
	rep.Admitted = true
	return rep
}

// ---- remote leases ---------------------------------------------------------

// RemoteLease is a lease held on another node's materialization (see
// [Node.AcquireRemote]).
type RemoteLease struct {
	Node     string
	Location string // the owner's location, unqualified
	Bytes    int64

	from     *Node
	id       string
	released atomic.Bool
}

// AcquireRemote takes a lease on a resident materialization of a value of
// node: while it is held, node keeps the materialization charged and
// never evicts or moves it away (as [system.System.Acquire] on that node). h is
// the owner's handle, or just a name (empty Manager). loc is the owner's
// location, unqualified ("" = the first resident one in preference
// order). The owner releases the lease on [RemoteLease.Release], when this
// node leaves the cluster, or when it closes. Errors: [*system.UnavailableError]
// when node is not a member or does not answer within RequestTimeout (or
// ctx's deadline), or has no such value resident; the owner's
// [*system.InUseError]/[*system.UnavailableError] from Acquire.
func (n *Node) AcquireRemote(ctx context.Context, node string, h system.Handle, loc string) (*RemoteLease, error) {
	if h.Name == "" {
		return nil, &budget.InvalidInputError{Message: "acquire remote: the handle has no name"}
	}
	id := fmt.Sprintf("%s/%d/l%d", n.name, n.epoch, n.placeSeq.Add(1))
	t := n.timeout(ctx)
	r, err := n.request(ctx, node, &clusterpb.AcquireLease{LeaseId: id, Owner: n.name, Location: loc, TimeoutMs: t.Milliseconds(),
		Handle: &clusterpb.HandleRef{ManagerId: h.Manager, Id: h.ID, Name: h.Name}})
	if err != nil {
		if pid, perr := n.endpointOf(node); perr == nil {
			n.csys.Root.Send(pid, &clusterpb.ReleaseLease{LeaseId: id})
		}
		return nil, err
	}
	rep, ok := r.(*clusterpb.AcquireLeaseReply)
	if !ok {
		return nil, fmt.Errorf("residency: node %q answered AcquireLease with %T", node, r)
	}
	if rep.Error != nil {
		return nil, placementFromRemote(rep.Error)
	}
	return &RemoteLease{Node: node, Location: rep.Location, Bytes: rep.Bytes, from: n, id: id}, nil
}

// Release releases the lease on its node. Releasing twice is a no-op.
// Errors: the node cannot be reached ([*system.UnavailableError]).
func (l *RemoteLease) Release(ctx context.Context) error {
	if l.released.Swap(true) {
		return nil
	}
	r, err := l.from.request(ctx, l.Node, &clusterpb.ReleaseLease{LeaseId: l.id})
	if err != nil {
		l.released.Store(false)
		return err
	}
	if rep, ok := r.(*clusterpb.ReleaseLeaseReply); ok && rep.Error != nil {
		return placementFromRemote(rep.Error)
	}
	return nil
}

func (n *Node) acquireLease(ctx context.Context, m *clusterpb.AcquireLease, deadline time.Time) *clusterpb.AcquireLeaseReply {
	rep := &clusterpb.AcquireLeaseReply{LeaseId: m.LeaseId}
	fail := func(err error) *clusterpb.AcquireLeaseReply { rep.Error = placementToRemote(err); return rep }
	if m.Handle == nil {
		return fail(&budget.InvalidInputError{Message: "acquire lease: no handle"})
	}
	h := system.Handle{Manager: m.Handle.ManagerId, ID: m.Handle.Id, Name: m.Handle.Name}
	loc := m.Location
	if h.Manager == "" || loc == "" {
		if h.Manager == "" {
			var err error
			if h, err = n.sys.Lookup(ctx, m.Handle.Name); err != nil {
				return fail(&budget.UnavailableError{Handle: m.Handle.Name, Location: "@" + n.name, Reason: budget.UnavailableSource,
					Detail: fmt.Sprintf("node %q has no value %q: %v", n.name, m.Handle.Name, err)})
			}
		}
		if loc == "" {
			snap, err := n.sys.Snapshot(ctx)
			if err != nil {
				return fail(err)
			}
			if loc, rep.Bytes, err = sourceOf(snap, h, "", n.name); err != nil {
				return fail(err)
			}
		}
	}
	lease, err := n.sys.Acquire(ctx, h, loc)
	if err != nil {
		return fail(err)
	}
	if !n.held.keep(ctx, n, m.LeaseId, &heldEntry{owner: m.Owner, lease: lease}, deadline) {
		return fail(&budget.UnavailableError{Location: "@" + n.name, Reason: budget.UnavailableLocation,
			Detail: fmt.Sprintf("node %q acquired lease %s after its caller stopped waiting (or released it); it was released", n.name, m.LeaseId)})
	}
	rep.Location = loc
	if buf := lease.Buffer(); buf != nil {
		rep.Bytes = buf.Size()
	}
	return rep
}

// ---- errors across nodes, placement kinds ----------------------------------

// placementToRemote is toRemote with the controller's errors too.
func placementToRemote(err error) *clusterpb.RemoteError {
	if err == nil {
		return nil
	}
	var (
		pe *budget.PlanExecutionError
		pl *budget.PlanError
		sl *budget.SearchLimitError
	)
	switch {
	case errors.As(err, &pe):
		return &clusterpb.RemoteError{Kind: clusterpb.RemoteError_PLAN_EXECUTION, Message: err.Error(), Detail: pe.Phase, Cause: placementToRemote(pe.Cause)}
	case errors.As(err, &sl):
		return &clusterpb.RemoteError{Kind: clusterpb.RemoteError_SEARCH_LIMIT, Message: err.Error(), Handle: sl.RequestName,
			RequestedBytes: int64(sl.StateLimit), UsedBytes: int64(sl.ExploredStates), Detail: sl.Detail}
	case errors.As(err, &pl):
		return &clusterpb.RemoteError{Kind: clusterpb.RemoteError_PLAN, Message: err.Error(), Detail: pl.Reason}
	}
	return toRemote(err)
}

func placementFromRemote(r *clusterpb.RemoteError) error {
	switch r.Kind {
	case clusterpb.RemoteError_PLAN:
		return &budget.PlanError{Reason: r.Detail}
	case clusterpb.RemoteError_SEARCH_LIMIT:
		return &budget.SearchLimitError{RequestName: r.Handle, StateLimit: int(r.RequestedBytes), ExploredStates: int(r.UsedBytes), Detail: r.Detail}
	case clusterpb.RemoteError_PLAN_EXECUTION:
		e := &budget.PlanExecutionError{Phase: r.Detail, FailedActionIndex: -1, FailedReservationIndex: -1}
		if r.Cause != nil {
			e.Cause = placementFromRemote(r.Cause)
		} else {
			e.Cause = errors.New(r.Message)
		}
		return e
	}
	return fromRemote(r)
}

// probesFirst: the requests before which a node checks that the member's
// port answers (a crashed member's port is closed: an answer at once
// instead of a request timeout).
func probesFirst(msg any) bool {
	switch msg.(type) {
	case *clusterpb.OpenStream, *clusterpb.AdmitPlacement, *clusterpb.AcquireLease:
		return true
	}
	return false
}

// summaryCache keeps every member's summary decoded, by gossip sequence
// number: Summaries (and so every placement) decodes only what changed
// since the last call instead of every member's summary.
type summaryCache struct {
	mu sync.Mutex
	m  map[string]cachedSummary // by member id
}

type cachedSummary struct {
	seq int64
	ns  NodeSummary
}

func (c *summaryCache) decode(member string, kv *protocluster.GossipKeyValue) (NodeSummary, bool) {
	if kv == nil || kv.Value == nil {
		return NodeSummary{}, false
	}
	c.mu.Lock()
	e, ok := c.m[member]
	c.mu.Unlock()
	if ok && e.seq == kv.SequenceNumber {
		ns := e.ns
		ns.Locations = slices.Clone(ns.Locations) // the caller's to keep
		return ns, true
	}
	var s clusterpb.NodeSummary
	if err := anypb.UnmarshalTo(kv.Value, &s, proto.UnmarshalOptions{}); err != nil {
		return NodeSummary{}, false
	}
	ns := NodeSummary{Node: s.Node, Epoch: s.Epoch, StateVersion: s.StateVersion}
	for _, l := range s.Locations {
		ns.Locations = append(ns.Locations, LocationSummary{Location: l.Location, HasBudget: l.HasBudget, BudgetBytes: l.BudgetBytes, UsedBytes: l.UsedBytes, ReservedBytes: l.ReservedBytes})
	}
	c.mu.Lock()
	if c.m == nil {
		c.m = map[string]cachedSummary{}
	}
	c.m[member] = cachedSummary{seq: kv.SequenceNumber, ns: ns}
	c.mu.Unlock()
	ns.Locations = slices.Clone(ns.Locations)
	return ns, true
}

// prune forgets members that are no longer in the gossip state.
func (c *summaryCache) prune(st map[string]*protocluster.GossipKeyValue) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for m := range c.m {
		if _, ok := st[m]; !ok {
			delete(c.m, m)
		}
	}
}
