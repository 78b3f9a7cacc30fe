package main

import (
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// isTerminal reports whether w is a terminal. Tests replace it to draw a
// bar into a buffer.
var isTerminal = func(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// progressDelay is how long a run goes before its bar appears: short
// scripts finish without one.
var progressDelay = time.Second

// progress is the progress bar of a long replay or diagnose run: ops done
// of the script's ops, drawn on standard error when that is a terminal.
// A nil *progress is no bar; every method is then a no-op, so a run with
// --json, or with standard error redirected, writes no bar bytes.
type progress struct {
	stderr io.Writer // the terminal the bar is drawn on
	start  time.Time
	shown  bool // the run has lasted progressDelay: the bar is drawn
	bar    *progressbar.ProgressBar
}

// newProgress returns the bar of a run of total ops, or nil when stderr
// is not a terminal.
func newProgress(stderr io.Writer, total int, desc string) *progress {
	if total <= 0 || !isTerminal(stderr) {
		return nil
	}
	p := &progress{stderr: stderr, start: time.Now()}
	// The bar counts from the first op (so its rate is right) but
	// writes nothing until it is shown.
	p.bar = progressbar.NewOptions(total,
		progressbar.OptionSetWriter(progressGate{p}),
		progressbar.OptionSetDescription(escapeText(desc)),
		progressbar.OptionShowCount(),
		progressbar.OptionSetItsString("ops"),
		progressbar.OptionShowIts(),
		progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionUseANSICodes(true),
		progressbar.OptionClearOnFinish(),
	)
	return p
}

// progressGate is the bar's writer: standard error once the bar is shown,
// nothing before.
type progressGate struct{ p *progress }

func (g progressGate) Write(b []byte) (int, error) {
	if !g.p.shown {
		return len(b), nil
	}
	return g.p.stderr.Write(b)
}

// step counts one op done. The bar appears once the run has lasted
// progressDelay, and redraws at most ten times a second.
func (p *progress) step() {
	if p == nil {
		return
	}
	if !p.shown && time.Since(p.start) >= progressDelay {
		p.shown = true
	}
	_ = p.bar.Add(1)
}

// clear erases the bar from its line (before other text is written to
// the same terminal); the next step draws it again.
func (p *progress) clear() {
	if p != nil && p.shown {
		_ = p.bar.Clear()
	}
}

// finish erases the bar for good.
func (p *progress) finish() {
	if p != nil {
		p.clear()
		_ = p.bar.Exit()
		p.shown = false
	}
}

// writer returns w, or when w is a terminal and a bar may be drawn, w
// wrapped so that every write first clears the bar: a message or a table
// row never lands in the middle of it.
func (p *progress) writer(w io.Writer) io.Writer {
	if p == nil || (w != p.stderr && !isTerminal(w)) {
		return w
	}
	return &clearingWriter{w: w, p: p}
}

type clearingWriter struct {
	w io.Writer
	p *progress
}

func (c *clearingWriter) Write(b []byte) (int, error) {
	c.p.clear()
	return c.w.Write(b)
}
