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
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run is the whole command; it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		return scenarioMain(ctx, stdout, stderr)
	}
	switch args[0] {
	case "replay":
		return replayMain(ctx, args[1:], stdout, stderr)
	case "scenario":
		if len(args) > 1 {
			fmt.Fprintln(stderr, "demo scenario takes no arguments")
			return 2
		}
		return scenarioMain(ctx, stdout, stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "demo: unknown command %q\n\n%s", args[0], usage)
	return 2
}

const usage = `demo — the residency runtime, shown and scripted

Usage:
  demo                        run the embedded scenario (an inference server on
                              simulated GPUs; this is what "make demo" runs)
  demo scenario               the same
  demo replay [--json] FILE   run a JSON-lines operation script against a fresh
                              runtime and print one result per op (a table, or
                              one JSON object per line with --json); FILE may
                              be - for standard input
  demo help                   this text

Exit status of replay: 0 when every op ran and every "expect" held, 1 when an
expectation failed, 2 when the script is malformed (the message names the
line). See "go doc ./cmd/demo" for the script format, and
cmd/demo/testdata/capacity-whatif.jsonl for a sample to adapt.
`
