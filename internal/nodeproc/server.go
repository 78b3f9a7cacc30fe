package nodeproc

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cluster"
)

// replyWriter writes one JSON object per line, whole lines only. The
// first write error is kept (and logged once): a node whose standard
// output is gone cannot answer, but it keeps serving the cluster.
type replyWriter struct {
	mu  sync.Mutex
	w   io.Writer
	err error
	log *zerolog.Logger
}

func (r *replyWriter) write(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		b, _ = json.Marshal(Reply{Op: "?", Error: "cannot encode the reply: " + err.Error(), ErrorType: "Error"})
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return r.err
	}
	if _, err := r.w.Write(append(b, '\n')); err != nil {
		r.err = err
		if r.log != nil {
			r.log.Error().Err(err).Msg("writing to standard output: no further replies can be sent")
		}
		return err
	}
	return nil
}

// Server answers the commands of one node, as `demo node` does: it reads
// one JSON [Command] per line, runs each against the node in its own
// goroutine, and writes one JSON [Reply] per line (docs/cluster.md
// describes the protocol). Make it with [NewServer]; [Server.Serve] reads
// the commands, [Server.Stop] ends them.
type Server struct {
	n   *cluster.Node
	out *replyWriter
	log zerolog.Logger

	mu      sync.Mutex
	stopped bool
	held    map[string]*cluster.Placement // held placements, by request name
	wg      sync.WaitGroup
}

// NewServer returns the server of node n: it writes its replies to out
// and logs to log. A line the server refuses (malformed, unknown op or
// field) never reaches n.
func NewServer(n *cluster.Node, out io.Writer, log zerolog.Logger) *Server {
	s := &Server{n: n, log: log}
	s.out = &replyWriter{w: out, log: &s.log}
	return s
}

// WriteLine writes v as one JSON line between the replies (the node's
// ready line, say). After a failed write, no further line is written
// (and that error is returned again): a node whose standard output is
// gone cannot answer, but it keeps serving the cluster.
func (c *Server) WriteLine(v any) error { return c.out.write(v) }

// Stop refuses further commands and waits for those in flight (their
// contexts end with the one given to Serve).
func (c *Server) Stop() {
	c.mu.Lock()
	c.stopped = true
	c.mu.Unlock()
	c.wg.Wait()
}

