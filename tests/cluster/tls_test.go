package cluster_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	testprovider "github.com/asynkron/protoactor-go/cluster/clusterproviders/test"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cluster"
)

// testCA is a throwaway certificate authority, in memory.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

// node issues a certificate for a member at 127.0.0.1, for both ends of a
// connection (server and client auth).
func (ca *testCA) node(t *testing.T, name string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func tlsConfig(cert tls.Certificate, roots *x509.CertPool) *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: roots, MinVersion: tls.VersionTLS13}
}

// Mutual TLS between members: two nodes with certificates from the
// cluster's CA stream a value between them; a node with a certificate
// from another CA (trusting that CA: it refuses the members' certificates
// too), one with a certificate from another CA that trusts the cluster's
// CA (the members refuse its certificate), and one without TLS are
// refused: each read of a member's value fails within its deadline with
// an UnavailableError saying why, the member never opens a stream for it,
// and the members cannot reach them either.
func TestMutualTLS(t *testing.T) {
	ca, other := newTestCA(t, "residency test CA"), newTestCA(t, "another CA")
	// The refused nodes ask with a short deadline; the members' own
	// requests get a long one, so that a slow machine cannot fail the
	// stream between them (a refusal never waits for it).
	short, long := 2*time.Second, 30*time.Second
	c := startNodes(t,
		cluster.NodeOptions{Name: "node-a", TLS: tlsConfig(ca.node(t, "node-a"), ca.pool), RequestTimeout: long,
			Options: locs(system.NoLimit("pageable-host"), system.Limit("cuda:0", 1<<20))},
		cluster.NodeOptions{Name: "node-b", TLS: tlsConfig(ca.node(t, "node-b"), ca.pool), RequestTimeout: long,
			Options: locs(system.NoLimit("pageable-host"))},
		cluster.NodeOptions{Name: "node-evil", TLS: tlsConfig(other.node(t, "node-evil"), other.pool), RequestTimeout: short,
			Options: locs(system.NoLimit("pageable-host"))},
		cluster.NodeOptions{Name: "node-stranger", TLS: tlsConfig(other.node(t, "node-stranger"), ca.pool), RequestTimeout: short,
			Options: locs(system.NoLimit("pageable-host"))},
		cluster.NodeOptions{Name: "node-plain", RequestTimeout: short,
			Options: locs(system.NoLimit("pageable-host"))},
	)
	a, b := c.nodes["node-a"], c.nodes["node-b"]
	ctx, cancel := context.WithTimeout(context.Background(), converge)
	defer cancel()

	data := bytes.Repeat([]byte("residency"), 1000)
	size := int64(len(data))
	ha, err := a.System().Register(ctx, system.Value{Name: "w", Bytes: size, At: "cuda:0", Data: data})
	require.NoError(t, err)

	// The members with the cluster's certificates talk.
	hb, err := b.RegisterRemote(ctx, system.Value{Name: "w", Bytes: size, Source: "pageable-host"}, cluster.RemoteSource{Node: "node-a", Handle: ha})
	require.NoError(t, err)
	require.NoError(t, b.System().Place(ctx, hb, "pageable-host"))
	lb, err := b.System().Acquire(ctx, hb, "pageable-host")
	require.NoError(t, err)
	got, err := lb.Read(ctx)
	require.NoError(t, err)
	require.Equal(t, data, got)
	require.NoError(t, lb.Release(ctx))
	rl, err := b.AcquireRemote(ctx, "node-a", system.Handle{Name: "w"}, "")
	require.NoError(t, err)
	require.NoError(t, rl.Release(ctx))

	// The others are refused, each within its deadline.
	for _, name := range []string{"node-evil", "node-stranger", "node-plain"} {
		x := c.nodes[name]
		hx, err := x.RegisterRemote(ctx, system.Value{Name: "w", Bytes: size, Source: "pageable-host"}, cluster.RemoteSource{Node: "node-a", Handle: system.Handle{Name: "w"}})
		require.NoError(t, err, "registering asks nothing of the owner")
		rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
		err = x.System().Place(rctx, hx, "pageable-host")
		require.NoError(t, rctx.Err(), "%s: refused before its deadline", name)
		rcancel()
		var un *system.UnavailableError
		require.ErrorAs(t, err, &un, "%s", name)
		switch name {
		case "node-evil":
			require.Contains(t, err.Error(), "certificate", "the handshake says why")
		case "node-stranger":
			require.Contains(t, err.Error(), "the member refused this node")
		}
		t.Logf("%s: %v", name, err)
		snap, err := x.System().Snapshot(ctx)
		require.NoError(t, err)
		_, resident := matOf(snap, "w", "pageable-host")
		require.False(t, resident, "%s never gets the bytes", name)
		_, err = x.AcquireRemote(ctx, "node-a", system.Handle{Name: "w"}, "")
		require.ErrorAs(t, err, &un, "%s", name)
		// The members do not reach it either.
		_, err = a.AcquireRemote(ctx, name, system.Handle{Name: "w"}, "")
		require.ErrorAs(t, err, &un, "node-a → %s", name)
	}
	// The transport binds to loopback by default: the node's address is
	// 127.0.0.1, and its port does not answer on the machine's other
	// addresses.
	bound, port, err := net.SplitHostPort(a.Address())
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1", bound)
	addrs, err := net.InterfaceAddrs()
	require.NoError(t, err)
	tried := 0
	for _, ad := range addrs {
		ipn, ok := ad.(*net.IPNet)
		if !ok || ipn.IP.IsLoopback() || ipn.IP.To4() == nil {
			continue
		}
		tried++
		conn, err := net.DialTimeout("tcp", net.JoinHostPort(ipn.IP.String(), port), 2*time.Second)
		if err == nil {
			_ = conn.Close()
		}
		require.Error(t, err, "the node answers on %s", ipn.IP)
	}
	t.Logf("checked %d non-loopback addresses", tried)

	// node-a never opened a stream or a lease for them: nothing charged.
	sa, err := a.System().Snapshot(ctx)
	require.NoError(t, err)
	m, ok := matOf(sa, "w", "cuda:0")
	require.True(t, ok)
	require.Equal(t, 0, m.UseCount)
	host, _ := sa.Location("pageable-host")
	require.Zero(t, host.ReservedBytes)
}

// A TLS configuration that cannot be mutual is refused before the node
// starts.
func TestTLSRefusals(t *testing.T) {
	ca := newTestCA(t, "ca")
	ctx := context.Background()
	for _, bad := range []*tls.Config{
		{RootCAs: ca.pool},
		{Certificates: []tls.Certificate{ca.node(t, "x")}},
		{Certificates: []tls.Certificate{ca.node(t, "x")}, RootCAs: ca.pool, InsecureSkipVerify: true},
	} {
		_, err := cluster.StartNode(ctx, cluster.NodeOptions{Name: "node-x", Provider: testprovider.NewTestProvider(testprovider.NewInMemAgent()), TLS: bad, Options: locs(system.NoLimit("pageable-host"))})
		requireInvalid(t, err, "TLS")
		require.False(t, strings.Contains(err.Error(), "join"), "refused before joining: %v", err)
	}
}
