// Package nodeproc holds the command protocol of residency cluster nodes
// run as processes (`demo node`): one JSON [Command] per line on the
// node's standard input, one JSON [Reply] per line on its standard output
// (after a [Ready] line). [Server] is the node's side of it; [Proc] runs a
// node process (and [StartEtcd] etcd on loopback) and drives it.
// `demo cluster-demo` and the multi-process tests (tests/clusterproc) use
// it; docs/cluster.md describes the protocol.
package nodeproc

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cluster"
)

// Command is one line of a node's standard input. Op is one of:
//
//	register  Name, Bytes, At, Seed: register a value resident at At with
//	          the deterministic bytes of [Pattern](Seed, Bytes); with Source
//	          instead of At, register it resident nowhere, with a loader
//	          that produces those bytes (through a temporary buffer at
//	          Source) when it is placed
//	copy      Name, Bytes, From, At (Remote, Source, Location): register
//	          Name with a remote source, the value Remote (default Name) of
//	          node From, and place it at At (the bytes stream in chunks,
//	          through a temporary buffer at Source, default pageable-host;
//	          Location picks the owner's copy); the reply carries the digest
//	          read back at At. A failed copy discards Name again.
//	read      Name, At: the digest of the bytes at At
//	discard   Name
//	whereis   Name: the directory's answer
//	members   this node's member list
//	summaries this node's view of every node's location summaries
//	refresh   publish directory entries and summaries now
//	place     Name, Value, Tiers (Hold, MaxAttempts): this node places the
//	          cluster request Name, needing Value at one location of Tiers
//	          (node-qualified, "@*" or bare locations), with
//	          [cluster.Node.Place]; the reply's Placement carries the
//	          evidence, also on failure. With Hold the node keeps the
//	          placement (its leases on the chosen node) until release.
//	release   Name: release the held placement Name
//	inspect   Name: the value's materializations on this node, with their
//	          use counts (leases)
//
// TimeoutMS bounds the command (0: the default, 30 s; at most one day).
//
// A node reads each line as strictly as `demo replay` reads a script line
// (the same JSON reader): a duplicate key, a field the op does not take, a
// field of the wrong type, bytes ≤ 0, register with both or neither of At
// and Source, or a line longer than 64 KiB is refused with an
// InvalidInputError reply, which carries the line's id when one can be
// read from it; the node keeps serving. Bytes may also be written as a
// string such as "16MiB". Register makes the pattern's bytes only once
// the runtime admitted them (a reservation at At first); a location
// without a budget takes at most 1 GiB per register.
type Command struct {
	ID       int64  `json:"id"`
	Op       string `json:"op"`
	Name     string `json:"name,omitempty"`
	Bytes    int64  `json:"bytes,omitempty"`
	At       string `json:"at,omitempty"`
	Seed     int64  `json:"seed,omitempty"`
	From     string `json:"from,omitempty"`
	Remote   string `json:"remote,omitempty"`
	Source   string `json:"source,omitempty"`
	Location string `json:"location,omitempty"`
	// place
	Value       string     `json:"value,omitempty"`
	Tiers       [][]string `json:"tiers,omitempty"`
	Hold        bool       `json:"hold,omitempty"`
	MaxAttempts int        `json:"max_attempts,omitempty"`
	TimeoutMS   int64      `json:"timeout_ms,omitempty"`
}

// Reply is a node's answer to one [Command] (same ID). ErrorType names the
// runtime's error type in the error's chain: "UnavailableError",
// "BudgetError", "InvalidInputError", "DeadlineExceeded", then
// "PlanExecutionError", "PlanError", "InUseError", "StaleStateError",
// "SearchLimitError", "PlacementError"; "InternalError" for a bug of the
// node (logged; it keeps serving); Go's %T for anything else. A refused
// line's reply has Op "?" when the line names no known op.
type Reply struct {
	ID        int64                 `json:"id"`
	Op        string                `json:"op"`
	OK        bool                  `json:"ok"`
	Error     string                `json:"error,omitempty"`
	ErrorType string                `json:"error_type,omitempty"`
	SHA256    string                `json:"sha256,omitempty"`
	Bytes     int64                 `json:"bytes,omitempty"`
	Members   []string              `json:"members,omitempty"`
	Residency []cluster.Residency   `json:"residency,omitempty"`
	Summaries []cluster.NodeSummary `json:"summaries,omitempty"`
	// Placement answers place: where and why, or (failed) every node
	// asked and its reason.
	Placement *Placement `json:"placement,omitempty"`
	// Materializations answers inspect.
	Materializations []Materialization `json:"materializations,omitempty"`
	ElapsedMS        float64           `json:"elapsed_ms"`
}

