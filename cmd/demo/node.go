package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/residency-go/residency/internal/nodeproc"
	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cluster"
	"github.com/residency-go/residency/system/cluster/providers"
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
	tlsCert, tlsKey, tlsCA            string
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

// Set adds one location: a well-formed name (pageable-host, pinned-host,
// cuda:N) not given before, and a budget > 0 or "unlimited".
func (l *locationFlags) Set(s string) error {
	name, size, ok := strings.Cut(s, "=")
	if !ok || name == "" {
		return fmt.Errorf("want NAME=SIZE (cuda:0=8GiB) or NAME=unlimited, got %q", s)
	}
	if _, _, err := system.SplitLocation(name); err != nil {
		var inv *system.InvalidInputError
		if errors.As(err, &inv) {
			return errors.New(inv.Message)
		}
		return err
	}
	for _, c := range *l {
		if c.Name == name {
			return fmt.Errorf("location %s is given twice", name)
		}
	}
	if size == "unlimited" {
		*l = append(*l, system.NoLimit(name))
		return nil
	}
	n, err := parseByteString(size)
	if err != nil {
		return err
	}
	if n <= 0 {
		return fmt.Errorf("budget %q of %s: want a size > 0 (or unlimited)", size, name)
	}
	*l = append(*l, system.Limit(name, n))
	return nil
}

// ofNode refuses a location qualified with a node other than name, and
// one given twice once its qualifier is dropped (cuda:0 and cuda:0@name).
func (l locationFlags) ofNode(name string) error {
	seen := map[string]bool{}
	for _, c := range l {
		local, node, err := system.SplitLocation(c.Name)
		if err != nil {
			return err
		}
		if node != "" && node != name {
			return fmt.Errorf("%s is memory of node %q, not of this node (%q): a node configures only its own locations", c.Name, node, name)
		}
		if seen[local] {
			return fmt.Errorf("%s is given twice (as %s and as %s@%s)", local, local, local, name)
		}
		seen[local] = true
	}
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
	var c nodeConfig
	fs.StringVar(&c.name, "name", "", "the node's `name` (required; unique in the cluster)")
	fs.StringVar(&c.clusterName, "cluster-name", "residency", "the cluster's `name`")
	fs.StringVar(&c.provider, "provider", "etcd", "membership provider: `etcd` or automanaged")
	fs.StringVar(&c.addr, "addr", "127.0.0.1:0", "`host:port` this node listens on and other members reach it at: a loopback address, or with --tls-cert, --tls-key and --tls-ca an address of this machine that the other members can reach (not 0.0.0.0 or ::)")
	fs.StringVar(&c.tlsCert, "tls-cert", "", "PEM `file` of this node's certificate (mutual TLS between members; with --tls-key and --tls-ca)")
	fs.StringVar(&c.tlsKey, "tls-key", "", "PEM `file` of the private key of --tls-cert")
	fs.StringVar(&c.tlsCA, "tls-ca", "", "PEM `file` of the authority (or authorities) that signed the members' certificates")
	fs.StringVar(&c.etcd, "etcd", "127.0.0.1:2379", "etcd `endpoints`, comma-separated (provider etcd)")
	fs.DurationVar(&c.etcdDialTimeout, "etcd-dial-timeout", 5*time.Second, "give up when etcd does not answer within this `duration`")
	fs.StringVar(&c.autoAddr, "automanaged-addr", "127.0.0.1:6330", "`host:port` of this node's health check (provider automanaged; plain HTTP)")
	fs.StringVar(&c.peers, "peers", "", "health-check `addresses` of the other nodes, comma-separated (provider automanaged)")
	fs.DurationVar(&c.autoRefresh, "automanaged-refresh", time.Second, "pause between two rounds of health checks (provider automanaged)")
	fs.Var(&c.locations, "location", "a location of this node and its budget, `NAME=SIZE` (cuda:0=8GiB) or NAME=unlimited; repeat it (default pageable-host=4GiB and cuda:0=8GiB)")
	fs.DurationVar(&c.requestTimeout, "request-timeout", 10*time.Second, "bound of one request to another node")
	fs.DurationVar(&c.refresh, "refresh", 250*time.Millisecond, "at most one directory and summary publication per `interval`")
	fs.StringVar(&c.logLevel, "log-level", "info", "log `level`: debug, info, warn, error or disabled")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), nodeUsage)
		fs.PrintDefaults()
	}
	help := &outputWriter{w: stdout} // the usage after --help; the replies report their own write errors
	if code, ok := parseFlags(fs, args, help, stderr); !ok {
		return help.check("demo node", code, stderr)
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
	if err := c.locations.ofNode(c.name); err != nil {
		fmt.Fprintf(stderr, "demo node: --location: %v\n", err)
		return 2
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"etcd-dial-timeout", c.etcdDialTimeout}, {"automanaged-refresh", c.autoRefresh},
		{"request-timeout", c.requestTimeout}, {"refresh", c.refresh}} {
		if d.v <= 0 {
			fmt.Fprintf(stderr, "demo node: --%s %v: want a duration > 0\n", d.flag, d.v)
			return 2
		}
	}
	level, err := zerolog.ParseLevel(c.logLevel)
	if err != nil {
		fmt.Fprintf(stderr, "demo node: --log-level: %v\n", err)
		return 2
	}
	tlsConf, err := nodeTLS(c)
	if err != nil {
		fmt.Fprintf(stderr, "demo node: %v\n", err)
		return 2
	}
	if err := checkNodeAddr(c.addr, tlsConf != nil); err != nil {
		fmt.Fprintf(stderr, "demo node: %v\n", err)
		return 2
	}
	// The runtime's logger: the node's own lines carry "node" already.
	log := zerolog.New(stderr).Level(level).With().Timestamp().Logger()
	if c.provider == "automanaged" && !isLoopbackHost(c.autoAddr) {
		log.Warn().Str("automanaged_addr", c.autoAddr).Msg("the automanaged health check is plain HTTP on a non-loopback address: anyone who reaches it sees this node's membership record (TLS covers the transport between members, not the provider)")
	}
	return runNode(ctx, c, tlsConf, log, stdin, stdout)
}

