package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"github.com/residency-go/residency/system/replay"
	"io"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/residency-go/residency/system"
)

// opTimeout bounds the closing of a replay's runtime (the replay bounds
// each op to as much).
const opTimeout = time.Minute

// exitInterrupted is the exit status of a replay stopped by Ctrl-C
// (128 + SIGINT, as shells report it).
const exitInterrupted = 130

// replayMain implements `demo replay [--json] FILE`. Flags may come before
// or after FILE.
func replayMain(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print one JSON object per op instead of a table")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: demo replay [--json] FILE   (FILE may be - for standard input)")
		fs.PrintDefaults()
	}
	files, ok := parseInterleaved(fs, args)
	if !ok {
		return 2
	}
	if len(files) != 1 {
		if len(files) > 1 {
			fmt.Fprintf(stderr, "demo replay: one script at a time (got %d: %s)\n", len(files), strings.Join(quoteAll(files), ", "))
		}
		fs.Usage()
		return 2
	}
	path := files[0]
	h := replayHooks{cmd: "replay"}
	return runScript(ctx, path, stdin, stderr, &h, func(info replay.Info) resultWriter {
		if *asJSON {
			return replay.NewJSONWriter(stdout)
		}
		// A progress bar on a terminal (never with --json); rows written
		// to the same terminal clear it first.
		h.progress = newProgress(stderr, info.Ops, "replay "+path)
		return newTableWriter(h.progress.writer(stdout), info)
	})
}

// parseInterleaved parses flags that may come before or after the
// positional arguments, and returns the positional ones. A "--" after a
// positional argument ends the flags.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, bool) {
	var files []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, false
		}
		if fs.NArg() == 0 {
			return files, true
		}
		files = append(files, fs.Arg(0))
		args = fs.Args()[1:]
		if fs.Arg(0) != "-" && len(args) > 0 && args[0] == "--" {
			// `FILE -- …`: nothing after a "--" is a flag.
			return append(files, args[1:]...), true
		}
	}
}

// runScript opens and checks a script (pass 1), then runs it (pass 2)
// with the result writer that writer returns for it.
func runScript(ctx context.Context, path string, stdin io.Reader, stderr io.Writer, h *replayHooks, writer func(replay.Info) resultWriter) int {
	src, err := openScript(ctx, path, stdin)
	if err != nil {
		if ctx.Err() != nil && isContextError(err) {
			return commandScriptFailure(ctx, stderr, h.cmd, path, err, "while opening the script; nothing ran")
		}
		fmt.Fprintf(stderr, "demo %s: %s\n", h.cmd, escapeText(err.Error()))
		return 2
	}
	defer src.close()

	// Pass 1: the whole script is checked before anything runs.
	info, err := replay.Check(ctx, src.first, src.tee)
	if err != nil {
		return commandScriptFailure(ctx, stderr, h.cmd, path, err, "while reading the script; nothing ran")
	}
	r, err := src.again()
	if err != nil {
		fmt.Fprintf(stderr, "demo %s: %s: reading the script again: %v\n", h.cmd, path, err)
		return 2
	}
	out := writer(info)
	code := playScript(ctx, path, replay.NewReader(ctx, r, nil), info, out, h.progress.writer(stderr), h)
	h.progress.finish()
	return code
}

// replayHooks adapt a replay to its command: replay itself, or diagnose
// (which runs a script up to the op it explains).
type replayHooks struct {
	cmd string // "replay" or "diagnose": the prefix of messages
	// quiet: expectations are not checked (diagnose runs up to a failure
	// whatever the line expected) and Close's note is not printed.
	quiet bool
	// setup is called with the runner before the first op runs.
	setup func(*replay.Runner)
	// after is called with each op's result once it is written; true
	// stops the replay there (the rest of the script does not run) with
	// status 0.
	after func(o replay.Op, res *replay.Result) bool
	// progress is the progress bar (nil: none).
	progress *progress
}