// Placement is the evidence of a place command: the [cluster.Placement]
// (Node, Why, Candidates in rank order, Attempts, Decision), or, when no
// node admitted the request, the [cluster.PlacementError]'s candidates,
// attempts and the nodes not asked (Node and Why empty).
type Placement struct {
	Request    string                       `json:"request"`
	Node       string                       `json:"node,omitempty"`
	Why        string                       `json:"why,omitempty"`
	Candidates []cluster.PlacementCandidate `json:"candidates,omitempty"`
	Attempts   []Attempt                    `json:"attempts,omitempty"`
	NotTried   []string                     `json:"not_tried,omitempty"`
	Decision   *cluster.NodeDecision        `json:"decision,omitempty"`
	// Directory: per value whose directory lookup failed, what happened
	// (the placement then ranked by room only).
	Directory []string `json:"directory,omitempty"`
	// Stage: what a failed placement was doing when its deadline ended
	// before any node was asked (empty otherwise).
	Stage string `json:"stage,omitempty"`
}

// Attempt is one node a placement asked; Error is empty for the node that
// admitted it. ErrorType is named as in [Reply].
type Attempt struct {
	Node      string `json:"node"`
	Error     string `json:"error,omitempty"`
	ErrorType string `json:"error_type,omitempty"`
}

// Materialization is one copy of a value on the node that answers inspect.
type Materialization struct {
	Location string `json:"location"` // unqualified: the node's own
	State    string `json:"state"`    // entering, resident, leaving
	Bytes    int64  `json:"bytes"`    // charged
	UseCount int    `json:"use_count"`
}

// ErrorType names the runtime's error type found in err's chain, as
// [Reply].ErrorType does: the Go name of its class
// ([system.ErrorKind.TypeName], from [system.ErrorClass]). A refusal about
// the endpoint, the budget or the input (UnavailableError, BudgetError,
// InvalidInputError) is named wherever it is in the chain, before a
// context deadline ("DeadlineExceeded") and before the outermost class.
func ErrorType(err error) string {
	classes := classesIn(err)
	for _, first := range []system.ErrorKind{system.ErrorUnavailable, system.ErrorBudget, system.ErrorInvalidInput} {
		if slices.Contains(classes, first) {
			return first.TypeName()
		}
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "DeadlineExceeded"
	}
	if len(classes) > 0 {
		return classes[0].TypeName()
	}
	var pla *cluster.PlacementError
	if errors.As(err, &pla) {
		return "PlacementError"
	}
	return fmt.Sprintf("%T", err)
}

// classesIn lists the classes of the errors in err's tree, outermost
// first: its chain and, through an error that joins several (a
// placement's attempts, errors.Join), each of theirs.
func classesIn(err error) []system.ErrorKind {
	var out []system.ErrorKind
	var walk func(e error)
	walk = func(e error) {
		for e != nil {
			if k, x := system.ClassifiedError(e); x == e && k != system.ErrorOther {
				out = append(out, k)
			}
			if j, ok := e.(interface{ Unwrap() []error }); ok {
				for _, c := range j.Unwrap() {
					walk(c)
				}
				return
			}
			e = errors.Unwrap(e)
		}
	}
	walk(err)
	return out
}

// Ready is the first line a node prints once it is a member.
type Ready struct {
	Event    string `json:"event"` // "ready"
	Node     string `json:"node"`
	Address  string `json:"address"`
	Cluster  string `json:"cluster"`
	Provider string `json:"provider"`
	PID      int    `json:"pid"`
}

// Pattern is the deterministic content of a value registered with a seed:
// every process computes the same bytes from (seed, size). A size ≤ 0 is
// no bytes (nil); the caller bounds size (a node makes a value's pattern
// only once its budget admitted it).
func Pattern(seed, size int64) []byte {
	if size <= 0 {
		return nil
	}
	b := make([]byte, size)
	NewPatternStream(seed).Fill(b)
	return b
}

// PatternStream produces the bytes of [Pattern] for a seed in order, piece
// by piece, in constant memory: the first Fill writes the pattern's first
// bytes, the next one continues where it stopped.
type PatternStream struct{ x uint64 }

// NewPatternStream starts the pattern of seed at its first byte.
func NewPatternStream(seed int64) *PatternStream {
	return &PatternStream{x: uint64(seed)*0x9e3779b97f4a7c15 + 1}
}

// Fill writes the next len(b) bytes of the pattern into b.
func (p *PatternStream) Fill(b []byte) {
	x := p.x
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
	p.x = x
}

// ErrExited is returned for a command to a node process that has exited.
var ErrExited = errors.New("node process exited")

