package system

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/clusterproviders/automanaged"
	"github.com/asynkron/protoactor-go/cluster/clusterproviders/etcd"
	"github.com/labstack/echo"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// EtcdOptions configures [EtcdProvider].
type EtcdOptions struct {
	// Endpoints are etcd's client URLs or host:port pairs
	// ("127.0.0.1:2379"). Required.
	Endpoints []string
	// DialTimeout bounds connecting to etcd (default 5s): the provider is
	// refused when no endpoint answers within it. protoactor's own etcd
	// provider, given no dial timeout, waits forever.
	DialTimeout time.Duration
	// BaseKey is the etcd key prefix under which members register
	// (default "/residency"); members are kept under
	// BaseKey/<cluster name>/<member id>.
	BaseKey string
}

// EtcdProvider returns a cluster provider backed by etcd (protoactor's etcd
// provider), for [NodeOptions.Provider]: the production choice. It
// connects to etcd before returning, blocking at most DialTimeout, and
// returns an error naming the endpoints when none answers, so that a node
// pointed at a wrong or dead etcd fails at once instead of hanging in
// [StartNode]. Each member keeps its registration alive with an etcd lease
// of 3 s (protoactor's fixed value): a member that dies without leaving
// (kill -9, a lost machine) drops out of every member list about 3 s later.
// Use one provider per node; it is closed when the node is.
func EtcdProvider(opts EtcdOptions) (cluster.ClusterProvider, error) {
	if len(opts.Endpoints) == 0 {
		return nil, errors.New("residency: etcd provider: no endpoints given")
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = 5 * time.Second
	}
	if opts.BaseKey == "" {
		opts.BaseKey = "/residency"
	}
	eps := strings.Join(opts.Endpoints, ",")
	p, err := etcd.NewWithConfig(opts.BaseKey, clientv3.Config{
		Endpoints:   opts.Endpoints,
		DialTimeout: opts.DialTimeout,
		// Without a blocking dial the client returns at once and the
		// provider's first request waits forever on an unreachable etcd.
		DialOptions: []grpc.DialOption{grpc.WithBlock()},
	})
	if err != nil {
		return nil, fmt.Errorf("residency: etcd provider: cannot reach etcd at %s within %s: %w", eps, opts.DialTimeout, err)
	}
	c, err := etcdClientOf(p)
	if err != nil {
		return nil, err
	}
	return &etcdProvider{Provider: p, client: c, endpoints: eps, timeout: opts.DialTimeout}, nil
}

// etcdClientOf returns the etcd client inside protoactor's provider:
// protoactor never closes it (its Shutdown leaves the client's gRPC
// connection and lease keep-alive running forever), and offers no way to
// reach it, so it is read from the unexported field. The module version is
// pinned; a change of that field is an error here, not a silent leak.
func etcdClientOf(p *etcd.Provider) (*clientv3.Client, error) {
	f := reflect.ValueOf(p).Elem().FieldByName("client")
	if !f.IsValid() || f.Type() != reflect.TypeFor[*clientv3.Client]() {
		return nil, errors.New("residency: etcd provider: protoactor's etcd provider has no client field of type *clientv3.Client any more (update system/cluster_providers.go)")
	}
	return *(**clientv3.Client)(unsafe.Pointer(f.UnsafeAddr())), nil
}

// etcdProvider is protoactor's etcd provider that checks etcd before
// joining and closes its client on shutdown.
type etcdProvider struct {
	*etcd.Provider
	client    *clientv3.Client
	endpoints string
	timeout   time.Duration
	once      sync.Once
}

// StartMember checks that etcd still answers (protoactor's provider asks
// it without a deadline), then joins.
func (p *etcdProvider) StartMember(c *cluster.Cluster) error {
	ctx, cancel := context.WithTimeout(context.Background(), p.timeout)
	defer cancel()
	if _, err := p.client.Get(ctx, "residency-health-check"); err != nil {
		return fmt.Errorf("residency: etcd provider: etcd at %s does not answer within %s: %w", p.endpoints, p.timeout, err)
	}
	return p.Provider.StartMember(c)
}

// Shutdown leaves (deregisters the member) and closes the etcd client.
func (p *etcdProvider) Shutdown(graceful bool) error {
	err := p.Provider.Shutdown(graceful)
	p.once.Do(func() { _ = p.client.Close() })
	return err
}

