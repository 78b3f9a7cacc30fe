package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/faulty"
	"github.com/residency-go/residency/system"
)

// The embedded scenario: an inference server with two simulated GPUs. It
// walks a new user through the runtime one step at a time — placement,
// leases, a budget refusal, a controller decision, a scope, an injected
// fault — and checks the bytes after every move. Sizes are scaled down so
// that the simulation runs in a moment: 1 MiB here stands for 1 GiB.

const (
	kiB = int64(1) << 10
	miB = int64(1) << 20
)

// model is one value of the scenario.
type model struct {
	name   string
	bytes  int64
	mode   system.ReplicaMode
	at     string // resident at registration, with data
	source string // or reconstructible from a loader at this location
	why    string
}

var models = []model{
	{name: "tokenizer", bytes: 512 * kiB, mode: system.Replicable, at: "pageable-host",
		why: "registered resident in host memory with its bytes; replicable, so every GPU may keep a copy"},
	{name: "embedder", bytes: 2 * miB, mode: system.Replicable, source: "pinned-host",
		why: "reconstructible: its loader runs into pinned-host memory whenever a copy is needed"},
	{name: "llm-small", bytes: 4 * miB, mode: system.Exclusive, source: "pageable-host",
		why: "exclusive (one copy at a time), loaded from its checkpoint through pageable-host"},
	{name: "llm-large", bytes: 5 * miB, mode: system.Exclusive, source: "pageable-host",
		why: "exclusive, loaded through pageable-host"},
}

// scenario carries the demo's runtime and output.
type scenario struct {
	ctx     context.Context
	sys     *system.System
	backend *faulty.Backend // the soft backend behind the fault injector
	out     io.Writer
	handles map[string]system.Handle
	step    int
}

func scenarioMain(ctx context.Context, stdout, stderr io.Writer) int {
	began := time.Now()
	s := &scenario{ctx: ctx, out: stdout, handles: map[string]system.Handle{}}
	err := s.run()
	if err != nil {
		fmt.Fprintf(stderr, "demo: the scenario failed: %v\n", err)
		if s.sys != nil {
			_ = s.sys.Close(context.WithoutCancel(ctx))
		}
	}
	if s.backend != nil {
		s.backend.Close() // after the runtime
	}
	if err != nil {
		return 1
	}
	fmt.Fprintf(stdout, "\nDone in %s.\n", time.Since(began).Round(time.Millisecond))
	return 0
}

// say starts a step: one line saying what happens and why.
func (s *scenario) say(format string, args ...any) {
	s.step++
	fmt.Fprintf(s.out, "\n%2d. %s\n", s.step, fmt.Sprintf(format, args...))
}

// show prints an indented line of evidence under the current step.
func (s *scenario) show(format string, args ...any) {
	fmt.Fprintf(s.out, "    %s\n", fmt.Sprintf(format, args...))
}

// expected returns the bytes the scenario gave model m.
func expected(m model) []byte {
	b := make([]byte, m.bytes)
	fill(m.name, 0, b)
	return b
}

func modelNamed(name string) model {
	for _, m := range models {
		if m.name == name {
			return m
		}
	}
	panic("no model " + name)
}

// run plays the scenario, act by act; the first failure ends it.
func (s *scenario) run() error {
	for _, act := range []func() error{s.start, s.registerModels, s.placeModels, s.leases, s.reservations, s.decideAndEnter, s.checkData, s.faultyScope, s.finish} {
		if err := act(); err != nil {
			return err
		}
	}
	return nil
}