// Proc is a running `demo node` process.
type Proc struct {
	Ready Ready

	cmd   *exec.Cmd
	stdin io.WriteCloser
	wmu   sync.Mutex // serializes writes to stdin

	mu      sync.Mutex
	nextID  int64
	waiting map[int64]chan Reply

	ready   chan Ready
	done    chan struct{} // closed when the process has exited
	exitErr error
}

// sysProcAttr puts children in their own process group (a Ctrl-C on the
// terminal reaches the parent only, which stops them in order) and kills
// them if the parent dies first.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// Start runs exe with args (which should start with "node") and waits for
// its ready line, until ctx ends. The node's logs go to logs. On failure
// the process is killed and the error says whether it exited (with its
// status) or ctx ended.
func Start(ctx context.Context, exe string, args []string, logs io.Writer) (*Proc, error) {
	p := &Proc{waiting: map[int64]chan Reply{}, ready: make(chan Ready, 1), done: make(chan struct{})}
	p.cmd = exec.Command(exe, args...)
	p.cmd.Stderr = logs
	p.cmd.SysProcAttr = sysProcAttr()
	var err error
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go p.read(out)
	select {
	case r := <-p.ready:
		p.Ready = r
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("nodeproc: %v exited before it was ready: %v", args, p.exitErr)
	case <-ctx.Done():
		p.Kill()
		return nil, fmt.Errorf("nodeproc: %v not ready: %w", args, ctx.Err())
	}
}

// read routes the ready line and the replies, then reaps the process.
func (p *Proc) read(out io.Reader) {
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	first := true
	for sc.Scan() {
		line := sc.Bytes()
		if first {
			first = false
			var r Ready
			if json.Unmarshal(line, &r) == nil && r.Event == "ready" {
				p.ready <- r
				continue
			}
		}
		var r Reply
		if json.Unmarshal(line, &r) != nil {
			continue
		}
		p.mu.Lock()
		ch := p.waiting[r.ID]
		delete(p.waiting, r.ID)
		p.mu.Unlock()
		if ch != nil {
			ch <- r
		}
	}
	_, _ = io.Copy(io.Discard, out)
	p.exitErr = p.cmd.Wait()
	close(p.done)
}

// Do sends c (its ID is assigned here) and waits for the reply, the
// process's exit ([ErrExited]) or ctx's end.
func (p *Proc) Do(ctx context.Context, c Command) (Reply, error) {
	ch := make(chan Reply, 1)
	p.mu.Lock()
	p.nextID++
	c.ID = p.nextID
	p.waiting[c.ID] = ch
	p.mu.Unlock()
	b, _ := json.Marshal(c)
	p.wmu.Lock()
	_, err := p.stdin.Write(append(b, '\n'))
	p.wmu.Unlock()
	if err != nil {
		p.forget(c.ID)
		select {
		case <-p.done:
			return Reply{}, fmt.Errorf("%w: %s: %v", ErrExited, p.Ready.Node, p.exitErr)
		default:
			return Reply{}, err
		}
	}
	select {
	case r := <-ch:
		return r, nil
	case <-p.done:
		p.forget(c.ID)
		return Reply{}, fmt.Errorf("%w: %s: %v", ErrExited, p.Ready.Node, p.exitErr)
	case <-ctx.Done():
		p.forget(c.ID)
		return Reply{}, ctx.Err()
	}
}

func (p *Proc) forget(id int64) {
	p.mu.Lock()
	delete(p.waiting, id)
	p.mu.Unlock()
}

// PID is the process id.
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Kill sends SIGKILL (kill -9: no goodbye to the cluster) and waits for the
// process to be reaped.
func (p *Proc) Kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Stop sends SIGTERM (the node leaves the cluster and exits 0) and waits up
// to grace, then kills it. It returns the exit error (nil for status 0), or
// an error saying it had to be killed.
func (p *Proc) Stop(grace time.Duration) error {
	select {
	case <-p.done:
		return p.exitErr
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	_ = p.stdin.Close()
	select {
	case <-p.done:
		return p.exitErr
	case <-time.After(grace):
		// SIGQUIT first: Go writes every goroutine's stack to the node's
		// log, which says where it was stuck.
		_ = p.cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-p.done:
		case <-time.After(2 * time.Second):
			p.Kill()
		}
		return fmt.Errorf("nodeproc: %s did not stop within %s after SIGTERM: stopped with SIGQUIT (its goroutines are in its log)", p.Ready.Node, grace)
	}
}

