package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/residency-go/residency/internal/nodeproc"
	"github.com/residency-go/residency/system"
)

// nodeConfig is `demo node`'s flags.
type nodeConfig struct {
	name, clusterName, provider, addr string
	etcd                              string
	etcdDialTimeout                   time.Duration
	autoAddr, peers                   string
	autoRefresh                       time.Duration
	locations                         locationFlags
	requestTimeout, refresh           time.Duration
	logLevel                          string
}

// locationFlags collects repeated --location NAME=SIZE (or NAME=unlimited).
type locationFlags []system.LocationConfig

func (l *locationFlags) String() string {
	var parts []string
	for _, c := range *l {
		if c.HasBudget {
			parts = append(parts, fmt.Sprintf("%s=%d", c.Name, c.BudgetBytes))
		} else {
			parts = append(parts, c.Name+"=unlimited")
		}
	}
	return strings.Join(parts, ",")
}

func (l *locationFlags) Set(s string) error {
	name, size, ok := strings.Cut(s, "=")
	if !ok || name == "" {
		return fmt.Errorf("want NAME=SIZE (cuda:0=8GiB) or NAME=unlimited, got %q", s)
	}
	if size == "unlimited" {
		*l = append(*l, system.NoLimit(name))
		return nil
	}
	n, err := parseByteString(size)
	if err != nil {
		return err
	}
	*l = append(*l, system.Limit(name, n))
	return nil
}

const nodeUsage = `usage: demo node --name NAME [--provider etcd|automanaged] [flags]

Runs one residency node as a member of a cluster until SIGINT or SIGTERM
(exit status 0 after leaving the cluster). Logs go to standard error as
JSON lines; standard output carries one ready line
  {"event":"ready","node":NAME,"address":HOST:PORT,...}
and then one JSON reply per command read from standard input (one JSON
object per line; docs/cluster.md lists them). Flags:
`

