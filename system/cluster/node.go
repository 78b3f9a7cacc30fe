package cluster

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	protocluster "github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/identitylookup/disthash"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/messages/clusterpb"
	"github.com/residency-go/residency/system"
)

// Names a node announces in the cluster.
const (
	// nodeKindPrefix + node name is a kind only that node registers: the
	// member list says which member runs which node.
	nodeKindPrefix = "residency.node."
	// endpointID is the name of each node's endpoint actor: requests to a
	// node go to PID{member address, endpointID}.
	endpointID = "residency-node"
	// directoryKind is the kind of the directory grains (one per value
	// name), registered on every node.
	directoryKind = "residency.directory"
	// summaryKey is the gossip key of a node's location summaries.
	summaryKey = "residency.summary"
	// dialTimeout bounds one connection attempt to another member.
	dialTimeout = 2 * time.Second
)

// NodeOptions configures [StartNode].
type NodeOptions struct {
	// Name is the node's name in node-qualified locations (`cuda:0@Name`):
	// letters, digits, '-', '_' and '.'. Required; unique in the cluster.
	Name string
	// ClusterName names the cluster (default "residency"); nodes join the
	// members of their provider with the same cluster name.
	ClusterName string
	// Provider finds the other members: protoactor's in-memory test
	// provider (several nodes in one process), automanaged or etcd.
	// Required.
	Provider protocluster.ClusterProvider
	// Addr is the host:port the node listens on for other members
	// (default "127.0.0.1:0": loopback, a free port).
	Addr string
	// AdvertisedAddr, when set, is the host:port the node registers with
	// its provider and the other members dial instead of the address it
	// listens on: something in between (a NAT, a TCP proxy; the fault
	// tests route member traffic through one) forwards it to Addr. Default
	// "": the address the node listens on.
	AdvertisedAddr string
	// TLS, when set, makes the transport between members mutual TLS: this
	// node serves with TLS.Certificates and requires every member to
	// present a certificate signed by ClientCAs (RootCAs when ClientCAs is
	// nil); it dials members with the same certificate and verifies
	// theirs against RootCAs, for the host of their address (so
	// certificates name the members' IPs or host names) unless ServerName
	// is set. Every member of a cluster uses TLS or none does. Certificates
	// and RootCAs are required. Nil: plaintext (keep it on loopback).
	TLS *tls.Config
	// Options configures the node's own runtime: its Locations are this
	// node's memory, unqualified or qualified with Name (`cuda:0@Name`); a
	// location qualified with another node is refused.
	system.Options
	// RequestTimeout bounds one request to another node when the caller's
	// context has no earlier deadline (default 10s).
	RequestTimeout time.Duration
	// ChunkBytes is the size of the chunks a remote source streams
	// (default 1 MiB; at most 3 MiB, under gRPC's message limit).
	ChunkBytes int
	// RefreshInterval bounds how often the node publishes its directory
	// entries and location summaries (default 250ms): at most once per
	// interval, and only when its state version changed (or the
	// membership did). [Node.Refresh] publishes at once.
	RefreshInterval time.Duration
	// StreamIdleTimeout closes a stream this node serves when its reader
	// sent nothing for that long (default 30s), releasing the source's
	// protection: a reader that died cannot pin it forever.
	StreamIdleTimeout time.Duration
	// BeforeChunk, when set, is called by a reader before it requests each
	// chunk of a remote source (tests: gate a transfer to observe it).
	BeforeChunk func(source string, offset, total int64)
}

// Node is a runtime that is a member of a cluster: its own [system.System] (own
// ledger, manager id and state version) plus an endpoint that every other
// member reaches through protoactor's cluster. All methods are safe for
// concurrent use. Close it with [Node.Close].
type Node struct {
	name    string
	sys     *system.System
	csys    *actor.ActorSystem
	cl      *protocluster.Cluster
	epoch   uint64
	log     zerolog.Logger
	opts    NodeOptions
	closed  atomic.Bool
	closeMu sync.Mutex
	stop    chan struct{}
	loopWG  sync.WaitGroup
	workWG  sync.WaitGroup // request handlers in flight

	streams streamTable
	pub     publisher

	held     heldTable // placements and leases held for other nodes
	placeSeq atomic.Uint64
	sums     summaryCache // decoded gossip summaries
	probed   probeCache   // grain members' ports last seen accepting
	data     dataConns    // chunk streams' connections to other members
	dialOpts []grpc.DialOption
}