// start starts the runtime with the demo's four locations.
func (s *scenario) start() error {
	ctx := s.ctx
	fmt.Fprintln(s.out, "residency demo: an inference server with two GPUs, simulated")
	fmt.Fprintln(s.out, "Backend: "+"soft (simulated devices) — every location is ordinary Go memory holding real bytes,")
	fmt.Fprintln(s.out, "copied by goroutine streams with real events. No GPU is used and no timing here says anything about hardware.")
	fmt.Fprintln(s.out, "Sizes are scaled down: 1 MiB here stands for 1 GiB on a real server.")

	locs := []system.LocationConfig{
		system.NoLimit("pageable-host"),
		system.Limit("pinned-host", 16*miB),
		system.Limit("cuda:0", 8*miB),
		system.Limit("cuda:1", 8*miB),
	}
	s.say("Start the runtime with four locations; the GPUs get strict budgets of 8 MiB each.")
	backend, err := newSoftBackend(locs) // simulated devices, asked for by name
	if err != nil {
		return err
	}
	s.backend = backend // closed by scenarioMain, after the runtime
	sys, err := system.Start(ctx, system.Options{ManagerID: "demo", Locations: locs, Backend: backend})
	if err != nil {
		return err
	}
	s.sys = sys
	for _, l := range locs {
		b := "no budget"
		if l.HasBudget {
			b = "budget " + formatBytes(l.BudgetBytes)
		}
		s.show("%-14s %s", l.Name, b)
	}
	s.show("the runtime reports its device backend as %q", sys.Backend().Name())
	return nil
}

// registerModels registers the four models.
func (s *scenario) registerModels() error {
	ctx := s.ctx
	sys := s.sys
	s.say("Register four models. A value is charged its full size at every location it occupies.")
	for _, m := range models {
		v := system.Value{Name: m.name, Bytes: m.bytes, Mode: m.mode}
		if m.at != "" {
			v.At, v.Data = m.at, expected(m)
		} else {
			v.Source, v.Loader = m.source, deterministicLoader(m.name)
		}
		h, err := sys.Register(ctx, v)
		if err != nil {
			return fmt.Errorf("register %s: %w", m.name, err)
		}
		s.handles[m.name] = h
		s.show("%-10s %7s %-10s — %s", m.name, formatBytes(m.bytes), m.mode, m.why)
	}
	return nil
}

// placeModels places the models on the GPUs.
func (s *scenario) placeModels() error {
	ctx := s.ctx
	sys := s.sys
	s.say("Place the models on the GPUs. Each placement is admitted against the budget before any byte moves.")
	for _, p := range []struct{ name, loc, why string }{
		{"llm-small", "cuda:0", "reconstructed by its loader (a temporary buffer at pageable-host, then a copy)"},
		{"embedder", "cuda:0", "reconstructed through pinned-host"},
		{"llm-large", "cuda:1", "reconstructed through pageable-host"},
		{"tokenizer", "cuda:1", "copied from its resident host copy; the host copy stays (replicable)"},
	} {
		if err := sys.Place(ctx, s.handles[p.name], p.loc); err != nil {
			return fmt.Errorf("place %s at %s: %w", p.name, p.loc, err)
		}
		s.show("%-10s → %s: %s", p.name, p.loc, p.why)
	}
	if err := s.usage("cuda:0", "cuda:1"); err != nil {
		return err
	}
	return nil
}

// leases shows leases and events protecting a value.
func (s *scenario) leases() error {
	ctx := s.ctx
	sys := s.sys
	s.say("Acquire never places: a lease on a model that is not at that location is refused.")
	_, err := sys.Acquire(ctx, s.handles["embedder"], "cuda:1")
	var ue *system.UnavailableError
	if !errors.As(err, &ue) {
		return fmt.Errorf("acquire embedder at cuda:1: want an UnavailableError, got %v", err)
	}
	s.show("ResidencyUnavailableError: handle=%s location=%s detail=%q", ue.Handle, ue.Location, ue.Detail)

	s.say("A request is running on llm-small: take a lease, then try to evict it. The lease protects it.")
	lease, err := sys.Acquire(ctx, s.handles["llm-small"], "cuda:0")
	if err != nil {
		return err
	}
	if err := s.expectInUse("llm-small", "cuda:0"); err != nil {
		return err
	}

	s.say("The request queues a kernel that reads the weights: record its event, release the lease. The event still protects them.")
	ev := system.NewManualEvent()
	evID, err := lease.RecordEvent(ctx, ev)
	if err != nil {
		return err
	}
	if err := lease.Release(ctx); err != nil {
		return err
	}
	if err := s.expectInUse("llm-small", "cuda:0"); err != nil {
		return err
	}

	s.say("The kernel finishes: its event completes and the runtime reaps it. Now nothing protects llm-small.")
	ev.Complete()
	if err := sys.WaitReaped(ctx, evID); err != nil {
		return err
	}
	if err := s.protection("llm-small", "cuda:0"); err != nil {
		return err
	}
	return nil
}

