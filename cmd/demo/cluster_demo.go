package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/residency-go/residency/internal/nodeproc"
)

// clusterDemoOptions configures `demo cluster-demo`.
type clusterDemoOptions struct {
	provider string // "etcd", "automanaged" or "" (etcd when installed)
	exe      string // the binary that runs `node` (default: this one)
	// started, when set, is told the node and etcd processes and the
	// temporary folder once they exist (tests check they are gone after).
	started func(pids []int, dir string)
}

func clusterDemoMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("demo cluster-demo", flag.ContinueOnError)
	var o clusterDemoOptions
	fs.StringVar(&o.provider, "provider", "", "membership `provider`: etcd or automanaged (default: etcd when /usr/bin/etcd is installed)")
	fs.StringVar(&o.exe, "exe", "", "the demo `binary` that runs each node (default: this one)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: demo cluster-demo [--provider etcd|automanaged]")
		fs.PrintDefaults()
	}
	if code, ok := parseFlags(fs, args, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "demo cluster-demo: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if o.provider != "" && o.provider != "etcd" && o.provider != "automanaged" {
		fmt.Fprintf(stderr, "demo cluster-demo: --provider %q: want etcd or automanaged\n", o.provider)
		return 2
	}
	return clusterDemo(ctx, o, stdout, stderr)
}

// demoLog collects a process's standard error, shown when the demo fails.
type demoLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *demoLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *demoLog) tail(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.b.String()
	if len(s) > n {
		s = "…" + s[len(s)-n:]
	}
	return s
}

const (
	demoValue = "weights"
	demoBytes = 16 << 20
	demoSeed  = 42
)