// StartNode starts a runtime as a member of a cluster: it starts the
// node's own runtime (as [system.Start] would, with the node's locations
// unqualified), then joins the cluster through opts.Provider, listening on
// opts.Addr. It returns once this node is a member (protoactor's
// StartMember takes about a second); other members appear in
// [Node.Members] as the provider reports them ([Node.WaitMembers] waits).
// Errors: [*system.InvalidInputError] for a missing or malformed name, a missing
// provider, a non-loopback-free address that cannot be listened on, a
// location qualified with another node, and whatever [system.Start] refuses.
func StartNode(ctx context.Context, opts NodeOptions) (_ *Node, err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if _, perr := budget.ParseLocation("pageable-host@" + opts.Name); perr != nil || opts.Name == "" {
		return nil, &budget.InvalidInputError{Message: fmt.Sprintf("node name %q: want a non-empty run of letters, digits, '-', '_' and '.'", opts.Name)}
	}
	if opts.Provider == nil {
		return nil, &budget.InvalidInputError{Message: fmt.Sprintf("node %q: a cluster provider is required", opts.Name)}
	}
	if err := checkTLS(opts.Name, opts.TLS); err != nil {
		return nil, err
	}
	if opts.ClusterName == "" {
		opts.ClusterName = "residency"
	}
	if opts.Addr == "" {
		opts.Addr = "127.0.0.1:0"
	}
	host, portStr, serr := net.SplitHostPort(opts.Addr)
	var port int
	if serr == nil {
		_, serr = fmt.Sscanf(portStr, "%d", &port)
	}
	if serr != nil || host == "" {
		return nil, &budget.InvalidInputError{Message: fmt.Sprintf("node %q: address %q: want host:port", opts.Name, opts.Addr)}
	}
	if opts.AdvertisedAddr != "" {
		if ah, ap, aerr := net.SplitHostPort(opts.AdvertisedAddr); aerr != nil || ah == "" || ap == "" {
			return nil, &budget.InvalidInputError{Message: fmt.Sprintf("node %q: advertised address %q: want host:port", opts.Name, opts.AdvertisedAddr)}
		}
	}
	if opts.RequestTimeout <= 0 {
		opts.RequestTimeout = 10 * time.Second
	}
	if opts.ChunkBytes <= 0 {
		opts.ChunkBytes = 1 << 20
	}
	if opts.ChunkBytes > 3<<20 {
		opts.ChunkBytes = 3 << 20
	}
	if opts.RefreshInterval <= 0 {
		opts.RefreshInterval = 250 * time.Millisecond
	}
	if opts.StreamIdleTimeout <= 0 {
		opts.StreamIdleTimeout = 30 * time.Second
	}
	rt := opts.Options
	locs, err := localLocations(opts.Name, rt.Locations)
	if err != nil {
		return nil, err
	}
	rt.Locations = locs
	if rt.ManagerID == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		rt.ManagerID = "rm-" + opts.Name + "-" + hex.EncodeToString(b[:])
	}
	sys, err := system.Start(ctx, rt)
	if err != nil {
		return nil, err
	}
	n := &Node{
		name:  opts.Name,
		sys:   sys,
		epoch: uint64(time.Now().UnixNano()),
		log:   runtimeLogger(rt).With().Str("node", opts.Name).Logger(),
		opts:  opts,
		stop:  make(chan struct{}),
	}
	n.streams.m = map[uint64]*serveStream{}
	n.pub.sent = map[string]string{}
	defer func() {
		if err != nil {
			_ = sys.Close(context.WithoutCancel(ctx))
		}
	}()
	if err := n.join(host, port); err != nil {
		return nil, err
	}
	n.loopWG.Add(1)
	go n.loop()
	n.log.Info().Str("address", n.csys.Address()).Msg("residency node joined the cluster")
	return n, nil
}

// runtimeLogger is the logger the node's runtime logs to (as [system.Start]
// picks it): the node logs there too, with its name.
func runtimeLogger(rt system.Options) zerolog.Logger {
	if rt.Logger != nil {
		return *rt.Logger
	}
	return zerolog.Nop()
}

// localLocations turns a node's configured locations into its runtime's:
// qualified with the node's own name → unqualified; with another node →
// refused.
func localLocations(node string, in []system.LocationConfig) ([]system.LocationConfig, error) {
	out := make([]system.LocationConfig, len(in))
	for i, l := range in {
		out[i] = l
		ln, err := budget.ParseLocation(l.Name)
		if err != nil || ln.Node == "" {
			continue // the ledger reports malformed names
		}
		if ln.Node != node {
			return nil, &budget.InvalidInputError{Message: fmt.Sprintf(
				"node %q: location %q is memory of node %q: a node configures only its own locations (reach another node's through the cluster)",
				node, l.Name, ln.Node)}
		}
		ln.Node = ""
		out[i].Name = ln.String()
	}
	return out, nil
}

