// Package faultproxy is a loopback TCP proxy whose behaviour a test
// switches at run time: pass bytes through, drop connections, delay every
// byte, or blackhole them. The fault tests of tests/clusterproc put one in
// front of each cluster node (the node advertises the proxy's address, so
// every other member reaches it through the proxy) to partition a node
// and heal it, or make it slow.
package faultproxy

import (
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Mode is what the proxy does with connections and bytes.
type Mode int

const (
	// Pass forwards bytes both ways as they come.
	Pass Mode = iota
	// Drop closes every open connection and each new one as soon as it is
	// accepted: the peer sees a reset or EOF at once.
	Drop
	// Delay forwards every byte Delay after it was read, in order, both
	// ways.
	Delay
	// Blackhole accepts connections and never forwards a byte (both ways):
	// the peer's writes succeed and nothing ever answers. Leaving
	// Blackhole closes the connections it held, as a long partition ends
	// with their TCP connections reset.
	Blackhole
)

func (m Mode) String() string {
	switch m {
	case Pass:
		return "pass"
	case Drop:
		return "drop"
	case Delay:
		return "delay"
	case Blackhole:
		return "blackhole"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Proxy listens on a loopback port and forwards to a target address.
type Proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	mode  Mode
	delay time.Duration
	links map[*link]struct{}
	done  bool

	wg sync.WaitGroup
}

// link is one accepted connection and its connection to the target (nil
// when accepted in Blackhole mode).
type link struct {
	in, out net.Conn
	once    sync.Once
	closed  chan struct{}
}

func newLink(in, out net.Conn) *link { return &link{in: in, out: out, closed: make(chan struct{})} }

func (l *link) close() {
	l.once.Do(func() {
		close(l.closed)
		_ = l.in.Close()
		if l.out != nil {
			_ = l.out.Close()
		}
	})
}

// New starts a proxy on 127.0.0.1 (a free port) that forwards to target,
// in Pass mode.
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, links: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Mode returns the current mode.
func (p *Proxy) Mode() Mode {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode
}

// Set switches the mode; delay is used by Delay only. Drop closes every
// open connection; leaving Blackhole closes the connections it held.
func (p *Proxy) Set(mode Mode, delay time.Duration) {
	p.mu.Lock()
	prev := p.mode
	p.mode, p.delay = mode, delay
	var closing []*link
	if mode == Drop || (prev == Blackhole && mode != Blackhole) {
		for l := range p.links {
			closing = append(closing, l)
			delete(p.links, l)
		}
	}
	p.mu.Unlock()
	for _, l := range closing {
		l.close()
	}
}

// Close stops listening, closes every connection and waits for the
// proxy's goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.done = true
	links := p.links
	p.links = map[*link]struct{}{}
	p.mu.Unlock()
	err := p.ln.Close()
	for l := range links {
		l.close()
	}
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		mode := p.mode
		p.mu.Unlock()
		switch mode {
		case Drop:
			_ = c.Close()
			continue
		case Blackhole:
			p.start(newLink(c, nil), nil)
			continue
		}
		out, err := net.DialTimeout("tcp", p.target, 2*time.Second)
		if err != nil {
			_ = c.Close() // the target is down: the peer sees it as refused
			continue
		}
		p.start(newLink(c, out), out)
	}
}

// start registers l and starts its pumps (a drain only when out is nil).
func (p *Proxy) start(l *link, out net.Conn) {
	p.mu.Lock()
	if p.done {
		p.mu.Unlock()
		l.close()
		return
	}
	p.links[l] = struct{}{}
	p.mu.Unlock()
	if out == nil {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			_, _ = io.Copy(io.Discard, l.in)
			p.forget(l)
		}()
		return
	}
	p.wg.Add(2)
	go p.pump(l, l.in, out)
	go p.pump(l, out, l.in)
}

func (p *Proxy) forget(l *link) {
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
	l.close()
}

// chunk is bytes read at a time, to be written at due.
type chunk struct {
	b   []byte
	due time.Time
}

// pump copies src to dst: a reader stamps each chunk with the mode at the
// time it was read (Pass: now; Delay: now + delay; Blackhole: dropped), a
// writer writes the chunks in order when they are due. Either side failing
// closes the link.
func (p *Proxy) pump(l *link, src, dst net.Conn) {
	defer p.wg.Done()
	q := make(chan chunk, 4096)
	var wwg sync.WaitGroup
	wwg.Add(1)
	go func() {
		defer wwg.Done()
		for c := range q {
			if d := time.Until(c.due); d > 0 {
				// the fault itself: the bytes are held for the delay
				t := time.NewTimer(d)
				select {
				case <-t.C:
				case <-l.closed:
				}
				t.Stop()
			}
			if _, err := dst.Write(c.b); err != nil {
				l.close()
				for range q { // drain: the reader ends when the link closed
				}
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		k, err := src.Read(buf)
		if k > 0 {
			p.mu.Lock()
			mode, delay := p.mode, p.delay
			p.mu.Unlock()
			switch mode {
			case Pass:
				q <- chunk{b: append([]byte(nil), buf[:k]...)}
			case Delay:
				q <- chunk{b: append([]byte(nil), buf[:k]...), due: time.Now().Add(delay)}
			}
		}
		if err != nil { // EOF or closed: flush what is queued, then close both sides
			close(q)
			wwg.Wait()
			p.forget(l)
			return
		}
	}
}