// Serve reads commands from stdin until it ends, ctx does or Stop was
// called; each runs in its own goroutine (a driver may keep several in
// flight, up to 64), replies carry its id. A line that is not a command
// (malformed, unknown field, longer than 64 KiB) is answered with an
// InvalidInputError reply; the server keeps serving. A command runs
// until its timeout_ms (default 30 s) or ctx ends; one that hits a bug
// (a panic) is answered with an InternalError reply and logged.
func (c *Server) Serve(ctx context.Context, stdin io.Reader) {
	br := bufio.NewReaderSize(stdin, 64<<10)
	sem := make(chan struct{}, maxCommandsInFlight)
	var buf []byte
	for {
		line, tooLong, err := readCommandLine(br, buf, maxCommandLine)
		buf = line[:0:cap(line)]
		if err != nil {
			if err != io.EOF {
				c.log.Error().Err(err).Msg("reading commands from standard input")
			}
			return
		}
		cmd, reply, ok := commandOfLine(line, tooLong)
		if !ok {
			if reply != nil {
				_ = c.out.write(*reply)
			}
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		c.mu.Lock()
		if c.stopped {
			c.mu.Unlock()
			return
		}
		c.wg.Add(1)
		c.mu.Unlock()
		go func() {
			defer func() { <-sem }()
			defer c.wg.Done()
			_ = c.out.write(c.run(ctx, cmd))
		}()
	}
}

// run carries out one command with its own deadline (timeout_ms, default
// 30 s; a signal ends it too) and reports the outcome. A command that hits
// a bug (a panic) is answered with an InternalError reply and logged; the
// node keeps serving.
func (c *Server) run(ctx context.Context, cmd Command) (r Reply) {
	start := time.Now()
	r = Reply{ID: cmd.ID, Op: cmd.Op}
	defer func() {
		if p := recover(); p != nil {
			c.log.Error().Int64("id", cmd.ID).Str("op", cmd.Op).Str("panic", fmt.Sprint(p)).Msg("a command failed on a bug (please report it); the node keeps serving")
			c.log.Debug().Str("stack", string(debug.Stack())).Msg("where the command failed")
			r = Reply{ID: cmd.ID, Op: cmd.Op, Error: fmt.Sprintf("internal error: %v", p), ErrorType: "InternalError"}
		}
	}()
	t := 30 * time.Second
	if cmd.TimeoutMS > 0 {
		t = time.Duration(cmd.TimeoutMS) * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(ctx, t)
	defer cancel()
	err := c.do(ctx, cmd, &r)
	r.ElapsedMS = float64(time.Since(start).Microseconds()) / 1000
	if err != nil {
		r.Error, r.ErrorType = err.Error(), ErrorType(err)
		return r
	}
	r.OK = true
	return r
}

func (c *Server) do(ctx context.Context, cmd Command, r *Reply) error {
	sys := c.n.System()
	switch cmd.Op {
	case "register":
		sum, err := registerPattern(ctx, sys, cmd)
		if err != nil {
			return err
		}
		r.SHA256, r.Bytes = sum, cmd.Bytes
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
			cluster.RemoteSource{Node: cmd.From, Handle: system.Handle{Name: remote}, Location: cmd.Location})
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
		r.SHA256, r.Bytes = Digest(b), int64(len(b))
	case "read":
		h, err := sys.Lookup(ctx, cmd.Name)
		if err != nil {
			return err
		}
		b, err := sys.Read(ctx, h, cmd.At)
		if err != nil {
			return err
		}
		r.SHA256, r.Bytes = Digest(b), int64(len(b))
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
			r.Materializations = append(r.Materializations, Materialization{Location: m.Location, State: m.State.String(), Bytes: m.ChargedBytes, UseCount: m.UseCount})
		}
	default:
		return &system.InvalidInputError{Message: fmt.Sprintf("unknown op %q (register, copy, read, discard, whereis, members, summaries, refresh, place, release, inspect)", cmd.Op)}
	}
	return nil
}

