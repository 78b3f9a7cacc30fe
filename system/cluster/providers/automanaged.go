package providers

import (
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/clusterproviders/automanaged"
	"github.com/labstack/echo"
)

// AutomanagedOptions configures [Automanaged].
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

// Automanaged returns a cluster provider without an external service
// (protoactor's automanaged provider), for the Provider of a node's
// options (package system/cluster): every node serves a small HTTP health
// check at opts.Addr and polls the peers' checks; the members are the
// nodes that answer. Unlike protoactor's default, which listens on
// 0.0.0.0, the check listens on opts.Addr only (loopback by default). The
// address is listened on when the node joins: an address in use fails
// cluster.StartNode.
func Automanaged(opts AutomanagedOptions) (cluster.ClusterProvider, error) {
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