// join starts the node's cluster actor system: its endpoint actor, its
// node kind and the directory kind, then StartMember.
func (n *Node) join(host string, port int) (err error) {
	logger := n.log.With().Str("component", "protoactor-cluster").Logger()
	n.csys = actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		if n.log.GetLevel() == zerolog.Disabled {
			return slog.New(slog.NewTextHandler(io.Discard, nil))
		}
		return slog.New(cleanStopHandler{zerolog.NewSlogHandler(logger)})
	}))
	endpoint := actor.PropsFromFunc(n.receiveEndpoint)
	directory := actor.PropsFromProducer(func() actor.Actor { return &directoryGrain{node: n, entries: map[string]*clusterpb.DirectoryUpdate{}} })
	// Dial other members blocking, with a bound, and try once: protoactor's
	// endpoint writer otherwise leaves a gRPC connection reconnecting
	// forever behind each failed attempt to reach a dead member.
	creds, serverOpts, terr := n.transport()
	if terr != nil {
		return terr
	}
	n.dialOpts = []grpc.DialOption{
		creds,
		grpc.WithBlock(),
		//lint:ignore SA1019 protoactor dials with grpc.Dial: no context to bound the dial with
		grpc.WithTimeout(dialTimeout),
		grpc.FailOnNonTempDialError(true),
	}
	// The chunk streams of remote sources share the port (see dataplane.go).
	serverOpts = append(serverOpts, grpc.UnknownServiceHandler(n.serveGRPC))
	ropts := []remote.ConfigOption{remote.WithDialOptions(n.dialOpts...), remote.WithServerOptions(serverOpts...)}
	if n.opts.AdvertisedAddr != "" {
		ropts = append(ropts, remote.WithAdvertisedHost(n.opts.AdvertisedAddr))
	}
	rcfg := remote.Configure(host, port, ropts...)
	rcfg.MaxRetryCount = 1
	cfg := protocluster.Configure(n.opts.ClusterName, n.opts.Provider, disthash.New(),
		rcfg,
		protocluster.WithKinds(
			protocluster.NewKind(nodeKindPrefix+n.name, endpoint),
			protocluster.NewKind(directoryKind, directory),
		))
	n.cl = protocluster.New(n.csys, cfg)
	defer func() {
		if r := recover(); r != nil {
			// StartMember panics when it cannot listen or the provider
			// fails (after it started serving remote requests).
			// ("nonhost": protoactor's address before the remote listens)
			if n.cl.Remote != nil && n.csys.Address() != "nonhost" {
				n.cl.Remote.Shutdown(false)
			}
			n.csys.Shutdown()
			err = &budget.InvalidInputError{Message: fmt.Sprintf("node %q: cannot join the cluster at %s:%d: %v", n.name, host, port, r)}
		}
	}()
	if _, serr := n.csys.Root.SpawnNamed(endpoint, endpointID); serr != nil {
		return fmt.Errorf("residency: node %q: endpoint: %w", n.name, serr)
	}
	n.cl.StartMember()
	n.csys.EventStream.Subscribe(func(evt any) {
		if _, ok := evt.(*protocluster.ClusterTopology); ok {
			n.pub.forceAll.Store(true)
		}
	})
	return nil
}

// Name returns the node's name.
func (n *Node) Name() string { return n.name }

// System returns the node's own runtime: register, place and read values
// on this node's locations with it (unqualified names).
func (n *Node) System() *system.System { return n.sys }

// Address returns the host:port other members reach this node at.
func (n *Node) Address() string { return n.csys.Address() }

// Members returns the names of the nodes currently in this node's member
// list (itself included), sorted.
func (n *Node) Members() []string {
	var out []string
	for _, m := range n.cl.MemberList.Members().Members() {
		for _, k := range m.Kinds {
			if strings.HasPrefix(k, nodeKindPrefix) {
				out = append(out, strings.TrimPrefix(k, nodeKindPrefix))
			}
		}
	}
	sort.Strings(out)
	return out
}