// nodeTLS loads --tls-cert, --tls-key and --tls-ca: all three or none
// (nil: plaintext).
func nodeTLS(c nodeConfig) (*tls.Config, error) {
	given := 0
	for _, f := range []string{c.tlsCert, c.tlsKey, c.tlsCA} {
		if f != "" {
			given++
		}
	}
	switch given {
	case 0:
		return nil, nil
	case 3:
	default:
		return nil, errors.New("mutual TLS needs all of --tls-cert, --tls-key and --tls-ca")
	}
	var pems [3][]byte
	for i, f := range []struct{ flag, path string }{{"tls-cert", c.tlsCert}, {"tls-key", c.tlsKey}, {"tls-ca", c.tlsCA}} {
		b, err := readPEMFile(f.path)
		if err != nil {
			return nil, fmt.Errorf("--%s %s: %v", f.flag, escapeText(f.path), err)
		}
		pems[i] = b
	}
	cert, err := tls.X509KeyPair(pems[0], pems[1])
	if err != nil {
		return nil, fmt.Errorf("--tls-cert %s, --tls-key %s: %v", escapeText(c.tlsCert), escapeText(c.tlsKey), err)
	}
	pem := pems[2]
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--tls-ca %s: no PEM certificate in it", escapeText(c.tlsCA))
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// maxPEMBytes bounds each of --tls-cert, --tls-key and --tls-ca: a chain
// of certificates or a key is a few KiB, a bundle of every public
// authority about 200 KiB.
const maxPEMBytes = 1 << 20

// readPEMFile reads the file at path, at most maxPEMBytes (more is an
// error saying so: /dev/zero or a wrong file is refused, not read
// without end).
func readPEMFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxPEMBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxPEMBytes {
		return nil, fmt.Errorf("larger than %d bytes (1 MiB), the most a PEM file of certificates or a key may hold here", maxPEMBytes)
	}
	return b, nil
}