// clusterDemo runs the scenario; every process it starts is stopped and
// its temporary folder removed before it returns, also when ctx ends
// (Ctrl-C: exit status 130).
func clusterDemo(ctx context.Context, o clusterDemoOptions, stdout, stderr io.Writer) (code int) {
	if o.exe == "" {
		exe, err := os.Executable()
		if err != nil {
			fmt.Fprintf(stderr, "demo cluster-demo: cannot find this program to start the nodes: %v\n", err)
			return 1
		}
		o.exe = exe
	}
	etcdBin := nodeproc.EtcdBinary()
	if o.provider == "" {
		o.provider = "automanaged"
		if etcdBin != "" {
			o.provider = "etcd"
		}
	}
	if o.provider == "etcd" && etcdBin == "" {
		fmt.Fprintln(stderr, "demo cluster-demo: etcd is not installed (Debian: apt-get install etcd-server, or make etcd); try --provider automanaged")
		return 1
	}
	dir, err := os.MkdirTemp("", "residency-cluster-demo-")
	if err != nil {
		fmt.Fprintf(stderr, "demo cluster-demo: %v\n", err)
		return 1
	}
	logs := map[string]*demoLog{}
	var etcd *nodeproc.Etcd
	procs := map[string]*nodeproc.Proc{}
	killed := map[string]bool{}
	step := 0
	say := func(format string, args ...any) {
		step++
		fmt.Fprintf(stdout, "%d. "+format+"\n", append([]any{step}, args...)...)
	}
	defer func() {
		interrupted := ctx.Err() != nil
		if interrupted {
			fmt.Fprintln(stdout, "Interrupted: stopping the nodes and etcd, removing the temporary folder.")
		} else {
			step++
			what := "the nodes leave the cluster (SIGTERM)"
			if etcd != nil {
				what += ", etcd stops"
			}
			fmt.Fprintf(stdout, "%d. Stopping: %s, the temporary folder is removed.\n", step, what)
		}
		var wg sync.WaitGroup
		for name, p := range procs {
			if killed[name] {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := p.Stop(30 * time.Second); err != nil && !interrupted {
					fmt.Fprintf(stderr, "demo cluster-demo: %s: %v\n", name, err)
					code = 1
				}
			}()
		}
		wg.Wait()
		if etcd != nil {
			etcd.Stop(10 * time.Second)
		}
		if code != 0 && !interrupted {
			for _, name := range slices.Sorted(maps.Keys(logs)) {
				fmt.Fprintf(stderr, "--- end of the log of %s ---\n%s\n", name, logs[name].tail(3000))
			}
		}
		if err := os.RemoveAll(dir); err != nil {
			fmt.Fprintf(stderr, "demo cluster-demo: removing %s: %v\n", dir, err)
		}
		if interrupted {
			code = exitInterrupted
		} else if code == 0 {
			fmt.Fprintln(stdout, "Done.")
		}
	}()
	fail := func(what string, err error) int {
		if ctx.Err() != nil {
			return exitInterrupted
		}
		fmt.Fprintf(stderr, "demo cluster-demo: %s: %v\n", what, err)
		return 1
	}

	fmt.Fprintf(stdout, "Three residency nodes on this machine, each a process with its own memory budgets (simulated GPUs), joined in one cluster.\n\n")
	var pids []int
	nodeArgs := func(name string) []string {
		return []string{"node", "--name", name, "--provider", o.provider, "--location", "pageable-host=256MiB", "--location", "cuda:0=64MiB"}
	}
	names := []string{"node-a", "node-b", "node-c"}
	args := map[string][]string{}
	if o.provider == "etcd" {
		logs["etcd"] = &demoLog{}
		sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		etcd, err = nodeproc.StartEtcd(sctx, etcdBin, dir+"/etcd", logs["etcd"])
		cancel()
		if err != nil {
			return fail("starting etcd", err)
		}
		say("Started etcd (%s) on %s with its data in %s: the nodes find each other through it.", etcdBin, etcd.Endpoint, dir)
		for _, n := range names {
			args[n] = append(nodeArgs(n), "--etcd", etcd.Endpoint)
		}
	} else {
		if etcdBin == "" {
			say("etcd is not installed (/usr/bin/etcd, Debian's etcd-server), so the nodes use the automanaged provider: each serves a health check on 127.0.0.1 and polls the others'.")
		} else {
			say("Using the automanaged provider (no etcd): each node serves a health check on 127.0.0.1 and polls the others'.")
		}
		health := map[string]string{}
		for _, n := range names {
			port, err := nodeproc.FreePort()
			if err != nil {
				return fail("finding a free port", err)
			}
			health[n] = fmt.Sprintf("127.0.0.1:%d", port)
		}
		for _, n := range names {
			var peers []string
			for _, m := range names {
				if m != n {
					peers = append(peers, health[m])
				}
			}
			args[n] = append(nodeArgs(n), "--automanaged-addr", health[n], "--peers", strings.Join(peers, ","))
		}
	}
	if etcd != nil {
		pids = append(pids, etcd.PID())
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	var startErr error
	sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	for _, n := range names {
		log, a := &demoLog{}, args[n]
		logs[n] = log
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := nodeproc.Start(sctx, o.exe, a, log)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				startErr = errors.Join(startErr, err)
				return
			}
			procs[n] = p
			pids = append(pids, p.PID())
		}()
	}
	wg.Wait()
	cancel()
	if o.started != nil {
		o.started(pids, dir)
	}
	if startErr != nil {
		return fail("starting the nodes", startErr)
	}
	for _, n := range names {
		if err := demoWaitMembers(ctx, procs[n], names); err != nil {
			return fail(n+" waiting for the others", err)
		}
	}
	say("Started node-a, node-b and node-c (processes %d, %d, %d), each with pageable-host 256 MiB and cuda:0 64 MiB. Every node lists all three as members.",
		procs["node-a"].PID(), procs["node-b"].PID(), procs["node-c"].PID())

	wantSum := digestOf(nodeproc.Pattern(demoSeed, demoBytes))
	r, err := demoDo(ctx, procs["node-a"], nodeproc.Command{Op: "register", Name: demoValue, Bytes: demoBytes, At: "cuda:0", Seed: demoSeed})
	if err != nil {
		return fail("node-a registering "+demoValue, err)
	}
	say("node-a loads %q (16 MiB) onto its cuda:0. Its bytes have sha256 %s…", demoValue, r.SHA256[:16])

	r, err = demoDo(ctx, procs["node-b"], nodeproc.Command{Op: "copy", Name: demoValue, From: "node-a", Bytes: demoBytes, At: "cuda:0"})
	if err != nil {
		return fail("node-b copying from node-a", err)
	}
	same := "identical"
	if r.SHA256 != wantSum {
		same = "DIFFERENT"
	}
	say("node-b copies %q from node-a into its own cuda:0: the bytes stream over the cluster in 1 MiB chunks while node-a protects its copy with a lease. Read back on node-b: sha256 %s… — %s, in %.0f ms.",
		demoValue, r.SHA256[:16], same, r.ElapsedMS)
	if r.SHA256 != wantSum {
		return fail("the copy on node-b", errors.New("its bytes differ from node-a's"))
	}

	var where []string
	for {
		r, err = demoDo(ctx, procs["node-c"], nodeproc.Command{Op: "whereis", Name: demoValue})
		if err != nil {
			return fail("node-c asking the directory", err)
		}
		where = where[:0]
		for _, res := range r.Residency {
			if res.State == "resident" {
				where = append(where, res.Location)
			}
		}
		if len(where) == 2 {
			break
		}
		if err := demoSleep(ctx, 100*time.Millisecond); err != nil {
			return fail("waiting for the directory", err)
		}
	}
	say("Where is %q? node-c asks the directory (one request to the value's directory grain): resident at %s.", demoValue, strings.Join(where, " and "))

	var lines []string
	for {
		r, err = demoDo(ctx, procs["node-c"], nodeproc.Command{Op: "summaries"})
		if err != nil {
			return fail("node-c reading the summaries", err)
		}
		lines = lines[:0]
		usedB := false
		for _, s := range r.Summaries {
			for _, l := range s.Locations {
				if strings.HasPrefix(l.Location, "cuda:0@") {
					lines = append(lines, fmt.Sprintf("   %-7s cuda:0  %5.1f MiB used of %.0f MiB", s.Node, float64(l.UsedBytes)/(1<<20), float64(l.BudgetBytes)/(1<<20)))
					usedB = usedB || (s.Node == "node-b" && l.UsedBytes >= demoBytes)
				}
			}
		}
		if len(r.Summaries) == 3 && usedB {
			break
		}
		if err := demoSleep(ctx, 100*time.Millisecond); err != nil {
			return fail("waiting for the summaries", err)
		}
	}
	say("What each node holds, from the compact summaries the nodes gossip (node-c's view):\n%s", strings.Join(lines, "\n"))

	if code := demoPlace(ctx, procs, say, fail); code != 0 {
		return code
	}

	crash := time.Now()
	procs["node-a"].Kill()
	killed["node-a"] = true
	for _, n := range []string{"node-b", "node-c"} {
		if err := demoWaitMembers(ctx, procs[n], []string{"node-b", "node-c"}); err != nil {
			return fail(n+" waiting for node-a to drop out", err)
		}
	}
	say("node-a crashes (kill -9: no goodbye). %.1f s later node-b and node-c list only [node-b node-c] as members.", time.Since(crash).Seconds())

	r, err = procs["node-c"].Do(ctx, nodeproc.Command{Op: "copy", Name: demoValue + "-from-a", Remote: demoValue, From: "node-a", Bytes: demoBytes, At: "cuda:0", TimeoutMS: 5000})
	if err != nil {
		return fail("node-c asking node-a", err)
	}
	if r.OK {
		return fail("node-c asking node-a", errors.New("a copy from the dead node succeeded"))
	}
	msg := r.Error
	if i := strings.Index(msg, "residency unavailable"); i >= 0 {
		msg = msg[i:] // the cause, without the plan's context
	}
	if len(msg) > 160 {
		msg = msg[:160] + "…"
	}
	say("node-c asks node-a for %q: refused after %.0f ms with an %s:\n   %s", demoValue, r.ElapsedMS, r.ErrorType, msg)

	r, err = demoDo(ctx, procs["node-c"], nodeproc.Command{Op: "copy", Name: demoValue, From: "node-b", Bytes: demoBytes, At: "cuda:0"})
	if err != nil {
		return fail("node-c copying from node-b", err)
	}
	same = "identical"
	if r.SHA256 != wantSum {
		same = "DIFFERENT"
	}
	say("node-c copies %q from node-b instead: sha256 %s… — %s. The value survived node-a's crash because node-b had a copy.", demoValue, r.SHA256[:16], same)
	if r.SHA256 != wantSum {
		return fail("the copy on node-c", errors.New("its bytes differ from node-a's"))
	}
	return 0
}