// reservations shows a reservation refused for the budget.
func (s *scenario) reservations() error {
	ctx := s.ctx
	sys := s.sys
	s.say("Reserve 2 MiB of KV cache on cuda:0 (bytes the model will allocate itself), then ask for 1 MiB more.")
	if err := sys.Reserve(ctx, "cuda:0", "kv-cache", 2*miB); err != nil {
		return err
	}
	s.show("kv-cache: 2 MiB reserved at cuda:0")
	err := sys.Reserve(ctx, "cuda:0", "kv-extra", 1*miB)
	var be *system.BudgetError
	if !errors.As(err, &be) {
		return fmt.Errorf("reserve kv-extra: want a BudgetError, got %v", err)
	}
	s.show("refused, nothing changed. ResidencyBudgetError: location=%s budget_bytes=%d used_bytes=%d reserved_bytes=%d requested_bytes=%d",
		be.Location, be.BudgetBytes, be.UsedBytes, be.ReservedBytes, be.RequestedBytes)
	s.show("(used %s + reserved %s + requested %s > budget %s)", formatBytes(be.UsedBytes), formatBytes(be.ReservedBytes),
		formatBytes(be.RequestedBytes), formatBytes(be.BudgetBytes))
	return nil
}

// decideAndEnter asks the controller for a decision and enters its scope.
func (s *scenario) decideAndEnter() error {
	ctx := s.ctx
	sys := s.sys
	s.say("A user asks for llm-large on cuda:0 next to the embedder. It does not fit as things are: ask the controller.")
	req := system.Request{
		Name: "chat-large",
		Requirements: []system.Requirement{
			{Handle: s.handles["llm-large"], Tiers: [][]string{{"cuda:0"}}},
			{Handle: s.handles["embedder"], Tiers: [][]string{{"cuda:0"}, {"cuda:1"}}},
		},
	}
	if err := sys.Unreserve(ctx, "kv-cache"); err != nil {
		return err
	}
	s.show("(first the KV reservation is returned: the old session ended)")
	dec, err := sys.Decide(ctx, req)
	if err != nil {
		return fmt.Errorf("decide: %w", err)
	}
	s.show("expected_state_version=%d explored_states=%d exhaustive=%v", dec.ExpectedStateVersion, dec.ExploredStates, dec.Exhaustive)
	for _, e := range dec.Evictions {
		s.show("evict %s at %s (%s): %s", e.Handle.Name, e.Location, formatBytes(e.Bytes), e.Reason)
	}
	s.show("plan: %s", planText(dec.Plan))
	s.show("predicted peak: %s", peaksText(dec.Explanation.PredictedPeakBytes))

	s.say("Enter a scope for the decision: it checks the state version, reclaims, enters, and leases what it entered.")
	sc := sys.ScopeFor(dec)
	if err := sc.Enter(ctx); err != nil {
		return fmt.Errorf("enter the decision's scope: %w", err)
	}
	for _, t := range sc.Report().Transitions {
		s.show("%s", transitionText(t))
	}
	s.show("the scope holds %d leases while the request runs", len(sc.Leases()))
	if err := sc.Exit(ctx); err != nil {
		return fmt.Errorf("exit the scope: %w", err)
	}
	s.show("exit: leases released")
	if err := s.usage("cuda:0", "cuda:1"); err != nil {
		return err
	}
	return nil
}

