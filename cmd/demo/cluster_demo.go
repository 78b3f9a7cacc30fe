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
	"github.com/residency-go/residency/system/cluster"
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

// clusterRun is one run of the cluster demo: the processes it started,
// their logs and the temporary folder, all of which it removes at the end.
type clusterRun struct {
	ctx            context.Context
	o              clusterDemoOptions
	stdout, stderr io.Writer
	etcdBin        string
	dir            string
	logs           map[string]*demoLog
	etcd           *nodeproc.Etcd
	procs          map[string]*nodeproc.Proc
	killed         map[string]bool
	step           int
}

// clusterDemo runs the scenario; every process it starts is stopped and
// its temporary folder removed before it returns, also when ctx ends
// (Ctrl-C: exit status 130).
func clusterDemo(ctx context.Context, o clusterDemoOptions, stdout, stderr io.Writer) (code int) {
	c := &clusterRun{ctx: ctx, o: o, stdout: stdout, stderr: stderr,
		logs: map[string]*demoLog{}, procs: map[string]*nodeproc.Proc{}, killed: map[string]bool{}}
	if code := c.configure(); code != 0 {
		return code
	}
	dir, err := os.MkdirTemp("", "residency-cluster-demo-")
	if err != nil {
		fmt.Fprintf(stderr, "demo cluster-demo: %v\n", err)
		return 1
	}
	c.dir = dir
	defer func() { code = c.stop(code) }()

	fmt.Fprintf(stdout, "Three residency nodes on this machine, each a process with its own memory budgets (simulated GPUs), joined in one cluster.\n\n")
	names := []string{"node-a", "node-b", "node-c"}
	args, code := c.nodeArgs(names)
	if code != 0 {
		return code
	}
	if code := c.startNodes(names, args); code != 0 {
		return code
	}
	wantSum := nodeproc.Digest(nodeproc.Pattern(demoSeed, demoBytes))
	for _, act := range []func(string) int{c.copyBetweenNodes, c.askDirectory, c.showSummaries} {
		if code := act(wantSum); code != 0 {
			return code
		}
	}
	if code := demoPlace(ctx, c.procs, c.say, c.fail); code != 0 {
		return code
	}
	return c.crashAndRecover(wantSum)
}

// configure finds this program (to start the nodes) and the provider.
func (c *clusterRun) configure() int {
	if c.o.exe == "" {
		exe, err := os.Executable()
		if err != nil {
			fmt.Fprintf(c.stderr, "demo cluster-demo: cannot find this program to start the nodes: %v\n", err)
			return 1
		}
		c.o.exe = exe
	}
	c.etcdBin = nodeproc.EtcdBinary()
	if c.o.provider == "" {
		c.o.provider = "automanaged"
		if c.etcdBin != "" {
			c.o.provider = "etcd"
		}
	}
	if c.o.provider == "etcd" && c.etcdBin == "" {
		fmt.Fprintln(c.stderr, "demo cluster-demo: etcd is not installed (Debian: apt-get install etcd-server, or make etcd); try --provider automanaged")
		return 1
	}
	return 0
}

// say prints the next numbered step.
func (c *clusterRun) say(format string, args ...any) {
	c.step++
	fmt.Fprintf(c.stdout, "%d. "+format+"\n", append([]any{c.step}, args...)...)
}

// fail reports what failed and returns the exit status (130 after Ctrl-C).
func (c *clusterRun) fail(what string, err error) int {
	if c.ctx.Err() != nil {
		return exitInterrupted
	}
	fmt.Fprintf(c.stderr, "demo cluster-demo: %s: %v\n", what, err)
	return 1
}

