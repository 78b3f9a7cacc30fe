package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		// The first Ctrl-C (or SIGTERM) cancels ctx and the command stops
		// on its own, promptly; from then on a second one kills it
		// outright.
		<-ctx.Done()
		stop()
	}()
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run is the whole command; it returns the exit status (130 when ctx
// ended: Ctrl-C or SIGTERM). Every command but replay (which reports its own) writes
// standard output through an outputWriter: output that could not be
// written (a full disk) is exit status 1 with a message, never a silent 0.
// (A pipe closed by its reader ends the process with SIGPIPE, as usual.)
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		out := &outputWriter{w: stdout}
		return out.check("demo", scenarioExit(ctx, scenarioMain(ctx, out, stderr), stderr), stderr)
	}
	out := &outputWriter{w: stdout}
	switch args[0] {
	case "replay":
		if helpAsked(args[1:]) {
			replayMain(ctx, []string{"-h"}, stdin, out, out) // prints the usage
			return out.check("demo replay", 0, stderr)
		}
		return replayMain(ctx, args[1:], stdin, stdout, stderr)
	case "serve":
		return out.check("demo serve", serveMain(ctx, args[1:], stdin, out, stderr), stderr)
	case "diagnose":
		return out.check("demo diagnose", diagnoseMain(ctx, args[1:], stdin, out, stderr), stderr)
	case "offload":
		return out.check("demo offload", offloadMain(ctx, args[1:], out, stderr), stderr)
	case "kv":
		return out.check("demo kv", kvMain(ctx, args[1:], out, stderr), stderr)
	case "node":
		return nodeMain(ctx, args[1:], stdin, stdout, stderr) // its replies report their own write errors
	case "cluster-demo":
		return out.check("demo cluster-demo", clusterDemoMain(ctx, args[1:], out, stderr), stderr)
	case "scenario":
		if len(args) > 1 {
			if helpAsked(args[1:]) {
				fmt.Fprint(out, "usage: demo scenario   (the same as demo with no arguments)\n\nRuns the embedded scenario: an inference server on simulated GPUs.\n")
				return out.check("demo scenario", 0, stderr)
			}
			fmt.Fprintln(stderr, "demo scenario takes no arguments")
			return 2
		}
		return out.check("demo", scenarioExit(ctx, scenarioMain(ctx, out, stderr), stderr), stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(out, usage)
		return out.check("demo", 0, stderr)
	}
	fmt.Fprintf(stderr, "demo: unknown command %q\n\n%s", args[0], usage)
	return 2
}

// outputWriter is a command's standard output. It keeps the first write
// error and drops every write after it; check turns that error into exit
// status 1 and a message.
type outputWriter struct {
	mu  sync.Mutex
	w   io.Writer
	err error
}

func (o *outputWriter) Write(b []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.err != nil {
		return 0, o.err
	}
	n, err := o.w.Write(b)
	if err == nil && n < len(b) {
		err = io.ErrShortWrite
	}
	o.err = err
	return n, err
}

// check returns code, or 1 with a message on stderr when some output was
// not written and code says nothing failed (a command that failed has
// said why, and keeps its status).
func (o *outputWriter) check(cmd string, code int, stderr io.Writer) int {
	o.mu.Lock()
	err := o.err
	o.mu.Unlock()
	if err == nil || code != 0 {
		return code
	}
	fmt.Fprintf(stderr, "%s: writing standard output: %v\n", cmd, err)
	return 1
}

// parseFlags parses a command's flags. ok false: the command stops with
// code, 0 after -h, -help or --help (its usage printed on stdout), 2 after
// a bad flag (the error and the usage on stderr). A FlagSet's Usage prints
// to fs.Output().
func parseFlags(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) (code int, ok bool) {
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.SetOutput(stderr)
	return flagError(fs, err, stdout, stderr)
}

// parseFlagsInterleaved is parseFlags for flags that may come before or
// after the positional arguments, which it returns. A "--" after a
// positional argument ends the flags.
func parseFlagsInterleaved(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) (positional []string, code int, ok bool) {
	for {
		fs.SetOutput(io.Discard)
		err := fs.Parse(args)
		fs.SetOutput(stderr)
		if code, ok := flagError(fs, err, stdout, stderr); !ok {
			return nil, code, false
		}
		if fs.NArg() == 0 {
			return positional, 0, true
		}
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
		if fs.Arg(0) != "-" && len(args) > 0 && args[0] == "--" {
			return append(positional, args[1:]...), 0, true
		}
	}
}