// checkData checks every moved model's bytes.
func (s *scenario) checkData() error {
	s.say("Check the data: every model that moved reads back exactly the bytes it was given.")
	if err := s.checkBytes(); err != nil {
		return err
	}
	return nil
}

// faultyScope runs a scope whose copy fails, then retries.
func (s *scenario) faultyScope() error {
	ctx := s.ctx
	sys := s.sys
	s.say("Inject a fault: the next copy into cuda:1 fails (soft backend fault injection). Then run a scope that needs it.")
	s.backend.Faults().Arm(cuda.FaultCopy, "cuda:1")
	plan := system.Plan{
		Reservations: []system.ReservationSpec{{Name: "warmup", Location: "cuda:1", Bytes: 512 * kiB}},
		Enter: []system.Action{
			{Handle: s.handles["llm-small"], Location: "pinned-host"},
			{Handle: s.handles["tokenizer"], Location: "cuda:1"},
			{Handle: s.handles["embedder"], Location: "cuda:1"},
		},
	}
	s.show("plan: %s", planText(plan))
	err := sys.NewScope(plan).Enter(ctx)
	var pe *system.PlanExecutionError
	if !errors.As(err, &pe) {
		return fmt.Errorf("faulty scope: want a PlanExecutionError, got %v", err)
	}
	s.show("ResidencyPlanExecutionError: phase=%s failed_action=%s failed_action_index=%d", pe.Phase, pe.FailedAction, pe.FailedActionIndex)
	s.show("partial report (these stay committed, nothing is rolled back):")
	for _, t := range pe.PartialReport.Transitions {
		s.show("  %s", transitionText(t))
	}
	s.show("cause: %v", pe.Cause)
	snap, err := sys.Snapshot(ctx)
	if err != nil {
		return err
	}
	if l, ok := snap.Location("cuda:1"); ok {
		s.show("the scope's warmup reservation was released: cuda:1 reserved_bytes=%d", l.ReservedBytes)
	}

	s.say("Retry without the fault: the copy succeeds, and the bytes are checked again.")
	if err := sys.Place(ctx, s.handles["embedder"], "cuda:1"); err != nil {
		return err
	}
	if err := s.checkBytes(); err != nil {
		return err
	}
	return nil
}

// finish shows the snapshot, closes the runtime and checks nothing stays charged.
func (s *scenario) finish() error {
	ctx := s.ctx
	sys := s.sys
	s.say("Snapshot: one atomic view of every location (peak = the highest used + reserved ever seen).")
	snap, err := sys.Snapshot(ctx)
	if err != nil {
		return err
	}
	s.snapshotTable(snap)

	s.say("Close: the runtime frees everything and every location returns to zero bytes.")
	if err := sys.Close(ctx); err != nil {
		return fmt.Errorf("close: %w", err)
	}
	final, err := sys.Snapshot(ctx)
	if err != nil {
		return err
	}
	var total int64
	for _, l := range final.Locations {
		total += l.UsedBytes + l.ReservedBytes
	}
	s.show("closed at state version %d; bytes still charged anywhere: %d", final.StateVersion, total)
	if total != 0 {
		return fmt.Errorf("after close %d bytes are still charged", total)
	}
	return nil
}

// expectInUse tries to evict name at loc and shows the InUseError.
func (s *scenario) expectInUse(name, loc string) error {
	err := s.sys.Evict(s.ctx, s.handles[name], loc)
	var ie *system.InUseError
	if !errors.As(err, &ie) {
		return fmt.Errorf("evict %s at %s: want an InUseError, got %v", name, loc, err)
	}
	s.show("evict refused. ResidencyInUseError: handle=%s location=%s use_count=%d hold_count=%d pending_event_count=%d",
		ie.Handle, ie.Location, ie.UseCount, ie.HoldCount, ie.PendingEventCount)
	return nil
}