func quoteAll(list []string) []string {
	out := make([]string, len(list))
	for i, s := range list {
		out[i] = fmt.Sprintf("%q", s)
	}
	return out
}

// commandScriptFailure reports an error of reading or checking the
// script of command cmd (its messages start "demo CMD:"): a malformed
// script (2) or an interruption (130).
func commandScriptFailure(ctx context.Context, stderr io.Writer, cmd, path string, err error, when string) int {
	if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		fmt.Fprintf(stderr, "demo %s: %s: interrupted %s\n", cmd, escapeText(path), when)
		return exitInterrupted
	}
	fmt.Fprintf(stderr, "demo %s: %s: %s\n", cmd, escapeText(path), escapeText(err.Error()))
	return 2
}

// scriptSource gives a script twice: once to check it whole (first, with
// tee receiving a copy when the input cannot be read again), then again
// to run it.
type scriptSource struct {
	first io.Reader
	tee   io.Writer
	again func() (io.Reader, error)
	close func()
}

// maxSpoolBytes bounds the copy kept of a script that cannot be read
// twice (standard input, a pipe): beyond it the replay stops with a
// message (exit status 2). A variable for the tests.
var maxSpoolBytes int64 = 1 << 30

// errSpoolFull is the error of a script longer than maxSpoolBytes.
func errSpoolFull(path string) error {
	what := "the script"
	if path == "-" {
		what = "standard input"
	}
	return &replay.ScriptError{Msg: fmt.Sprintf("%s is longer than %s, the most kept of a script that is not a regular file "+
		"(it is copied to a temporary file so that it can be checked before it runs); save the script to a file and pass its path",
		what, formatBytes(maxSpoolBytes))}
}

// openScript opens FILE (or standard input for "-"). A regular file is
// read twice; anything else (a pipe, a FIFO, a terminal) is copied to a
// temporary file, up to maxSpoolBytes, while it is checked, and its reads
// stop when ctx ends, so Ctrl-C works while a script is being typed or
// piped in, and while a FIFO waits for a writer.
func openScript(ctx context.Context, path string, stdin io.Reader) (*scriptSource, error) {
	var in io.Reader
	closeIn := func() {}
	if path == "-" {
		in = stdin
	} else {
		f, err := openInput(ctx, path)
		if err != nil {
			return nil, err
		}
		in, closeIn = f, func() { f.Close() }
	}
	if rs, ok := rewindable(in); ok {
		start, _ := rs.Seek(0, io.SeekCurrent)
		return &scriptSource{
			first: in,
			again: func() (io.Reader, error) {
				_, err := rs.Seek(start, io.SeekStart)
				return in, err
			},
			close: closeIn,
		}, nil
	}
	spool, err := os.CreateTemp("", "demo-replay-*.jsonl")
	if err != nil {
		closeIn()
		return nil, fmt.Errorf("a temporary copy of the script: %w", err)
	}
	os.Remove(spool.Name()) // unlinked at once: nothing is left behind
	w := bufio.NewWriterSize(spool, 64<<10)
	return &scriptSource{
		first: &ctxReader{ctx: ctx, r: in},
		tee:   &boundedWriter{w: w, left: maxSpoolBytes, full: errSpoolFull(path)},
		again: func() (io.Reader, error) {
			if err := w.Flush(); err != nil {
				return nil, err
			}
			_, err := spool.Seek(0, io.SeekStart)
			return spool, err
		},
		close: func() { spool.Close(); closeIn() },
	}, nil
}

// resultWriter prints results as they come (replay.JSONWriter, the table,
// or nothing for diagnose).
type resultWriter interface {
	Write(*replay.Result) error
	Flush() error
}

// boundedWriter passes at most left bytes to w, then fails with full.
type boundedWriter struct {
	w    io.Writer
	left int64
	full error
}