// demoDo runs a command that must succeed (a failed reply is an error).
func demoDo(ctx context.Context, p *nodeproc.Proc, c nodeproc.Command) (nodeproc.Reply, error) {
	r, err := p.Do(ctx, c)
	if err == nil && !r.OK {
		err = fmt.Errorf("%s: %s", r.ErrorType, r.Error)
	}
	return r, err
}

// demoWaitMembers waits (at most a minute) until p lists exactly want.
func demoWaitMembers(ctx context.Context, p *nodeproc.Proc, want []string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		r, err := demoDo(ctx, p, nodeproc.Command{Op: "members"})
		if err != nil {
			return err
		}
		if slices.Equal(r.Members, want) {
			return nil
		}
		if err := demoSleep(ctx, 50*time.Millisecond); err != nil {
			return fmt.Errorf("members %v, want %v: %w", r.Members, want, err)
		}
	}
}

func demoSleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// demoPlace is the placement step: node-c places a request that needs
// the demo value in any node's cuda:0, held; the chosen node's copy is
// leased until node-c releases it.
func demoPlace(ctx context.Context, procs map[string]*nodeproc.Proc, say func(string, ...any), fail func(string, error) int) int {
	const request = "serve-" + demoValue
	r, err := demoDo(ctx, procs["node-c"], nodeproc.Command{Op: "place", Name: request, Value: demoValue,
		Tiers: [][]string{{"cuda:0@*"}}, Hold: true, TimeoutMS: 10000})
	if err != nil {
		if r.Placement != nil {
			for _, a := range r.Placement.Attempts {
				err = fmt.Errorf("%w\n   asked %s: %s", err, a.Node, a.Error)
			}
		}
		return fail("node-c placing "+request, err)
	}
	p := r.Placement
	var table []string
	hasIt := fmt.Sprintf("has %q in cuda:0 already", demoValue)
	for _, c := range p.Candidates {
		has := "does not have it"
		if len(c.Resident) > 0 {
			has = hasIt
		}
		table = append(table, fmt.Sprintf("     %d. %-7s %-*s %5.1f MiB of cuda:0 free", len(table)+1, c.Node, len(hasIt), has, float64(c.FreeBytes)/(1<<20)))
	}
	chosen := p.Candidates[0]
	var why string
	if len(chosen.Resident) > 0 {
		why = fmt.Sprintf("%q is already in its cuda:0, so nothing has to be copied", demoValue)
		var roomier, tied []string
		for _, c := range p.Candidates[1:] {
			switch {
			case len(c.Resident) == 0 && c.FreeBytes > chosen.FreeBytes:
				roomier = append(roomier, c.Node)
			case len(c.Resident) > 0 && c.FreeBytes == chosen.FreeBytes:
				tied = append(tied, c.Node)
			}
		}
		if len(roomier) > 0 {
			why += fmt.Sprintf(", although %s has more free memory", strings.Join(roomier, " and "))
		}
		if len(tied) > 0 {
			why += fmt.Sprintf(". %s has it too, with as much room: the first name wins the tie", strings.Join(tied, " and "))
		}
	} else {
		why = "no node holds it, and this one has the most free memory"
	}
	asked := "admitted it on the first try"
	if n := len(p.Attempts); n > 1 {
		var refused []string
		for _, a := range p.Attempts[:n-1] {
			refused = append(refused, a.Node+" ("+a.ErrorType+")")
		}
		asked = fmt.Sprintf("admitted it after %s refused", strings.Join(refused, ", "))
	}
	evicted := ", nothing evicted"
	if len(p.Decision.Evictions) > 0 {
		var ev []string
		for _, e := range p.Decision.Evictions {
			ev = append(ev, e.Value+" from "+e.Location)
		}
		evicted = ", evicting " + strings.Join(ev, ", ")
	}
	leased := -1
	if ir, err := demoDo(ctx, procs[p.Node], nodeproc.Command{Op: "inspect", Name: demoValue}); err == nil {
		for _, m := range ir.Materializations {
			if m.Location == "cuda:0" {
				leased = m.UseCount
			}
		}
	}
	if _, err := demoDo(ctx, procs["node-c"], nodeproc.Command{Op: "release", Name: request}); err != nil {
		return fail("node-c releasing "+request, err)
	}
	released := -1
	if ir, err := demoDo(ctx, procs[p.Node], nodeproc.Command{Op: "inspect", Name: demoValue}); err == nil {
		for _, m := range ir.Materializations {
			if m.Location == "cuda:0" {
				released = m.UseCount
			}
		}
	}
	say("node-c asks the cluster to run a request, %q (work that needs values resident while it runs), that needs %q in the cuda:0 of any node (cuda:0@*). "+
		"The cluster ranks the nodes from the directory (step 5) and the summaries (step 6), without asking any node for its full state:\n%s\n"+
		"   Chosen: %s, because %s.\n"+
		"   %s's own controller checked the request against its budgets and %s; the request uses %s%s. "+
		"While node-c holds the request, %s keeps a lease on that copy (leases: %d), so it cannot be evicted; then node-c releases it (leases: %d).\n"+
		"   The evidence as the API returns it (Placement.Why; \"tiers [0]\": the request's first choice of locations):\n   %s",
		request, demoValue, strings.Join(table, "\n"), p.Node, why,
		p.Node, asked, strings.Join(p.Decision.Enter, ", "), evicted, p.Node, leased, released, p.Why)
	return 0
}