// protection shows the protection counts of name at loc.
func (s *scenario) protection(name, loc string) error {
	snap, err := s.sys.Snapshot(s.ctx)
	if err != nil {
		return err
	}
	v, _ := snap.Value(name)
	for _, m := range v.Materializations {
		if m.Location == loc {
			s.show("%s at %s: use_count=%d hold_count=%d pending_event_count=%d (state version %d)",
				name, loc, m.UseCount, m.HoldCount, m.PendingEventCount, snap.StateVersion)
			return nil
		}
	}
	return fmt.Errorf("%s is not at %s", name, loc)
}

// usage shows what each location holds.
func (s *scenario) usage(locs ...string) error {
	snap, err := s.sys.Snapshot(s.ctx)
	if err != nil {
		return err
	}
	for _, loc := range locs {
		l, _ := snap.Location(loc)
		var held []string
		for _, v := range snap.Values {
			for _, m := range v.Materializations {
				if m.Location == loc {
					held = append(held, v.Handle.Name)
				}
			}
		}
		s.show("%s: %s of %s used (%s)", loc, formatBytes(l.UsedBytes), formatBytes(l.BudgetBytes), strings.Join(held, ", "))
	}
	return nil
}

// checkBytes reads every resident materialization back and compares it
// with the model's bytes.
func (s *scenario) checkBytes() error {
	snap, err := s.sys.Snapshot(s.ctx)
	if err != nil {
		return err
	}
	for _, v := range snap.Values {
		want := expected(modelNamed(v.Handle.Name))
		for _, m := range v.Materializations {
			got, err := s.sys.Read(s.ctx, v.Handle, m.Location)
			if err != nil {
				return fmt.Errorf("read %s at %s: %w", v.Handle.Name, m.Location, err)
			}
			if !bytes.Equal(got, want) {
				return fmt.Errorf("check FAILED: %s at %s does not read back its bytes", v.Handle.Name, m.Location)
			}
			s.show("check: %-10s at %-13s %7s identical ✓", v.Handle.Name, m.Location, formatBytes(int64(len(got))))
		}
	}
	return nil
}

func (s *scenario) snapshotTable(snap system.Snapshot) {
	tw := tabwriter.NewWriter(s.out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "    location\tbudget\tused\treserved\tpeak\t")
	for _, l := range snap.Locations {
		b := "none"
		if l.HasBudget {
			b = formatBytes(l.BudgetBytes)
		}
		fmt.Fprintf(tw, "    %s\t%s\t%s\t%s\t%s\t\n", l.Location, b, formatBytes(l.UsedBytes), formatBytes(l.ReservedBytes), formatBytes(l.PeakBytes))
	}
	_ = tw.Flush()
	for _, v := range snap.Values {
		var at []string
		for _, m := range v.Materializations {
			at = append(at, m.Location)
		}
		s.show("%-10s at %s", v.Handle.Name, strings.Join(at, ", "))
	}
	s.show("state version %d", snap.StateVersion)
}

func planText(p system.Plan) string {
	var parts []string
	for _, a := range p.Reclaim {
		parts = append(parts, "reclaim "+a.Handle.Name+"@"+a.Location)
	}
	for _, r := range p.Reservations {
		parts = append(parts, fmt.Sprintf("reserve %s %s@%s", r.Name, formatBytes(r.Bytes), r.Location))
	}
	for _, a := range p.Enter {
		t := "enter " + a.Handle.Name + "@" + a.Location
		if a.From != "" {
			t += " from " + a.From
		}
		parts = append(parts, t)
	}
	return strings.Join(parts, " → ")
}

func peaksText(m map[string]int64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sortLocations(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + " " + formatBytes(m[k])
	}
	return strings.Join(parts, ", ")
}

func transitionText(t system.Transition) string {
	s := fmt.Sprintf("v%-3d %-8s", t.Version, t.Kind)
	if t.Handle != "" {
		s += " " + t.Handle
	}
	if t.Location != "" {
		s += " at " + t.Location
	}
	if t.Bytes != 0 {
		s += " (" + formatBytes(t.Bytes) + ")"
	}
	if t.Detail != "" {
		s += ": " + t.Detail
	}
	return s
}
