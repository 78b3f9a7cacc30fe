package cluster

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/residency-go/residency/budget"
)

// tlsProbeRead bounds how long a probe waits, after a TLS handshake, for
// the member's first bytes or its refusal of our certificate (with TLS 1.3
// a server verifies the client's certificate after the client considers
// the handshake done, and says so with an alert).
const tlsProbeRead = 250 * time.Millisecond

// serverTLS and clientTLS derive the two sides from NodeOptions.TLS: the
// server requires and verifies a client certificate (against ClientCAs,
// or RootCAs when ClientCAs is nil); the client verifies the server's
// (RootCAs; the server name is the host of the member's address unless
// ServerName is set).
func serverTLS(c *tls.Config) *tls.Config {
	s := c.Clone()
	s.ClientAuth = tls.RequireAndVerifyClientCert
	if s.ClientCAs == nil {
		s.ClientCAs = s.RootCAs
	}
	return s
}

func clientTLS(c *tls.Config) *tls.Config { return c.Clone() }

// checkTLS refuses a TLS configuration that cannot be mutual.
func checkTLS(node string, c *tls.Config) error {
	if c == nil {
		return nil
	}
	if len(c.Certificates) == 0 && c.GetCertificate == nil && c.GetClientCertificate == nil {
		return &budget.InvalidInputError{Message: fmt.Sprintf("node %q: TLS needs the node's certificate (Certificates): members authenticate each other", node)}
	}
	if c.RootCAs == nil {
		return &budget.InvalidInputError{Message: fmt.Sprintf("node %q: TLS needs RootCAs, the authority that signed the members' certificates", node)}
	}
	if c.InsecureSkipVerify {
		return &budget.InvalidInputError{Message: fmt.Sprintf("node %q: TLS with InsecureSkipVerify would accept any member", node)}
	}
	return nil
}

// transport returns the dial credentials and server options of the
// node's remote layer: mutual TLS when NodeOptions.TLS is set, plaintext
// otherwise.
func (n *Node) transport() (grpc.DialOption, []grpc.ServerOption, error) {
	if n.opts.TLS == nil {
		return grpc.WithTransportCredentials(insecure.NewCredentials()), nil, nil
	}
	if err := checkTLS(n.name, n.opts.TLS); err != nil {
		return nil, nil, err
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(clientTLS(n.opts.TLS))),
		[]grpc.ServerOption{grpc.Creds(credentials.NewTLS(serverTLS(n.opts.TLS)))}, nil
}

// probe checks that a member's address accepts this node: a TCP connect,
// and with TLS the handshake (both certificates verified) plus a short
// read that catches the member's refusal of ours. Its error says why.
func (n *Node) probe(addr string, d time.Duration) error {
	dialer := &net.Dialer{Timeout: d}
	if n.opts.TLS == nil {
		conn, err := dialer.Dial("tcp", addr)
		if err != nil {
			return err
		}
		return conn.Close()
	}
	cfg := clientTLS(n.opts.TLS)
	cfg.NextProtos = []string{"h2"}
	conn, err := tls.DialWithDialer(dialer, "tcp", addr, cfg)
	if err != nil {
		return fmt.Errorf("TLS handshake: %w", err)
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(min(d, tlsProbeRead)))
	var b [1]byte
	if _, err := conn.Read(b[:]); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return nil // nothing said yet: not refused
		}
		return fmt.Errorf("TLS: the member refused this node (its client certificate is missing or not signed by an authority the member trusts): %w", err)
	}
	return nil
}