// AutomanagedOptions configures [AutomanagedProvider].
type AutomanagedOptions struct {
	// Addr is the host:port where this node answers the other nodes'
	// health checks (default "127.0.0.1:6330": loopback). Each node of a
	// machine needs its own port.
	Addr string
	// Peers are the health-check addresses (their Addr) of the other
	// nodes; this node's own Addr is added. A node is a member while its
	// health check answers.
	Peers []string
	// RefreshInterval is the pause between two rounds of health checks
	// (default 1s): a node that dies drops out of the member list within
	// about one round (plus the 2 s HTTP timeout when it hangs instead of
	// refusing connections).
	RefreshInterval time.Duration
}

// AutomanagedProvider returns a cluster provider without an external
// service (protoactor's automanaged provider), for [NodeOptions.Provider]:
// every node serves a small HTTP health check at opts.Addr and polls the
// peers' checks; the members are the nodes that answer. Unlike protoactor's
// default, which listens on 0.0.0.0, the check listens on opts.Addr only
// (loopback by default). The address is listened on when the node joins:
// an address in use fails [StartNode].
func AutomanagedProvider(opts AutomanagedOptions) (cluster.ClusterProvider, error) {
	if opts.Addr == "" {
		opts.Addr = "127.0.0.1:6330"
	}
	if opts.RefreshInterval <= 0 {
		opts.RefreshInterval = time.Second
	}
	host, portStr, err := net.SplitHostPort(opts.Addr)
	port, perr := strconv.Atoi(portStr)
	if err != nil || perr != nil || host == "" || port <= 0 || port > 65535 {
		return nil, fmt.Errorf("residency: automanaged provider: address %q: want host:port with a port in 1..65535 (the peers must know it)", opts.Addr)
	}
	hosts := []string{opts.Addr}
	for _, p := range opts.Peers {
		if _, _, err := net.SplitHostPort(p); err != nil {
			return nil, fmt.Errorf("residency: automanaged provider: peer %q: want host:port", p)
		}
		if p != opts.Addr {
			hosts = append(hosts, p)
		}
	}
	e := echo.New()
	e.HideBanner = true
	e.HidePort = true
	ap := &automanagedProvider{addr: opts.Addr, port: port, echo: e}
	e.GET("/_health", ap.health)
	ap.AutoManagedProvider = automanaged.NewWithTesting(opts.RefreshInterval, port, e, hosts...)
	return ap, nil
}

// automanagedProvider is protoactor's automanaged provider with a health
// check served on a listener of ours (protoactor's listens on 0.0.0.0).
type automanagedProvider struct {
	*automanaged.AutoManagedProvider
	addr string
	port int
	echo *echo.Echo

	mu sync.Mutex
	cl *cluster.Cluster
	ln net.Listener
}

// health answers a peer's health check with this member's record.
func (p *automanagedProvider) health(c echo.Context) error {
	p.mu.Lock()
	cl := p.cl
	p.mu.Unlock()
	if cl == nil {
		return c.NoContent(http.StatusServiceUnavailable)
	}
	host, port, err := cl.ActorSystem.GetHostPort()
	if err != nil {
		return c.NoContent(http.StatusServiceUnavailable)
	}
	return c.JSON(http.StatusOK, automanaged.NewNode(cl.Config.Name, cl.ActorSystem.ID, host, port, p.port, cl.GetClusterKinds()))
}

// StartMember listens on the configured address, then joins.
func (p *automanagedProvider) StartMember(c *cluster.Cluster) error {
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		return fmt.Errorf("residency: automanaged provider: cannot listen at %s: %w", p.addr, err)
	}
	p.mu.Lock()
	p.cl, p.ln = c, ln
	p.mu.Unlock()
	p.echo.Listener = ln
	return p.AutoManagedProvider.StartMember(c)
}

// Shutdown stops the health check and the polling.
func (p *automanagedProvider) Shutdown(graceful bool) error {
	err := p.AutoManagedProvider.Shutdown(graceful)
	p.mu.Lock()
	if p.ln != nil {
		_ = p.ln.Close()
	}
	p.mu.Unlock()
	return err
}