func flagError(fs *flag.FlagSet, err error, stdout, stderr io.Writer) (int, bool) {
	switch {
	case err == nil:
		return 0, true
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(stdout)
		fs.Usage()
		fs.SetOutput(stderr)
		return 0, false
	}
	fmt.Fprintln(stderr, err)
	fs.Usage()
	return 2, false
}

// helpAsked reports whether args (of a command whose flags take no
// values) ask for help: -h, -help or --help before any "--".
func helpAsked(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "-h", "-help", "--help":
			return true
		}
	}
	return false
}

// scenarioExit maps an interrupted scenario to exit status 130.
func scenarioExit(ctx context.Context, code int, stderr io.Writer) int {
	if code != 0 && ctx.Err() != nil {
		fmt.Fprintln(stderr, "demo: interrupted")
		return exitInterrupted
	}
	return code
}

const usage = `demo — the residency runtime, shown and scripted

Usage:
  demo                        run the embedded scenario (an inference server on
                              simulated GPUs; this is what "make demo" runs)
  demo scenario               the same
  demo replay [--json] FILE   run a JSON-lines operation script against a fresh
                              runtime and print one result per op as it
                              finishes (a table, or one JSON object per line
                              with --json); FILE may be - for standard input,
                              and --json may also follow FILE
  demo diagnose [--line N] [--json] FILE
                              run the script up to its first failed op (or the
                              op at line N), capture the state there and print
                              the diagnosis: why it failed, with the figures,
                              and what to do first
  demo diagnose [--json] --error E.json --snapshot S.json [--trace T.json]
                              diagnose evidence saved earlier
  demo serve [--addr A] [--script FILE] [--delay D]
                              run the embedded scenario (or a replay script)
                              slowly against a runtime and serve a live page,
                              /metrics, /snapshot, /trace and /healthz on
                              127.0.0.1:8080 until Ctrl-C or SIGTERM (exit
                              status 0, or 1 when an expectation failed)
  demo offload [--trace FILE] [--bytes-per-token N] [--speed X] [--limit N] [--json]
                              replay a real LLM serving trace (default
                              data/AzureLLMInferenceTrace_conv.csv, built in;
                              progress on standard error) through the
                              write pipeline: each request's KV blocks are
                              offloaded on the soft backend (a simulation);
                              reports offloaded bytes, queue depths, flushes,
                              drops and budget checks
  demo kv [--trace FILE] [--gpu N,N,...] [--spill LOC] [--spill-size N|Kx] [--json] [--plot F.svg]
                              play a KV-cache trace (Mooncake JSON lines;
                              default: the built-in mooncake_synthetic_trace)
                              through the runtime on the soft backend: per GPU
                              capacity, hits per tier, misses and bytes moved,
                              beside LRU and Belady's optimum (demo kv --help)
  demo node --name N [--provider etcd|automanaged] [--location cuda:0=8GiB]...
          [--addr HOST:PORT --tls-cert F --tls-key F --tls-ca F]
                              run one cluster node until SIGINT/SIGTERM: JSON
                              logs on standard error, a ready line and command
                              replies on standard output (docs/cluster.md);
                              an --addr other than loopback needs the TLS flags
  demo cluster-demo [--provider etcd|automanaged]
                              start etcd (when installed) and three nodes
                              locally, run a short scenario across them in
                              numbered steps, and stop everything
  demo help                   this text; COMMAND --help prints a command's
                              usage and flags (exit status 0)

Exit status of replay: 0 when every op ran and every "expect" held, 1 when an
expectation failed, 2 when the script is malformed (the message names the
line), 130 when interrupted (Ctrl-C or SIGTERM, alike for every command).
The script format is described in docs/replay.md and "go doc ./cmd/demo";
cmd/demo/testdata/capacity-whatif.jsonl is a sample to adapt. On a terminal, a long replay or diagnose shows a
progress bar on standard error (never with --json). A bad flag is exit
status 2 for every command; output that cannot be written (a full disk)
is exit status 1 with a message, never a silent 0.
`