func nodeMain(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("demo node", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c nodeConfig
	fs.StringVar(&c.name, "name", "", "the node's `name` (required; unique in the cluster)")
	fs.StringVar(&c.clusterName, "cluster-name", "residency", "the cluster's `name`")
	fs.StringVar(&c.provider, "provider", "etcd", "membership provider: `etcd` or automanaged")
	fs.StringVar(&c.addr, "addr", "127.0.0.1:0", "`host:port` other members reach this node at (loopback unless told otherwise)")
	fs.StringVar(&c.etcd, "etcd", "127.0.0.1:2379", "etcd `endpoints`, comma-separated (provider etcd)")
	fs.DurationVar(&c.etcdDialTimeout, "etcd-dial-timeout", 5*time.Second, "give up when etcd does not answer within this `duration`")
	fs.StringVar(&c.autoAddr, "automanaged-addr", "127.0.0.1:6330", "`host:port` of this node's health check (provider automanaged)")
	fs.StringVar(&c.peers, "peers", "", "health-check `addresses` of the other nodes, comma-separated (provider automanaged)")
	fs.DurationVar(&c.autoRefresh, "automanaged-refresh", time.Second, "pause between two rounds of health checks (provider automanaged)")
	fs.Var(&c.locations, "location", "a location of this node and its budget, `NAME=SIZE` (cuda:0=8GiB) or NAME=unlimited; repeat it (default pageable-host=4GiB and cuda:0=8GiB)")
	fs.DurationVar(&c.requestTimeout, "request-timeout", 10*time.Second, "bound of one request to another node")
	fs.DurationVar(&c.refresh, "refresh", 250*time.Millisecond, "at most one directory and summary publication per `interval`")
	fs.StringVar(&c.logLevel, "log-level", "info", "log `level`: debug, info, warn, error or disabled")
	fs.Usage = func() {
		fmt.Fprint(stderr, nodeUsage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "demo node: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if c.name == "" {
		fmt.Fprintln(stderr, "demo node: --name is required")
		fs.Usage()
		return 2
	}
	if len(c.locations) == 0 {
		c.locations = locationFlags{system.Limit("pageable-host", 4<<30), system.Limit("cuda:0", 8<<30)}
	}
	level, err := zerolog.ParseLevel(c.logLevel)
	if err != nil {
		fmt.Fprintf(stderr, "demo node: --log-level: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The runtime's logger: the node's own lines carry "node" already.
	log := zerolog.New(stderr).Level(level).With().Timestamp().Logger()
	return runNode(ctx, c, log, stdin, stdout)
}

// runNode starts the node, prints the ready line, serves commands and
// leaves the cluster when ctx ends.
func runNode(ctx context.Context, c nodeConfig, rtLog zerolog.Logger, stdin io.Reader, stdout io.Writer) int {
	log := rtLog.With().Str("node", c.name).Logger()
	opts := system.NodeOptions{
		Name: c.name, ClusterName: c.clusterName, Addr: c.addr,
		Options:        system.Options{Locations: c.locations, Logger: &rtLog},
		RequestTimeout: c.requestTimeout, RefreshInterval: c.refresh,
	}
	switch c.provider {
	case "etcd":
		eps := strings.Split(c.etcd, ",")
		log.Info().Strs("endpoints", eps).Dur("dial_timeout", c.etcdDialTimeout).Msg("connecting to etcd")
		p, err := system.EtcdProvider(system.EtcdOptions{Endpoints: eps, DialTimeout: c.etcdDialTimeout})
		if err != nil {
			log.Error().Err(err).Msg("cannot start the node")
			return 1
		}
		opts.Provider = p
	case "automanaged":
		var peers []string
		if c.peers != "" {
			peers = strings.Split(c.peers, ",")
		}
		p, err := system.AutomanagedProvider(system.AutomanagedOptions{Addr: c.autoAddr, Peers: peers, RefreshInterval: c.autoRefresh})
		if err != nil {
			log.Error().Err(err).Msg("cannot start the node")
			return 1
		}
		opts.Provider = p
	default:
		log.Error().Str("provider", c.provider).Msg("unknown provider: want etcd or automanaged")
		return 2
	}
	n, err := system.StartNode(ctx, opts)
	if err != nil {
		log.Error().Err(err).Msg("cannot start the node")
		return 1
	}
	out := &replyWriter{w: stdout}
	out.write(map[string]any{"event": "ready", "node": n.Name(), "address": n.Address(),
		"cluster": c.clusterName, "provider": c.provider, "pid": os.Getpid()})
	log.Info().Str("address", n.Address()).Msg("node ready")

	cmds := &nodeCommands{n: n, out: out, log: log}
	go cmds.serve(ctx, stdin)
	<-ctx.Done()
	log.Info().Msg("signal received: leaving the cluster")
	cmds.stop()
	cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := n.Close(cctx); err != nil {
		log.Error().Err(err).Msg("closing the node")
		return 1
	}
	log.Info().Msg("node stopped")
	return 0
}

// replyWriter writes one JSON object per line, whole lines only.
type replyWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (r *replyWriter) write(v any) {
	b, _ := json.Marshal(v)
	r.mu.Lock()
	defer r.mu.Unlock()
	_, _ = r.w.Write(append(b, '\n'))
}

type nodeCommands struct {
	n   *system.Node
	out *replyWriter
	log zerolog.Logger

	mu      sync.Mutex
	stopped bool
	held    map[string]*system.Placement // held placements, by request name
	wg      sync.WaitGroup
}

// stop refuses further commands and waits for those in flight (their
// contexts end with the signal's).
func (c *nodeCommands) stop() {
	c.mu.Lock()
	c.stopped = true
	c.mu.Unlock()
	c.wg.Wait()
}

// serve reads commands until stdin ends or ctx does; each runs in its own
// goroutine (a driver may keep several in flight), replies carry its id.
func (c *nodeCommands) serve(ctx context.Context, stdin io.Reader) {
	sc := bufio.NewScanner(stdin)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var cmd nodeproc.Command
		if err := json.Unmarshal([]byte(line), &cmd); err != nil {
			c.out.write(nodeproc.Reply{Op: "?", Error: "malformed command: " + err.Error(), ErrorType: "InvalidInputError"})
			continue
		}
		c.mu.Lock()
		if c.stopped {
			c.mu.Unlock()
			return
		}
		c.wg.Add(1)
		c.mu.Unlock()
		go func() {
			defer c.wg.Done()
			c.out.write(c.run(ctx, cmd))
		}()
	}
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// run carries out one command with its own deadline (timeout_ms, default
// 30 s; a signal ends it too) and reports the outcome.
func (c *nodeCommands) run(ctx context.Context, cmd nodeproc.Command) (r nodeproc.Reply) {
	start := time.Now()
	r = nodeproc.Reply{ID: cmd.ID, Op: cmd.Op}
	t := 30 * time.Second
	if cmd.TimeoutMS > 0 {
		t = time.Duration(cmd.TimeoutMS) * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(ctx, t)
	defer cancel()
	err := c.do(ctx, cmd, &r)
	r.ElapsedMS = float64(time.Since(start).Microseconds()) / 1000
	if err != nil {
		r.Error, r.ErrorType = err.Error(), nodeproc.ErrorType(err)
		return r
	}
	r.OK = true
	return r
}

func (c *nodeCommands) do(ctx context.Context, cmd nodeproc.Command, r *nodeproc.Reply) error {
	sys := c.n.System()
	switch cmd.Op {
	case "register":
		data := nodeproc.Pattern(cmd.Seed, cmd.Bytes)
		v := system.Value{Name: cmd.Name, Bytes: cmd.Bytes, At: cmd.At, Data: data}
		if cmd.At == "" && cmd.Source != "" {
			// Resident nowhere: the loader produces the same bytes when
			// the value is placed.
			v = system.Value{Name: cmd.Name, Bytes: cmd.Bytes, Source: cmd.Source, Loader: func(_ context.Context, dst []byte) error {
				copy(dst, data)
				return nil
			}}
		}
		if _, err := sys.Register(ctx, v); err != nil {
			return err
		}
		r.SHA256, r.Bytes = digest(data), cmd.Bytes
	case "copy":
		src := cmd.Source
		if src == "" {
			src = "pageable-host"
		}
		remote := cmd.Remote
		if remote == "" {
			remote = cmd.Name
		}
		h, err := c.n.RegisterRemote(ctx, system.Value{Name: cmd.Name, Bytes: cmd.Bytes, Source: src},
			system.RemoteSource{Node: cmd.From, Handle: system.Handle{Name: remote}, Location: cmd.Location})
		if err != nil {
			return err
		}
		if err := sys.Place(ctx, h, cmd.At); err != nil {
			_ = sys.Discard(context.WithoutCancel(ctx), h)
			return err
		}
		b, err := sys.Read(ctx, h, cmd.At)
		if err != nil {
			return err
		}
		r.SHA256, r.Bytes = digest(b), int64(len(b))
	case "read":
		h, err := sys.Lookup(ctx, cmd.Name)
		if err != nil {
			return err
		}
		b, err := sys.Read(ctx, h, cmd.At)
		if err != nil {
			return err
		}
		r.SHA256, r.Bytes = digest(b), int64(len(b))
	case "discard":
		h, err := sys.Lookup(ctx, cmd.Name)
		if err != nil {
			return err
		}
		return sys.Discard(ctx, h)
	case "whereis":
		res, err := c.n.WhereIs(ctx, cmd.Name)
		r.Residency = res
		return err
	case "members":
		r.Members = c.n.Members()
	case "summaries":
		s, err := c.n.Summaries(ctx)
		r.Summaries = s
		return err
	case "refresh":
		return c.n.Refresh(ctx)
	case "place":
		return c.place(ctx, cmd, r)
	case "release":
		c.mu.Lock()
		p := c.held[cmd.Name]
		delete(c.held, cmd.Name)
		c.mu.Unlock()
		if p == nil {
			return &system.InvalidInputError{Message: fmt.Sprintf("release: no held placement %q", cmd.Name)}
		}
		if err := p.Release(ctx); err != nil {
			c.mu.Lock()
			c.held[cmd.Name] = p // it can be released again
			c.mu.Unlock()
			return err
		}
	case "inspect":
		snap, err := sys.Snapshot(ctx)
		if err != nil {
			return err
		}
		v, ok := snap.Value(cmd.Name)
		if !ok {
			return &system.InvalidInputError{Message: fmt.Sprintf("inspect: no value %q on node %s", cmd.Name, c.n.Name())}
		}
		for _, m := range v.Materializations {
			r.Materializations = append(r.Materializations, nodeproc.Materialization{Location: m.Location, State: m.State.String(), Bytes: m.ChargedBytes, UseCount: m.UseCount})
		}
	default:
		return &system.InvalidInputError{Message: fmt.Sprintf("unknown op %q (register, copy, read, discard, whereis, members, summaries, refresh, place, release, inspect)", cmd.Op)}
	}
	return nil
}

// place runs a place command: this node places the request with
// Node.Place and reports the evidence, also when no node admitted it.
func (c *nodeCommands) place(ctx context.Context, cmd nodeproc.Command, r *nodeproc.Reply) error {
	if cmd.Hold {
		c.mu.Lock()
		_, dup := c.held[cmd.Name]
		c.mu.Unlock()
		if dup {
			return &system.InvalidInputError{Message: fmt.Sprintf("place: placement %q is held already (release it first)", cmd.Name)}
		}
	}
	p, err := c.n.Place(ctx, system.PlacementRequest{Name: cmd.Name, Hold: cmd.Hold, MaxAttempts: cmd.MaxAttempts,
		Requirements: []system.PlacementRequirement{{Value: cmd.Value, Tiers: cmd.Tiers}}})
	if err != nil {
		var pe *system.PlacementError
		if errors.As(err, &pe) {
			r.Placement = &nodeproc.Placement{Request: pe.Request, Candidates: pe.Candidates, Attempts: attempts(pe.Attempts), NotTried: pe.NotTried, Directory: pe.Directory, Stage: pe.Stage}
		}
		return err
	}
	r.Placement = &nodeproc.Placement{Request: p.Request, Node: p.Node, Why: p.Why, Candidates: p.Candidates,
		Attempts: attempts(p.Attempts), Decision: &p.Decision, Directory: p.Directory}
	if cmd.Hold {
		c.mu.Lock()
		if c.held == nil {
			c.held = map[string]*system.Placement{}
		}
		_, dup := c.held[cmd.Name]
		if !dup {
			c.held[cmd.Name] = p
		}
		c.mu.Unlock()
		if dup { // a concurrent place of the same name won
			_ = p.Release(context.WithoutCancel(ctx))
			return &system.InvalidInputError{Message: fmt.Sprintf("place: placement %q is held already (release it first)", cmd.Name)}
		}
	}
	return nil
}

func attempts(as []system.PlacementAttempt) []nodeproc.Attempt {
	out := make([]nodeproc.Attempt, len(as))
	for i, a := range as {
		out[i] = nodeproc.Attempt{Node: a.Node}
		if a.Err != nil {
			out[i].Error, out[i].ErrorType = a.Err.Error(), nodeproc.ErrorType(a.Err)
		}
	}
	return out
}
