package providers

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/clusterproviders/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// EtcdOptions configures [Etcd].
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

// Etcd returns a cluster provider backed by etcd (protoactor's etcd
// provider), for the Provider of a node's options (package
// system/cluster): the production choice. It checks that etcd answers
// before returning, blocking at most DialTimeout, and returns an error
// naming the endpoints when none does, so that a node pointed at a wrong
// or dead etcd fails at once instead of hanging in cluster.StartNode
// (protoactor's provider, given no dial timeout, waits forever). The node
// connects again when it joins, with the same bound: etcd gone by then
// fails cluster.StartNode with that error.
//
// Each member keeps its registration alive with an etcd lease of 3 s
// (protoactor's fixed value): a member that dies without leaving (kill -9,
// a lost machine) drops out of every member list about 3 s later. Use one
// provider per node; its etcd client is closed when the node is.
func Etcd(opts EtcdOptions) (cluster.ClusterProvider, error) {
	if len(opts.Endpoints) == 0 {
		return nil, errors.New("residency: etcd provider: no endpoints given")
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = 5 * time.Second
	}
	if opts.BaseKey == "" {
		opts.BaseKey = "/residency"
	}
	p := &etcdProvider{opts: opts, endpoints: strings.Join(opts.Endpoints, ",")}
	c, err := clientv3.New(p.config())
	if err != nil {
		return nil, p.unreachable(err)
	}
	err = p.check(c)
	_ = c.Close()
	if err != nil {
		return nil, err
	}
	return p, nil
}

// etcdProvider is protoactor's etcd provider, created when the node joins
// (a provider never started holds no connection), that checks etcd first
// and closes its client on shutdown.
type etcdProvider struct {
	opts      EtcdOptions
	endpoints string

	mu           sync.Mutex
	inner        *etcd.Provider
	client       *clientv3.Client
	stopAnnounce chan struct{} // closed at shutdown
	announced    chan struct{} // closed when reannounce returned
}

// config is the etcd client's: without a blocking dial the client returns
// at once and the provider's first request waits forever on an
// unreachable etcd.
func (p *etcdProvider) config() clientv3.Config {
	return clientv3.Config{
		Endpoints:   p.opts.Endpoints,
		DialTimeout: p.opts.DialTimeout,
		DialOptions: []grpc.DialOption{grpc.WithBlock()},
	}
}

func (p *etcdProvider) unreachable(err error) error {
	return fmt.Errorf("residency: etcd provider: cannot reach etcd at %s within %s: %w", p.endpoints, p.opts.DialTimeout, err)
}

// check asks etcd one question within DialTimeout.
func (p *etcdProvider) check(c *clientv3.Client) error {
	ctx, cancel := context.WithTimeout(context.Background(), p.opts.DialTimeout)
	defer cancel()
	if _, err := c.Get(ctx, p.opts.BaseKey+"/.health"); err != nil {
		return fmt.Errorf("residency: etcd provider: etcd at %s does not answer within %s: %w", p.endpoints, p.opts.DialTimeout, err)
	}
	return nil
}

// connect creates protoactor's provider and checks etcd.
func (p *etcdProvider) connect() (*etcd.Provider, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.inner != nil {
		return nil, errors.New("residency: etcd provider: already started (use one provider per node)")
	}
	inner, err := etcd.NewWithConfig(p.opts.BaseKey, p.config())
	if err != nil {
		return nil, p.unreachable(err)
	}
	c, err := etcdClientOf(inner)
	if err != nil {
		return nil, err
	}
	if err := p.check(c); err != nil {
		_ = c.Close()
		return nil, err
	}
	p.inner, p.client = inner, c
	return inner, nil
}

// StartMember connects (fails within DialTimeout when etcd does not
// answer) and joins.
func (p *etcdProvider) StartMember(c *cluster.Cluster) error {
	inner, err := p.connect()
	if err != nil {
		return err
	}
	if err := inner.StartMember(c); err != nil {
		p.closeClient()
		return fmt.Errorf("residency: etcd provider: joining through etcd at %s: %w", p.endpoints, err)
	}
	// protoactor's member key: <base>/<cluster>/<cluster>@<member id>.
	key := fmt.Sprintf("%s/%s/%s@%s", p.opts.BaseKey, c.Config.Name, c.Config.Name, c.ActorSystem.ID)
	p.mu.Lock()
	p.stopAnnounce, p.announced = make(chan struct{}), make(chan struct{})
	client := p.client
	p.mu.Unlock()
	go p.reannounce(client, key)
	return nil
}

// reannounce writes this member's key again, unchanged, a few times in
// the first seconds after joining. protoactor's provider reads the member
// list, then starts watching without a start revision: a member that
// registered in between (nodes starting together) is never seen. Each
// write is a new event on every member's watch, which adds the member
// it missed.
func (p *etcdProvider) reannounce(c *clientv3.Client, key string) {
	defer close(p.announced)
	for _, d := range reannounceDelays {
		select {
		case <-p.stopAnnounce:
			return
		case <-time.After(d):
		}
		ctx, cancel := context.WithTimeout(context.Background(), p.opts.DialTimeout)
		if r, err := c.Get(ctx, key); err == nil && len(r.Kvs) == 1 {
			kv := r.Kvs[0]
			_, _ = c.Put(ctx, key, string(kv.Value), clientv3.WithLease(clientv3.LeaseID(kv.Lease)))
		}
		cancel()
	}
}

// reannounceDelays are the pauses before each rewrite of the member key
// (about 15 s in all).
var reannounceDelays = []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second}

// closeClient closes the etcd client once.
func (p *etcdProvider) closeClient() {
	p.mu.Lock()
	c := p.client
	p.client = nil
	p.mu.Unlock()
	if c != nil {
		_ = c.Close()
	}
}

// StartClient connects and follows the members without joining.
func (p *etcdProvider) StartClient(c *cluster.Cluster) error {
	inner, err := p.connect()
	if err != nil {
		return err
	}
	if err := inner.StartClient(c); err != nil {
		p.closeClient()
		return fmt.Errorf("residency: etcd provider: following etcd at %s: %w", p.endpoints, err)
	}
	return nil
}

// Shutdown leaves (deregisters the member) and closes the etcd client.
func (p *etcdProvider) Shutdown(graceful bool) error {
	p.mu.Lock()
	inner, c := p.inner, p.client
	stop, done := p.stopAnnounce, p.announced
	p.client, p.stopAnnounce = nil, nil
	p.mu.Unlock()
	if stop != nil {
		close(stop)
		<-done
	}
	if inner == nil || c == nil {
		return nil
	}
	err := inner.Shutdown(graceful)
	_ = c.Close()
	return err
}

// etcdClientOf returns the etcd client inside protoactor's provider:
// protoactor never closes it (its Shutdown leaves the client's gRPC
// connection and lease keep-alive running forever) and offers no way to
// reach it, so it is read from the unexported field. The module version is
// pinned; a change of that field is an error here, not a silent leak.
func etcdClientOf(p *etcd.Provider) (*clientv3.Client, error) {
	f := reflect.ValueOf(p).Elem().FieldByName("client")
	if !f.IsValid() || f.Type() != reflect.TypeFor[*clientv3.Client]() {
		return nil, errors.New("residency: etcd provider: protoactor's etcd provider has no client field of type *clientv3.Client any more (update system/cluster/providers/etcd.go)")
	}
	return *(**clientv3.Client)(unsafe.Pointer(f.UnsafeAddr())), nil
}