// checkNodeAddr refuses an --addr the node must not listen on: a wildcard
// (0.0.0.0, ::, an empty host) is never the address other members reach
// it at, which is what it advertises; an address other than loopback
// needs TLS (the transport between members is otherwise plaintext and
// unauthenticated).
func checkNodeAddr(addr string, withTLS bool) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--addr %q: want host:port (%v)", addr, err)
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || port != strconv.FormatUint(p, 10) {
		return fmt.Errorf("--addr %q: the port must be a number 0 to 65535 (0: any free port)", addr)
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		return fmt.Errorf("--addr %q: the node advertises the address it listens on, and a wildcard is no address another member can reach: give an address of this machine (127.0.0.1, or with TLS its LAN address)", addr)
	}
	if !withTLS && !isLoopbackHost(addr) {
		return fmt.Errorf("--addr %q is not a loopback address: members would talk in plaintext, unauthenticated, over the network; give --tls-cert, --tls-key and --tls-ca (docs/cluster.md, Security), or listen on 127.0.0.1", addr)
	}
	return nil
}

// isLoopbackHost reports whether the host of host:port is a loopback IP or
// "localhost".
func isLoopbackHost(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// runNode starts the node, prints the ready line, serves commands and
// leaves the cluster when ctx ends.
func runNode(ctx context.Context, c nodeConfig, tlsConf *tls.Config, rtLog zerolog.Logger, stdin io.Reader, stdout io.Writer) int {
	log := rtLog.With().Str("node", c.name).Logger()
	backend, err := newSoftBackend(c.locations) // simulated devices, asked for by name
	if err != nil {
		log.Error().Err(err).Msg("cannot start the node")
		return 1
	}
	defer backend.Close()
	opts := cluster.NodeOptions{
		Name: c.name, ClusterName: c.clusterName, Addr: c.addr, TLS: tlsConf,
		Options:        system.Options{Locations: c.locations, Logger: &rtLog, Backend: backend},
		RequestTimeout: c.requestTimeout, RefreshInterval: c.refresh,
	}
	switch c.provider {
	case "etcd":
		eps := strings.Split(c.etcd, ",")
		log.Info().Strs("endpoints", eps).Dur("dial_timeout", c.etcdDialTimeout).Msg("connecting to etcd")
		p, err := providers.Etcd(providers.EtcdOptions{Endpoints: eps, DialTimeout: c.etcdDialTimeout})
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
		p, err := providers.Automanaged(providers.AutomanagedOptions{Addr: c.autoAddr, Peers: peers, RefreshInterval: c.autoRefresh})
		if err != nil {
			log.Error().Err(err).Msg("cannot start the node")
			return 1
		}
		opts.Provider = p
	default:
		log.Error().Str("provider", c.provider).Msg("unknown provider: want etcd or automanaged")
		return 2
	}
	n, err := cluster.StartNode(ctx, opts)
	if err != nil {
		log.Error().Err(err).Msg("cannot start the node")
		return 1
	}
	closeNode := func() int {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := n.Close(cctx); err != nil {
			log.Error().Err(err).Msg("closing the node")
			return 1
		}
		log.Info().Msg("node stopped")
		return 0
	}
	srv := nodeproc.NewServer(n, stdout, log)
	if err := srv.WriteLine(map[string]any{"event": "ready", "node": n.Name(), "address": n.Address(),
		"cluster": c.clusterName, "provider": c.provider, "pid": os.Getpid()}); err != nil {
		log.Error().Msg("cannot print the ready line: leaving the cluster")
		closeNode()
		return 1
	}
	log.Info().Str("address", n.Address()).Msg("node ready")

	go srv.Serve(ctx, stdin)
	<-ctx.Done()
	log.Info().Msg("signal received: leaving the cluster")
	srv.Stop()
	return closeNode()
}
