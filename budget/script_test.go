package budget

// Data-driven ledger scripts: testdata/*.txt.
//
// A script is a sequence of blocks. Each block is one command line, a line
// "----", and the command's expected output up to the next blank line.
// Lines starting with '#' and blank lines between blocks are comments.
// TestScripts replays every file on a fresh ledger, audits every command
// with the checked harness (CheckInvariants after each one; a refused
// command must leave the version and the snapshot unchanged), and compares
// the output with the golden text. `go test ./budget -run TestScripts
// -update` rewrites the golden output in place (review the diff by hand:
// it must be what docs/semantics.md says, not merely what the code does).
//
// Every command's output ends with "version N (+d)": the state version
// after the command and how many versions it committed. Errors print as
// "error *budget.T" followed by every field of T, the message, and the
// categories the error matches (errors.Is with ErrPlan, ErrInvalidInput,
// ErrDiscarded, ErrForeign).
//
// Commands (names are value names, resolved to the latest handle of that
// name, retired ones included; "NAME#ID" is the handle with that id and
// name, e.g. a retired handle whose name was registered again; a name
// never registered stands for an unknown handle (id 0), "foreign:NAME" for
// NAME's handle under another manager id; ADM is an admission id or
// "last", the latest pending one):
//
//	start LOC[=BYTES] … [manager=ID] [trace=N] [spill=LOC>TARGET,…]
//	                      new ledger; LOC alone: no budget
//	register NAME BYTES [exclusive|replicable] at=LOC|source=LOC
//	register-done NAME BYTES [MODE] at=LOC        register and complete
//	place NAME LOC        copy NAME FROM TO        move NAME FROM TO
//	place-done NAME LOC   place and complete when pending
//	complete ADM          fail ADM [CAUSE…]        fail-direct ADM [CAUSE…]
//	evict NAME LOC        discard NAME
//	acquire NAME LOC      release LEASE            record LEASE      reap EVENT
//	hold NAME LOC         unhold HOLD
//	reserve LOC NAME BYTES          unreserve NAME
//	reserve-owned LOC NAME BYTES OWNER          unreserve-owned NAME OWNER
//	explain PLAN
//	run ID [scope=S] [expect=N|current] PLAN    StartRun; then:
//	next ID               step-complete ID         step-fail ID [CAUSE…]     finish ID
//	execute [scope=S] [expect=N|current] PLAN   StartRun, every step completed, Finish
//	decide NAME [limit=N] [tie=first-listed|most-free] need=NAME@TIER/TIER… … [reserve=…]
//	                      a TIER is LOC or LOC+LOC (equally preferred)
//	snapshot              trace                    version
//
// PLAN is any of: reclaim=NAME@LOC,… reserve=RES@LOC=BYTES,…
// enter=NAME@LOC[<FROM],…; a reclaim item NAME@LOC>TO is a demotion.
// step-fail on a demotion prints the effects of the drop that replaces
// it (the run goes on).

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden output of testdata/*.txt")

type scriptBlock struct {
	comments []string // comment and blank lines before the command
	command  string
	output   []string
}

func parseScript(t *testing.T, path string) ([]scriptBlock, []string) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	var blocks []scriptBlock
	var pending []string
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			pending = append(pending, line)
			continue
		}
		b := scriptBlock{comments: pending, command: line}
		pending = nil
		if i+1 >= len(lines) || lines[i+1] != "----" {
			t.Fatalf("%s:%d: command %q is not followed by ----", path, i+1, line)
		}
		i += 2
		for ; i < len(lines) && lines[i] != ""; i++ {
			b.output = append(b.output, lines[i])
		}
		blocks = append(blocks, b)
	}
	return blocks, pending
}

func renderScript(blocks []scriptBlock, trailing []string) string {
	var b strings.Builder
	for _, bl := range blocks {
		for _, c := range bl.comments {
			b.WriteString(c + "\n")
		}
		b.WriteString(bl.command + "\n----\n")
		for _, o := range bl.output {
			b.WriteString(o + "\n")
		}
		b.WriteString("\n")
	}
	for _, c := range trailing {
		b.WriteString(c + "\n")
	}
	return strings.TrimRight(b.String(), "\n") + "\n"
}

func TestScripts(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	seen := map[string]bool{}
	ran := 0
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			ran++
			blocks, trailing := parseScript(t, path)
			s := &scriptRunner{t: t, runs: map[string]*checkedRun{}}
			for i := range blocks {
				got := s.exec(blocks[i].command)
				for _, line := range got {
					if strings.HasPrefix(strings.TrimSpace(line), "error *budget.") {
						seen[strings.TrimPrefix(strings.TrimSpace(line), "error ")] = true
					}
				}
				if *update {
					blocks[i].output = got
					continue
				}
				if want := blocks[i].output; !reflect.DeepEqual(got, want) {
					t.Errorf("%s: command %q\n--- got:\n%s\n--- want:\n%s", path, blocks[i].command, strings.Join(got, "\n"), strings.Join(want, "\n"))
				}
			}
			if *update {
				if err := os.WriteFile(path, []byte(renderScript(blocks, trailing)), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
	// Together the scripts must show every error type of the ledger.
	if ran < len(files) {
		return // -run selected some of them
	}
	for _, want := range []string{"*budget.BudgetError", "*budget.PlanError", "*budget.SearchLimitError", "*budget.StaleStateError",
		"*budget.InUseError", "*budget.UnavailableError", "*budget.PlanExecutionError", "*budget.InvalidInputError"} {
		if !seen[want] {
			t.Errorf("no script produces %s", want)
		}
	}
}

type scriptRunner struct {
	t       *testing.T
	c       *checked
	lastAdm AdmissionID
	runs    map[string]*checkedRun
	out     []string
}

func (s *scriptRunner) printf(format string, args ...any) {
	s.out = append(s.out, fmt.Sprintf(format, args...))
}

// exec runs one command line and returns its output lines.
func (s *scriptRunner) exec(line string) []string {
	s.out = nil
	fields := strings.Fields(line)
	cmd, args := fields[0], fields[1:]
	var before uint64
	if s.c != nil {
		before = s.c.L.Version()
	}
	if err := s.dispatch(cmd, args); err != nil {
		s.printErr(err, "")
	}
	if cmd == "start" {
		before = 0
	}
	if s.c != nil {
		v := s.c.L.Version()
		s.printf("version %d (+%d)", v, v-before)
	}
	return s.out
}

func (s *scriptRunner) dispatch(cmd string, args []string) error {
	if cmd != "start" && s.c == nil {
		s.t.Fatalf("%s before start", cmd)
	}
	c := s.c
	switch cmd {
	case "start":
		return s.start(args)
	case "register", "register-done":
		spec := ValueSpec{Name: s.arg(args, 0), Bytes: s.int(s.arg(args, 1))}
		for _, a := range args[2:] {
			switch {
			case a == "exclusive":
				spec.Mode = Exclusive
			case a == "replicable":
				spec.Mode = Replicable
			case strings.HasPrefix(a, "at="):
				spec.At = strings.TrimPrefix(a, "at=")
			case strings.HasPrefix(a, "source="):
				spec.Source = strings.TrimPrefix(a, "source=")
			default:
				s.t.Fatalf("register: bad argument %q", a)
			}
		}
		h, a, err := c.Register(spec)
		if err != nil {
			return err
		}
		s.printf("handle %s (id %d)", h.Name, h.ID)
		if a.Pending {
			s.printAdmission(a)
		}
		if cmd == "register-done" && a.Pending {
			return s.complete(a.ID)
		}
		return nil
	case "place", "place-done":
		a, err := c.Place(s.handle(s.arg(args, 0)), s.arg(args, 1))
		if err != nil {
			return err
		}
		s.printAdmission(a)
		if cmd == "place-done" && a.Pending {
			return s.complete(a.ID)
		}
		return nil
	case "copy", "move":
		h, from, to := s.handle(s.arg(args, 0)), s.arg(args, 1), s.arg(args, 2)
		var a Admission
		var err error
		if cmd == "copy" {
			a, err = c.Copy(h, from, to)
		} else {
			a, err = c.Move(h, from, to)
		}
		if err != nil {
			return err
		}
		s.printAdmission(a)
		return nil
	case "complete":
		return s.complete(s.admission(s.arg(args, 0)))
	case "fail":
		if err := c.Fail(s.admission(s.arg(args, 0)), s.cause(args[1:])); err != nil {
			return err
		}
		s.printf("failed")
		return nil
	case "fail-direct":
		err := c.FailDirect(s.admission(s.arg(args, 0)), s.cause(args[1:]))
		return err
	case "evict", "discard":
		var effs []Effect
		var err error
		if cmd == "evict" {
			effs, err = c.Evict(s.handle(s.arg(args, 0)), s.arg(args, 1))
		} else {
			effs, err = c.Discard(s.handle(s.arg(args, 0)))
		}
		if err != nil {
			return err
		}
		s.printEffects("removed", effs)
		return nil
	case "acquire":
		id, err := c.Acquire(s.handle(s.arg(args, 0)), s.arg(args, 1))
		if err != nil {
			return err
		}
		s.printf("lease %d", id)
		return nil
	case "release":
		if err := c.Release(LeaseID(s.int(s.arg(args, 0)))); err != nil {
			return err
		}
		s.printf("released")
		return nil
	case "record":
		id, err := c.RecordEvent(LeaseID(s.int(s.arg(args, 0))))
		if err != nil {
			return err
		}
		s.printf("event %d", id)
		return nil
	case "reap":
		if err := c.ReapEvent(EventID(s.int(s.arg(args, 0)))); err != nil {
			return err
		}
		s.printf("reaped")
		return nil
	case "hold":
		id, err := c.Hold(s.handle(s.arg(args, 0)), s.arg(args, 1))
		if err != nil {
			return err
		}
		s.printf("hold %d", id)
		return nil
	case "unhold":
		if err := c.Unhold(HoldID(s.int(s.arg(args, 0)))); err != nil {
			return err
		}
		s.printf("released")
		return nil
	case "reserve", "reserve-owned":
		var err error
		if cmd == "reserve" {
			err = c.Reserve(s.arg(args, 0), s.arg(args, 1), s.int(s.arg(args, 2)))
		} else {
			err = c.ReserveOwned(s.arg(args, 0), s.arg(args, 1), s.int(s.arg(args, 2)), s.arg(args, 3))
		}
		if err != nil {
			return err
		}
		s.printf("reserved")
		return nil
	case "unreserve", "unreserve-owned":
		var err error
		if cmd == "unreserve" {
			err = c.Unreserve(s.arg(args, 0))
		} else {
			err = c.UnreserveOwned(s.arg(args, 0), s.arg(args, 1))
		}
		if err != nil {
			return err
		}
		s.printf("released")
		return nil
	case "explain":
		p, _ := s.plan(args)
		s.printExplanation(c.Explain(p), "")
		return nil
	case "run":
		p, opts := s.plan(args[1:])
		r, err := c.StartRun(p, opts)
		if err != nil {
			return err
		}
		s.runs[args[0]] = r
		s.printf("started")
		return nil
	case "next", "step-complete", "step-fail", "finish":
		if s.run(args) == nil {
			s.printf("no run %q (it never started)", args[0])
			return nil
		}
		return s.step(cmd, args)
	case "execute":
		p, opts := s.plan(args)
		r, err := c.StartRun(p, opts)
		if err != nil {
			return err
		}
		for {
			st, ok, err := r.Next()
			if err != nil {
				return err
			}
			if !ok {
				break
			}
			s.printStep(st)
			if st.Admission.Pending {
				if _, err := r.Complete(); err != nil {
					return err
				}
			}
		}
		rep, leases, err := r.Finish()
		if err != nil {
			return err
		}
		s.printFinish(rep, leases)
		return nil
	case "decide":
		return s.decide(args)
	case "snapshot":
		s.printSnapshot(c.Snapshot())
		return nil
	case "trace":
		tr := c.L.Trace()
		if len(tr) == 0 {
			s.printf("(empty)")
		}
		for _, x := range tr {
			s.printf("%s", x)
		}
		return nil
	case "version":
		return nil
	}
	s.t.Fatalf("unknown command %q", cmd)
	return nil
}

func (s *scriptRunner) step(cmd string, args []string) error {
	r := s.run(args)
	switch cmd {
	case "next":
		st, ok, err := r.Next()
		if err != nil {
			return err
		}
		if !ok {
			s.printf("no more steps")
			return nil
		}
		s.printStep(st)
		return nil
	case "step-complete":
		effs, err := r.Complete()
		if err != nil {
			return err
		}
		s.printEffects("completed", effs)
		return nil
	case "step-fail":
		effs, err := r.FailStep(s.cause(args[1:]))
		if err != nil {
			return err
		}
		s.printEffects("demotion failed; dropped instead", effs)
		return nil
	case "finish":
		rep, leases, err := r.Finish()
		if err != nil {
			return err
		}
		s.printFinish(rep, leases)
		return nil
	}
	return nil
}

func (s *scriptRunner) arg(args []string, i int) string {
	if i >= len(args) {
		s.t.Fatalf("missing argument %d", i+1)
	}
	return args[i]
}

func (s *scriptRunner) int(a string) int64 {
	n, err := strconv.ParseInt(a, 10, 64)
	if err != nil {
		s.t.Fatalf("bad number %q", a)
	}
	return n
}

func (s *scriptRunner) cause(words []string) error {
	if len(words) == 0 {
		return errors.New("injected failure")
	}
	return errors.New(strings.Join(words, " "))
}

func (s *scriptRunner) handle(name string) Handle {
	if n, ok := strings.CutPrefix(name, "foreign:"); ok {
		h := s.handle(n)
		h.Manager = "other-manager"
		return h
	}
	if n, id, ok := strings.Cut(name, "#"); ok {
		return Handle{Manager: s.c.L.ManagerID(), ID: uint64(s.int(id)), Name: n}
	}
	if h, ok := s.c.L.Lookup(name); ok {
		return h
	}
	// A retired handle whose name was freed (discarded; a failed
	// registration is not in snapshots and stays unknown).
	vals := s.c.L.Snapshot().Values
	for i := len(vals) - 1; i >= 0; i-- {
		if vals[i].Handle.Name == name {
			return vals[i].Handle
		}
	}
	return Handle{Manager: s.c.L.ManagerID(), Name: name}
}

func (s *scriptRunner) admission(a string) AdmissionID {
	if a == "last" {
		return s.lastAdm
	}
	return AdmissionID(s.int(a))
}

// run returns the run named by args[0]; a run that never started (its
// StartRun was refused) is reported by the caller.
func (s *scriptRunner) run(args []string) *checkedRun {
	return s.runs[s.arg(args, 0)]
}

func (s *scriptRunner) complete(id AdmissionID) error {
	effs, err := s.c.Complete(id)
	if err != nil {
		return err
	}
	s.printEffects("completed", effs)
	return nil
}

func (s *scriptRunner) start(args []string) error {
	s.c = nil
	cfg := Config{ManagerID: "m1"}
	var spill []string
	for _, a := range args {
		switch {
		case strings.HasPrefix(a, "manager="):
			cfg.ManagerID = strings.TrimPrefix(a, "manager=")
		case strings.HasPrefix(a, "trace="):
			cfg.TraceCapacity = int(s.int(strings.TrimPrefix(a, "trace=")))
		case strings.HasPrefix(a, "spill="):
			spill = strings.Split(strings.TrimPrefix(a, "spill="), ",")
		default:
			name, budget, has := strings.Cut(a, "=")
			lc := LocationConfig{Name: name}
			if has {
				lc.HasBudget, lc.BudgetBytes = true, s.int(budget)
			}
			cfg.Locations = append(cfg.Locations, lc)
		}
	}
	for _, sp := range spill {
		from, to, _ := strings.Cut(sp, ">")
		for i := range cfg.Locations {
			if cfg.Locations[i].Name == from {
				cfg.Locations[i].SpillTo = to
			}
		}
	}
	l, err := New(cfg)
	if err != nil {
		return err
	}
	s.c = &checked{t: s.t, L: l}
	s.runs = map[string]*checkedRun{}
	s.printf("manager %s, locations %s, trace capacity %d", l.ManagerID(), strings.Join(l.Locations(), " "), cfg.TraceCapacity)
	if st := l.SpillTargets(); st != nil {
		var parts []string
		for _, loc := range l.Locations() {
			if t, ok := st[loc]; ok {
				parts = append(parts, loc+"→"+t)
			}
		}
		s.printf("spill targets %s", strings.Join(parts, " "))
	}
	return nil
}

// plan parses PLAN arguments and the run options scope= and expect=.
func (s *scriptRunner) plan(args []string) (Plan, RunOptions) {
	var p Plan
	var opts RunOptions
	action := func(item string) Action {
		item, to, _ := strings.Cut(item, ">")
		item, from, _ := strings.Cut(item, "<")
		name, loc, ok := strings.Cut(item, "@")
		if !ok {
			s.t.Fatalf("bad action %q: want NAME@LOC", item)
		}
		return Action{Handle: s.handle(name), Location: loc, From: from, To: to}
	}
	for _, a := range args {
		key, val, _ := strings.Cut(a, "=")
		items := strings.Split(val, ",")
		switch key {
		case "reclaim":
			for _, it := range items {
				p.Reclaim = append(p.Reclaim, action(it))
			}
		case "enter":
			for _, it := range items {
				p.Enter = append(p.Enter, action(it))
			}
		case "reserve":
			for _, it := range items {
				nl, b, _ := strings.Cut(it, "=")
				name, loc, _ := strings.Cut(nl, "@")
				p.Reservations = append(p.Reservations, ReservationSpec{Name: name, Location: loc, Bytes: s.int(b)})
			}
		case "scope":
			opts.Scope = val
		case "expect":
			opts.CheckVersion = true
			if val == "current" {
				opts.ExpectedVersion = s.c.L.Version()
			} else {
				opts.ExpectedVersion = uint64(s.int(val))
			}
		default:
			s.t.Fatalf("bad plan argument %q", a)
		}
	}
	return p, opts
}

func (s *scriptRunner) decide(args []string) error {
	req := Request{Name: s.arg(args, 0)}
	limit := 0
	for _, a := range args[1:] {
		key, val, _ := strings.Cut(a, "=")
		switch key {
		case "limit":
			limit = int(s.int(val))
		case "tie":
			switch val {
			case "first-listed":
				req.TieBreak = TieFirstListed
			case "most-free":
				req.TieBreak = TieMostFree
			default:
				req.TieBreak = TieBreak(s.int(val)) // a number, to reach the unknown-value check
			}
		case "need":
			name, tiers, _ := strings.Cut(val, "@")
			r := Requirement{Handle: s.handle(name)}
			for _, tier := range strings.Split(tiers, "/") {
				r.Tiers = append(r.Tiers, strings.Split(tier, "+"))
			}
			req.Requirements = append(req.Requirements, r)
		case "reserve":
			p, _ := s.plan([]string{a})
			req.Reservations = p.Reservations
		default:
			s.t.Fatalf("bad decide argument %q", a)
		}
	}
	var d Decision
	err := s.c.do("Decide", read, func() (e error) { d, e = s.c.L.Decide(req, limit); return })
	if err != nil {
		return err
	}
	s.printf("decision %q expected_state_version=%d explored_states=%d exhaustive=%v", d.RequestName, d.ExpectedStateVersion, d.ExploredStates, d.Exhaustive)
	for _, e := range d.Evictions {
		if e.To != "" {
			s.printf("  evict %s at %s to %s (%d bytes, %s): %s", e.Handle.Name, e.Location, e.To, e.Bytes, e.Kind, e.Reason)
			continue
		}
		s.printf("  evict %s at %s (%d bytes): %s", e.Handle.Name, e.Location, e.Bytes, e.Reason)
	}
	s.printPlan(d.Plan)
	s.printExplanation(d.Explanation, "  ")
	return nil
}