// place runs a place command: this node places the request with
// Node.Place and reports the evidence, also when no node admitted it.
func (c *Server) place(ctx context.Context, cmd Command, r *Reply) error {
	if cmd.Hold {
		c.mu.Lock()
		_, dup := c.held[cmd.Name]
		c.mu.Unlock()
		if dup {
			return &system.InvalidInputError{Message: fmt.Sprintf("place: placement %q is held already (release it first)", cmd.Name)}
		}
	}
	p, err := c.n.Place(ctx, cluster.PlacementRequest{Name: cmd.Name, Hold: cmd.Hold, MaxAttempts: cmd.MaxAttempts,
		Requirements: []cluster.PlacementRequirement{{Value: cmd.Value, Tiers: cmd.Tiers}}})
	if err != nil {
		var pe *cluster.PlacementError
		if errors.As(err, &pe) {
			r.Placement = &Placement{Request: pe.Request, Candidates: pe.Candidates, Attempts: attempts(pe.Attempts), NotTried: pe.NotTried, Directory: pe.Directory, Stage: pe.Stage}
		}
		return err
	}
	r.Placement = &Placement{Request: p.Request, Node: p.Node, Why: p.Why, Candidates: p.Candidates,
		Attempts: attempts(p.Attempts), Decision: &p.Decision, Directory: p.Directory}
	if cmd.Hold {
		c.mu.Lock()
		if c.held == nil {
			c.held = map[string]*cluster.Placement{}
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

func attempts(as []cluster.PlacementAttempt) []Attempt {
	out := make([]Attempt, len(as))
	for i, a := range as {
		out[i] = Attempt{Node: a.Node}
		if a.Err != nil {
			out[i].Error, out[i].ErrorType = a.Err.Error(), ErrorType(a.Err)
		}
	}
	return out
}

var registerSeq atomic.Uint64

// register runs a register command. Nothing is made before the runtime
// admitted it: with At, the bytes are reserved at At first (a refusal is
// the runtime's *BudgetError, and nothing was allocated), then the
// pattern is made, the reservation dropped and the value registered in
// its place; with Source, the loader makes the pattern into the runtime's
// own buffer when the value is placed, and the digest is computed piece
// by piece. A location without a budget takes at most
// maxUnbudgetedPattern bytes. It returns the pattern's SHA-256.
func registerPattern(ctx context.Context, sys *system.System, cmd Command) (string, error) {
	if cmd.Bytes <= 0 {
		return "", &system.InvalidInputError{Message: fmt.Sprintf("register %q: bytes must be > 0, got %d", cmd.Name, cmd.Bytes)}
	}
	if cmd.At != "" {
		res := fmt.Sprintf("demo-node register #%d", registerSeq.Add(1))
		if err := sys.Reserve(ctx, cmd.At, res, cmd.Bytes); err != nil {
			return "", err
		}
		reserved := true
		defer func() {
			if reserved {
				_ = sys.Unreserve(context.WithoutCancel(ctx), res)
			}
		}()
		if err := patternBound(ctx, sys, cmd.Name, cmd.At, cmd.Bytes); err != nil {
			return "", err
		}
		data := Pattern(cmd.Seed, cmd.Bytes)
		if err := sys.Unreserve(context.WithoutCancel(ctx), res); err != nil {
			return "", err
		}
		reserved = false
		if _, err := sys.Register(ctx, system.Value{Name: cmd.Name, Bytes: cmd.Bytes, At: cmd.At, Data: data}); err != nil {
			return "", err
		}
		return Digest(data), nil
	}
	if err := patternBound(ctx, sys, cmd.Name, cmd.Source, cmd.Bytes); err != nil {
		return "", err
	}
	seed := cmd.Seed
	// Resident nowhere: the loader makes the same bytes when the value is
	// placed.
	if _, err := sys.Register(ctx, system.Value{Name: cmd.Name, Bytes: cmd.Bytes, Source: cmd.Source, Loader: func(_ context.Context, dst []byte) error {
		NewPatternStream(seed).Fill(dst)
		return nil
	}}); err != nil {
		return "", err
	}
	return patternDigest(ctx, seed, cmd.Bytes)
}

// patternBound refuses bytes that loc's budget could never hold, or, at a
// location without a budget, more than maxUnbudgetedPattern. A location
// the snapshot does not list is left to the runtime to refuse.
func patternBound(ctx context.Context, sys *system.System, name, loc string, n int64) error {
	snap, err := sys.Snapshot(ctx)
	if err != nil {
		return err
	}
	l, ok := snap.Location(loc)
	if !ok {
		if base, _, cut := strings.Cut(loc, "@"); cut {
			l, ok = snap.Location(base)
		}
	}
	switch {
	case !ok:
		return nil
	case l.HasBudget && n > l.BudgetBytes:
		return &system.InvalidInputError{Message: fmt.Sprintf("register %q: %d bytes can never fit %s (budget %d bytes)", name, n, loc, l.BudgetBytes)}
	case !l.HasBudget && n > maxUnbudgetedPattern:
		return &system.InvalidInputError{Message: fmt.Sprintf("register %q: %d bytes at %s, which has no budget: a node makes at most %d bytes for one value there (give the location a budget)", name, n, loc, int64(maxUnbudgetedPattern))}
	}
	return nil
}

// patternDigest is the SHA-256 of Pattern(seed, n), computed in 1 MiB
// pieces; it stops when ctx ends.
func patternDigest(ctx context.Context, seed, n int64) (string, error) {
	h := sha256.New()
	ps := NewPatternStream(seed)
	buf := make([]byte, min(n, 1<<20))
	for left := n; left > 0; {
		if err := ctx.Err(); err != nil {
			return "", err
		}
		b := buf[:min(left, int64(len(buf)))]
		ps.Fill(b)
		h.Write(b)
		left -= int64(len(b))
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Digest is the hex SHA-256 of b, as a [Reply] carries it.
func Digest(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