func (b *boundedWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > b.left {
		return 0, b.full
	}
	b.left -= int64(len(p))
	return b.w.Write(p)
}

// openInput opens path for reading. Opening a FIFO blocks until a writer
// opens it too, so the open runs on a helper goroutine and ctx can end
// the wait (Ctrl-C): the helper is then released by opening the FIFO for
// writing without blocking (which succeeds once the helper waits in its
// open), and what it opened is closed.
func openInput(ctx context.Context, path string) (*os.File, error) {
	st, err := os.Stat(path)
	if err != nil || st.Mode().IsRegular() {
		return os.Open(path)
	}
	type opened struct {
		f   *os.File
		err error
	}
	ch := make(chan opened, 1)
	go func() {
		f, err := os.Open(path)
		ch <- opened{f, err}
	}()
	select {
	case o := <-ch:
		return o.f, o.err
	case <-ctx.Done():
	}
	fifo := st.Mode()&os.ModeNamedPipe != 0
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	giveUp := time.NewTimer(5 * time.Second)
	defer giveUp.Stop()
	var w *os.File
	for {
		if fifo && w == nil {
			w, _ = os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0)
		}
		select {
		case o := <-ch:
			if o.f != nil {
				o.f.Close()
			}
			if w != nil {
				w.Close()
			}
			return nil, ctx.Err()
		case <-tick.C:
		case <-giveUp.C:
			// Not released (not a FIFO, or the helper never reached its
			// open): the helper ends with the process.
			if w != nil {
				w.Close()
			}
			return nil, ctx.Err()
		}
	}
}

// rewindable reports whether r can be read again from where it is now: a
// regular file, or an in-memory reader.
func rewindable(r io.Reader) (io.ReadSeeker, bool) {
	rs, ok := r.(io.ReadSeeker)
	if !ok {
		return nil, false
	}
	if f, isFile := r.(*os.File); isFile {
		st, err := f.Stat()
		if err != nil || !st.Mode().IsRegular() {
			return nil, false
		}
	}
	if _, err := rs.Seek(0, io.SeekCurrent); err != nil {
		return nil, false
	}
	return rs, true
}

// ctxReader reads r on a helper goroutine so that a Read can return as
// soon as ctx ends, even while r blocks (a terminal, a pipe nobody
// writes to).
type ctxReader struct {
	ctx     context.Context
	r       io.Reader
	pending chan readResult
	buf     []byte
}

type readResult struct {
	n   int
	err error
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	if c.pending == nil {
		if cap(c.buf) < len(p) {
			c.buf = make([]byte, len(p))
		}
		buf := c.buf[:len(p)]
		ch := make(chan readResult, 1)
		go func() {
			n, err := c.r.Read(buf)
			ch <- readResult{n, err}
		}()
		c.pending = ch
	}
	select {
	case <-c.ctx.Done():
		return 0, c.ctx.Err()
	case rr := <-c.pending:
		c.pending = nil
		return copy(p, c.buf[:rr.n]), rr.err
	}
}