// FreePort returns a loopback TCP port that was free a moment ago. It is
// taken below the kernel's ephemeral range when it can
// (/proc/sys/net/ipv4/ip_local_port_range): a listener on port 0 — every
// node's own remote port — is given ephemeral ports only, so it cannot
// take the port between this probe and its use (a race that made a node
// fail with "address already in use"). Ports handed out by this process
// are not handed out again.
func FreePort() (int, error) {
	if lo, ok := ephemeralLow(); ok && lo > freePortFloor+1000 {
		freePorts.mu.Lock()
		defer freePorts.mu.Unlock()
		for range 200 {
			port := freePortFloor + rand.IntN(lo-freePortFloor)
			if freePorts.given[port] {
				continue
			}
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
			if err != nil {
				continue
			}
			_ = l.Close()
			freePorts.given[port] = true
			return port, nil
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// freePortFloor is the lowest port FreePort hands out below the
// ephemeral range.
const freePortFloor = 20000

var freePorts = struct {
	mu    sync.Mutex
	given map[int]bool
}{given: map[int]bool{}}

// ephemeralLow is the first port of the kernel's ephemeral range.
func ephemeralLow() (int, bool) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, false
	}
	lo, err := strconv.Atoi(f[0])
	return lo, err == nil
}

// EtcdBinary returns the path of etcd (Debian's etcd-server installs
// /usr/bin/etcd), or "" when it is not installed.
func EtcdBinary() string {
	if st, err := os.Stat("/usr/bin/etcd"); err == nil && !st.IsDir() {
		return "/usr/bin/etcd"
	}
	if p, err := exec.LookPath("etcd"); err == nil {
		return p
	}
	return ""
}

// Etcd is a single-member etcd listening on loopback.
type Etcd struct {
	Endpoint string // host:port of the client URL
	bin      string
	dataDir  string
	cport    int
	pport    int
	cmd      *exec.Cmd
	done     chan struct{}
	exitErr  error
}

// StartEtcd runs bin with its data in dataDir (which it creates) on two
// free loopback ports and waits until its /health answers true, until ctx
// ends. Its logs go to logs.
func StartEtcd(ctx context.Context, bin, dataDir string, logs io.Writer) (*Etcd, error) {
	cport, err := FreePort()
	if err != nil {
		return nil, err
	}
	pport, err := FreePort()
	if err != nil {
		return nil, err
	}
	e := &Etcd{Endpoint: "127.0.0.1:" + strconv.Itoa(cport), bin: bin, dataDir: dataDir, cport: cport, pport: pport}
	if err := e.run(ctx, logs); err != nil {
		return nil, err
	}
	return e, nil
}

// Restart starts a stopped etcd again on the same ports with the same
// data (its members' keys and leases survive), and waits until it is
// healthy, until ctx ends.
func (e *Etcd) Restart(ctx context.Context, logs io.Writer) error {
	select {
	case <-e.done:
	default:
		return fmt.Errorf("nodeproc: etcd at %s is still running", e.Endpoint)
	}
	return e.run(ctx, logs)
}

func (e *Etcd) run(ctx context.Context, logs io.Writer) error {
	client := "http://127.0.0.1:" + strconv.Itoa(e.cport)
	peer := "http://127.0.0.1:" + strconv.Itoa(e.pport)
	e.done, e.exitErr = make(chan struct{}), nil
	e.cmd = exec.Command(e.bin, "--name", "residency-test", "--data-dir", e.dataDir,
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "residency-test="+peer, "--initial-cluster-state", "new")
	e.cmd.Stdout, e.cmd.Stderr = logs, logs
	e.cmd.SysProcAttr = sysProcAttr()
	if err := e.cmd.Start(); err != nil {
		return err
	}
	done := e.done
	go func() {
		e.exitErr = e.cmd.Wait()
		close(done)
	}()
	hc := &http.Client{Timeout: time.Second}
	defer hc.CloseIdleConnections()
	for {
		if ok := etcdHealthy(hc, client); ok {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("nodeproc: etcd exited before it was healthy: %v", e.exitErr)
		case <-ctx.Done():
			e.Stop(5 * time.Second)
			return fmt.Errorf("nodeproc: etcd at %s not healthy: %w", e.Endpoint, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func etcdHealthy(hc *http.Client, url string) bool {
	resp, err := hc.Get(url + "/health")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var h struct {
		Health string `json:"health"`
	}
	return json.NewDecoder(resp.Body).Decode(&h) == nil && h.Health == "true"
}

// PID is etcd's process id.
func (e *Etcd) PID() int { return e.cmd.Process.Pid }

// Stop sends SIGTERM, waits up to grace, then kills etcd.
func (e *Etcd) Stop(grace time.Duration) {
	_ = e.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.done:
	case <-time.After(grace):
		_ = e.cmd.Process.Signal(syscall.SIGKILL)
		<-e.done
	}
}

// Kill kills etcd with SIGKILL and waits for it to exit.
func (e *Etcd) Kill() {
	_ = e.cmd.Process.Signal(syscall.SIGKILL)
	<-e.done
}