// stop stops every process still running and etcd, prints the logs'
// tails after a failure, removes the temporary folder, and returns the
// run's exit status.
func (c *clusterRun) stop(code int) int {
	interrupted := c.ctx.Err() != nil
	if interrupted {
		fmt.Fprintln(c.stdout, "Interrupted: stopping the nodes and etcd, removing the temporary folder.")
	} else {
		c.step++
		what := "the nodes leave the cluster (SIGTERM)"
		if c.etcd != nil {
			what += ", etcd stops"
		}
		fmt.Fprintf(c.stdout, "%d. Stopping: %s, the temporary folder is removed.\n", c.step, what)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for name, p := range c.procs {
		if c.killed[name] {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := p.Stop(30 * time.Second); err != nil && !interrupted {
				mu.Lock()
				fmt.Fprintf(c.stderr, "demo cluster-demo: %s: %v\n", name, err)
				code = 1
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if c.etcd != nil {
		c.etcd.Stop(10 * time.Second)
	}
	if code != 0 && !interrupted {
		for _, name := range slices.Sorted(maps.Keys(c.logs)) {
			fmt.Fprintf(c.stderr, "--- end of the log of %s ---\n%s\n", name, c.logs[name].tail(3000))
		}
	}
	if err := os.RemoveAll(c.dir); err != nil {
		fmt.Fprintf(c.stderr, "demo cluster-demo: removing %s: %v\n", c.dir, err)
	}
	if interrupted {
		return exitInterrupted
	}
	if code == 0 {
		fmt.Fprintln(c.stdout, "Done.")
	}
	return code
}

// nodeArgs starts etcd (provider etcd) or picks health-check ports
// (automanaged) and returns each node's command line.
func (c *clusterRun) nodeArgs(names []string) (map[string][]string, int) {
	base := func(name string) []string {
		return []string{"node", "--name", name, "--provider", c.o.provider, "--location", "pageable-host=256MiB", "--location", "cuda:0=64MiB"}
	}
	args := map[string][]string{}
	if c.o.provider == "etcd" {
		c.logs["etcd"] = &demoLog{}
		sctx, cancel := context.WithTimeout(c.ctx, 60*time.Second)
		etcd, err := nodeproc.StartEtcd(sctx, c.etcdBin, c.dir+"/etcd", c.logs["etcd"])
		cancel()
		if err != nil {
			return nil, c.fail("starting etcd", err)
		}
		c.etcd = etcd
		c.say("Started etcd (%s) on %s with its data in %s: the nodes find each other through it.", c.etcdBin, etcd.Endpoint, c.dir)
		for _, n := range names {
			args[n] = append(base(n), "--etcd", etcd.Endpoint)
		}
		return args, 0
	}
	if c.etcdBin == "" {
		c.say("etcd is not installed (/usr/bin/etcd, Debian's etcd-server), so the nodes use the automanaged provider: each serves a health check on 127.0.0.1 and polls the others'.")
	} else {
		c.say("Using the automanaged provider (no etcd): each node serves a health check on 127.0.0.1 and polls the others'.")
	}
	health := map[string]string{}
	for _, n := range names {
		port, err := nodeproc.FreePort()
		if err != nil {
			return nil, c.fail("finding a free port", err)
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
		args[n] = append(base(n), "--automanaged-addr", health[n], "--peers", strings.Join(peers, ","))
	}
	return args, 0
}

// startNodes starts the node processes at once and waits until each
// lists all of them as members.
func (c *clusterRun) startNodes(names []string, args map[string][]string) int {
	var pids []int
	if c.etcd != nil {
		pids = append(pids, c.etcd.PID())
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	var startErr error
	sctx, cancel := context.WithTimeout(c.ctx, 60*time.Second)
	for _, n := range names {
		log, a := &demoLog{}, args[n]
		c.logs[n] = log
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := nodeproc.Start(sctx, c.o.exe, a, log)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				startErr = errors.Join(startErr, err)
				return
			}
			c.procs[n] = p
			pids = append(pids, p.PID())
		}()
	}
	wg.Wait()
	cancel()
	if c.o.started != nil {
		c.o.started(pids, c.dir)
	}
	if startErr != nil {
		return c.fail("starting the nodes", startErr)
	}
	for _, n := range names {
		if err := demoWaitMembers(c.ctx, c.procs[n], names); err != nil {
			return c.fail(n+" waiting for the others", err)
		}
	}
	c.say("Started node-a, node-b and node-c (processes %d, %d, %d), each with pageable-host 256 MiB and cuda:0 64 MiB. Every node lists all three as members.",
		c.procs["node-a"].PID(), c.procs["node-b"].PID(), c.procs["node-c"].PID())
	return 0
}

// copyBetweenNodes loads the demo value on node-a and copies it to node-b.
func (c *clusterRun) copyBetweenNodes(wantSum string) int {
	r, err := demoDo(c.ctx, c.procs["node-a"], nodeproc.Command{Op: "register", Name: demoValue, Bytes: demoBytes, At: "cuda:0", Seed: demoSeed})
	if err != nil {
		return c.fail("node-a registering "+demoValue, err)
	}
	c.say("node-a loads %q (16 MiB) onto its cuda:0. Its bytes have sha256 %s…", demoValue, r.SHA256[:16])

	r, err = demoDo(c.ctx, c.procs["node-b"], nodeproc.Command{Op: "copy", Name: demoValue, From: "node-a", Bytes: demoBytes, At: "cuda:0"})
	if err != nil {
		return c.fail("node-b copying from node-a", err)
	}
	same := "identical"
	if r.SHA256 != wantSum {
		same = "DIFFERENT"
	}
	c.say("node-b copies %q from node-a into its own cuda:0: the bytes stream over the cluster in 1 MiB chunks while node-a protects its copy with a lease. Read back on node-b: sha256 %s… — %s, in %.0f ms.",
		demoValue, r.SHA256[:16], same, r.ElapsedMS)
	if r.SHA256 != wantSum {
		return c.fail("the copy on node-b", errors.New("its bytes differ from node-a's"))
	}
	return 0
}

// askDirectory asks node-c's directory where the demo value is, until it
// lists both copies.
func (c *clusterRun) askDirectory(string) int {
	var where []string
	for {
		r, err := demoDo(c.ctx, c.procs["node-c"], nodeproc.Command{Op: "whereis", Name: demoValue})
		if err != nil {
			return c.fail("node-c asking the directory", err)
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
		if err := demoSleep(c.ctx, 100*time.Millisecond); err != nil {
			return c.fail("waiting for the directory", err)
		}
	}
	c.say("Where is %q? node-c asks the directory (one request to the value's directory grain): resident at %s.", demoValue, strings.Join(where, " and "))
	return 0
}

// showSummaries prints node-c's view of the gossiped summaries, once it
// has all three and they show the copies of node-a and node-b (each node
// publishes its summary on its own schedule: node-a's may still be the
// one from before it loaded the value when node-b's already shows the
// copy).
func (c *clusterRun) showSummaries(string) int {
	var lines []string
	for {
		r, err := demoDo(c.ctx, c.procs["node-c"], nodeproc.Command{Op: "summaries"})
		if err != nil {
			return c.fail("node-c reading the summaries", err)
		}
		var settled bool
		if lines, settled = summaryLines(r.Summaries, "node-a", "node-b"); settled {
			break
		}
		if err := demoSleep(c.ctx, 100*time.Millisecond); err != nil {
			return c.fail("waiting for the summaries", err)
		}
	}
	c.say("What each node holds, from the compact summaries the nodes gossip (node-c's view):\n%s", strings.Join(lines, "\n"))
	return 0
}

// summaryLines renders the cuda:0 line of each summary of sums; settled
// reports whether all three nodes' summaries are there and every node of
// holders shows the demo value's bytes used at its cuda:0.
func summaryLines(sums []cluster.NodeSummary, holders ...string) (lines []string, settled bool) {
	shown := map[string]bool{}
	for _, s := range sums {
		for _, l := range s.Locations {
			if strings.HasPrefix(l.Location, "cuda:0@") {
				lines = append(lines, fmt.Sprintf("   %-7s cuda:0  %5.1f MiB used of %.0f MiB", s.Node, float64(l.UsedBytes)/(1<<20), float64(l.BudgetBytes)/(1<<20)))
				shown[s.Node] = l.UsedBytes >= demoBytes
			}
		}
	}
	settled = len(sums) == 3
	for _, h := range holders {
		settled = settled && shown[h]
	}
	return lines, settled
}

// crashAndRecover kills node-a, shows the survivors drop it, a copy from
// it refused, and the value copied from node-b instead.
func (c *clusterRun) crashAndRecover(wantSum string) int {
	crash := time.Now()
	c.procs["node-a"].Kill()
	c.killed["node-a"] = true
	for _, n := range []string{"node-b", "node-c"} {
		if err := demoWaitMembers(c.ctx, c.procs[n], []string{"node-b", "node-c"}); err != nil {
			return c.fail(n+" waiting for node-a to drop out", err)
		}
	}
	c.say("node-a crashes (kill -9: no goodbye). %.1f s later node-b and node-c list only [node-b node-c] as members.", time.Since(crash).Seconds())

	r, err := c.procs["node-c"].Do(c.ctx, nodeproc.Command{Op: "copy", Name: demoValue + "-from-a", Remote: demoValue, From: "node-a", Bytes: demoBytes, At: "cuda:0", TimeoutMS: 5000})
	if err != nil {
		return c.fail("node-c asking node-a", err)
	}
	if r.OK {
		return c.fail("node-c asking node-a", errors.New("a copy from the dead node succeeded"))
	}
	msg := r.Error
	if i := strings.Index(msg, "residency unavailable"); i >= 0 {
		msg = msg[i:] // the cause, without the plan's context
	}
	if len(msg) > 160 {
		msg = msg[:160] + "…"
	}
	c.say("node-c asks node-a for %q: refused after %.0f ms with an %s:\n   %s", demoValue, r.ElapsedMS, r.ErrorType, msg)

	r, err = demoDo(c.ctx, c.procs["node-c"], nodeproc.Command{Op: "copy", Name: demoValue, From: "node-b", Bytes: demoBytes, At: "cuda:0"})
	if err != nil {
		return c.fail("node-c copying from node-b", err)
	}
	same := "identical"
	if r.SHA256 != wantSum {
		same = "DIFFERENT"
	}
	c.say("node-c copies %q from node-b instead: sha256 %s… — %s. The value survived node-a's crash because node-b had a copy.", demoValue, r.SHA256[:16], same)
	if r.SHA256 != wantSum {
		return c.fail("the copy on node-c", errors.New("its bytes differ from node-a's"))
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