// playScript runs a checked script against a fresh runtime, writing one
// result per op as it finishes. It returns the exit status: 0 when every
// expectation held, 1 otherwise, 2 when the runtime refused the start replay.Op
// (or the script changed between its check and its run), 130 when ctx
// ended (Ctrl-C). h adapts it to its command (see replayHooks).
func playScript(ctx context.Context, path string, sr *replay.Reader, info replay.Info, out resultWriter, stderr io.Writer, h *replayHooks) int {
	cmd := h.cmd
	start, ok, err := sr.Next()
	if err != nil || !ok {
		if err == nil {
			err = errors.New("the script changed after it was checked: it has no ops now")
		}
		return commandScriptFailure(ctx, stderr, cmd, path, err, "before the runtime started; nothing ran")
	}
	r, err := replay.Start(ctx, start)
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintf(stderr, "demo %s: %s: interrupted before the runtime started; nothing ran\n", cmd, escapeText(path))
			return exitInterrupted
		}
		fmt.Fprintf(stderr, "demo %s: %s: line %d: bad start: %v\n", cmd, escapeText(path), start.Line, err)
		return 2
	}
	closeSys := func() error {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
		defer cancel()
		return r.Close(closeCtx) // the write pipelines, then the runtime; cache leases and pins join the note
	}
	if h.setup != nil {
		h.setup(r)
	}
	failed, done := 0, 0
	stop := func(code int, format string, args ...any) int {
		if err := out.Flush(); err != nil {
			fmt.Fprintf(stderr, "demo %s: writing output: %v\n", cmd, err)
		}
		_ = closeSys()
		fmt.Fprintf(stderr, "demo %s: %s: "+format+"\n", append([]any{cmd, escapeText(path)}, args...)...)
		return code
	}
	o := start
	for {
		var res replay.Result
		if done == 0 {
			res = replay.Result{Line: o.Line, Op: o.Name, OK: true}
		} else {
			res = r.Do(ctx, o)
		}
		if ctx.Err() != nil && res.Err() != nil && isContextError(res.Err()) {
			// The op was cut short by Ctrl-C: it has no result to show.
			return stop(exitInterrupted, "interrupted at line %d (%s): %d of %d ops finished, the rest did not run", o.Line, o.Name, done, info.Ops)
		}
		done++
		h.progress.step()
		if o.Expect != "" && !h.quiet {
			res.Expect = o.Expect
			if !replay.Matches(o.Expect, &res) {
				failed++
				got := "ok"
				if !res.OK {
					got = res.Error.Type + ": " + res.Error.Message
				}
				fmt.Fprintf(stderr, "demo %s: %s: line %d: %s: expected %s, got %s\n", cmd, escapeText(path), o.Line, o.Name, o.Expect, escapeText(got))
			}
		}
		if err := out.Write(&res); err != nil {
			fmt.Fprintf(stderr, "demo %s: writing output: %v\n", cmd, err)
			_ = closeSys()
			return 1
		}
		if h.after != nil && h.after(o, &res) {
			break
		}
		if ctx.Err() != nil && done < info.Ops {
			return stop(exitInterrupted, "interrupted after line %d (%s): %d of %d ops finished, the rest did not run", o.Line, o.Name, done, info.Ops)
		}
		prev := o
		var ok bool
		o, ok, err = sr.Next()
		if err != nil {
			if ctx.Err() != nil {
				return stop(exitInterrupted, "interrupted after line %d (%s): %d of %d ops finished, the rest did not run", prev.Line, prev.Name, done, info.Ops)
			}
			return stop(2, "the script changed after it was checked: %v", err)
		}
		if !ok {
			break
		}
	}
	if err := out.Flush(); err != nil {
		fmt.Fprintf(stderr, "demo %s: writing output: %v\n", cmd, err)
		failed++
	}
	if !closeNote(closeSys(), h, stderr) {
		failed++
	}
	if failed > 0 {
		fmt.Fprintf(stderr, "demo %s: %s: %d failed expectation(s)\n", cmd, escapeText(path), failed)
		return 1
	}
	return 0
}

func isContextError(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// closeNote reports the outcome of closing the runtime at the end of a
// script; false when it failed. Scripts may end with leases or holds
// still taken; Close releases them. That is said (unless h is quiet), but
// it is not a failure.
func closeNote(err error, h *replayHooks, stderr io.Writer) bool {
	var oe *system.OutstandingError
	switch {
	case err == nil, errors.As(err, &oe) && h.quiet:
	case errors.As(err, &oe):
		fmt.Fprintf(stderr, "demo %s: note: %s\n", h.cmd, escapeText(err.Error()))
	default:
		fmt.Fprintf(stderr, "demo %s: closing the runtime: %s\n", h.cmd, escapeText(err.Error()))
		return false
	}
	return true
}
