package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	go func() {
		// The first Ctrl-C cancels ctx and the command stops on its own,
		// promptly; from then on a second one kills it outright.
		<-ctx.Done()
		stop()
	}()
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run is the whole command; it returns the exit status (130 when ctx
// ended: Ctrl-C).
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		return scenarioExit(ctx, scenarioMain(ctx, stdout, stderr), stderr)
	}
	switch args[0] {
	case "replay":
		return replayMain(ctx, args[1:], stdin, stdout, stderr)
	case "serve":
		return serveMain(ctx, args[1:], stdin, stdout, stderr)
	case "diagnose":
		return diagnoseMain(ctx, args[1:], stdin, stdout, stderr)
	case "offload":
		return offloadMain(ctx, args[1:], stdout, stderr)
	case "node":
		return nodeMain(ctx, args[1:], stdin, stdout, stderr)
	case "cluster-demo":
		return clusterDemoMain(ctx, args[1:], stdout, stderr)
	case "scenario":
		if len(args) > 1 {
			fmt.Fprintln(stderr, "demo scenario takes no arguments")
			return 2
		}
		return scenarioExit(ctx, scenarioMain(ctx, stdout, stderr), stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "demo: unknown command %q\n\n%s", args[0], usage)
	return 2
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
                              127.0.0.1:8080 until Ctrl-C (exit status 0)
  demo offload [--trace FILE] [--bytes-per-token N] [--speed X] [--limit N] [--json]
                              replay a real LLM serving trace (default
                              data/AzureLLMInferenceTrace_conv.csv) through the
                              write pipeline: each request's KV blocks are
                              offloaded on the soft backend (a simulation);
                              reports offloaded bytes, queue depths, flushes,
                              drops and budget checks
  demo node --name N [--provider etcd|automanaged] [--location cuda:0=8GiB]...
                              run one cluster node until SIGINT/SIGTERM: JSON
                              logs on standard error, a ready line and command
                              replies on standard output (docs/cluster.md)
  demo cluster-demo [--provider etcd|automanaged]
                              start etcd (when installed) and three nodes
                              locally, run a short scenario across them in
                              numbered steps, and stop everything
  demo help                   this text

Exit status of replay: 0 when every op ran and every "expect" held, 1 when an
expectation failed, 2 when the script is malformed (the message names the
line), 130 when interrupted (Ctrl-C). The script format is described in
docs/replay.md and "go doc ./cmd/demo"; cmd/demo/testdata/capacity-whatif.jsonl
is a sample to adapt. On a terminal, a long replay or diagnose shows a
progress bar on standard error (never with --json).
`