// WaitMembers waits until every named node is in this node's member list,
// or ctx ends (its error).
func (n *Node) WaitMembers(ctx context.Context, names ...string) error {
	for {
		have := map[string]bool{}
		for _, m := range n.Members() {
			have[m] = true
		}
		missing := ""
		for _, w := range names {
			if !have[w] {
				missing = w
				break
			}
		}
		if missing == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("residency: node %q: waiting for member %q: %w", n.name, missing, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// endpointOf returns the PID of node's endpoint, or an
// [*system.UnavailableError] when no member runs that node.
func (n *Node) endpointOf(node string) (*actor.PID, error) {
	kind := nodeKindPrefix + node
	for _, m := range n.cl.MemberList.Members().Members() {
		if m.HasKind(kind) {
			return actor.NewPID(m.Address(), endpointID), nil
		}
	}
	return nil, &budget.UnavailableError{Location: "@" + node, Reason: budget.UnavailableLocation,
		Detail: fmt.Sprintf("node %q is not a member of cluster %q (members: %v)", node, n.opts.ClusterName, n.Members())}
}

// timeout is the time left for one request: the caller's deadline or
// RequestTimeout, whichever is earlier.
func (n *Node) timeout(ctx context.Context) time.Duration {
	t := n.opts.RequestTimeout
	if dl, ok := ctx.Deadline(); ok {
		if left := time.Until(dl); left < t {
			t = left
		}
	}
	if t < time.Millisecond {
		t = time.Millisecond
	}
	return t
}

// request sends msg to node's endpoint and waits for the reply, at most
// until ctx's deadline or RequestTimeout. A node that is not a member,
// does not answer in time or is gone is an [*system.UnavailableError].
func (n *Node) request(ctx context.Context, node string, msg any) (any, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	pid, err := n.endpointOf(node)
	if err != nil {
		return nil, err
	}
	t := n.timeout(ctx)
	first := livenessInterval
	if probesFirst(msg) {
		// Probe the member once per transfer, placement or lease, unless a
		// probe of its address succeeded within livenessInterval: a crashed
		// member's port is closed, and this answers at once without asking
		// protoactor's remote layer to connect to it (with TLS, a refused
		// certificate, theirs or ours, is reported here). A request that
		// skips the probe checks the member grainFirstCheck into its wait.
		if n.probed.fresh(pid.Address) {
			first = grainFirstCheck
		} else {
			if derr := n.probe(pid.Address, min(t, dialTimeout)); derr != nil {
				n.probed.set(pid.Address, false)
				return nil, &budget.UnavailableError{Location: "@" + node, Reason: budget.UnavailableLocation,
					Detail: fmt.Sprintf("node %q is listed as a member at %s but cannot be reached: %v", node, pid.Address, derr)}
			}
			n.probed.set(pid.Address, true)
		}
	}
	res, err := n.awaitReply(ctx, node, pid, first, t, msg)
	if gone := (*budget.UnavailableError)(nil); errors.As(err, &gone) {
		return nil, err
	}
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return nil, &budget.UnavailableError{Location: "@" + node, Reason: budget.UnavailableLocation,
				Detail: fmt.Sprintf("node %q did not answer %T before the caller's deadline: %v", node, msg, cerr)}
		}
		return nil, &budget.UnavailableError{Location: "@" + node, Reason: budget.UnavailableLocation,
			Detail: fmt.Sprintf("node %q did not answer %T within %s: %v", node, msg, t, err)}
	}
	return res, nil
}

// loop publishes directory entries and summaries at most once per
// RefreshInterval, and closes idle streams.
func (n *Node) loop() {
	defer n.loopWG.Done()
	tick := time.NewTicker(n.opts.RefreshInterval)
	defer tick.Stop()
	for {
		select {
		case <-n.stop:
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), n.opts.RequestTimeout)
		if err := n.publish(ctx, false); err != nil && !n.closed.Load() {
			n.log.Debug().Err(err).Msg("residency node: publishing directory and summaries")
		}
		n.streams.closeIdle(ctx, n, n.opts.StreamIdleTimeout, n.opts.RequestTimeout)
		n.held.releaseOrphans(ctx, n, false)
		cancel()
	}
}

// Close leaves the cluster and closes the node's runtime: requests in
// flight finish, streams this node serves are closed (their protections
// released), the node leaves the member list (protoactor's graceful
// shutdown: about 2 s), then the runtime closes as [system.System.Close] does and
// its error is returned. Idempotent.
func (n *Node) Close(ctx context.Context) error {
	n.closeMu.Lock()
	defer n.closeMu.Unlock()
	if n.closed.Swap(true) {
		return n.sys.Close(ctx)
	}
	close(n.stop)
	n.loopWG.Wait()
	n.leaveCluster()
	n.workWG.Wait()
	n.streams.closeAll(ctx, n)
	n.held.releaseOrphans(ctx, n, true)
	n.data.closeAll()
	return n.sys.Close(ctx)
}
