package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"github.com/residency-go/residency/system/replay"
	"io"
	"os"

	"github.com/residency-go/residency/internal/jsonerr"
	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/diagnose"
)

// diagnoseMain implements
//
//	demo diagnose [--line N] [--json] FILE
//	demo diagnose [--json] --error E.json --snapshot S.json [--trace T.json] [--decision D.json] [--explanation X.json]
//
// The first runs a replay script up to its first failed op (or up to line
// N), captures the evidence there and prints its diagnosis; the second
// diagnoses evidence saved earlier. Exit status: 0 when a diagnosis was
// printed, 1 when the script ran without the failure to diagnose (no op
// failed, or the op at line N succeeded) or the diagnosis could not be
// written, 2 for bad arguments (--line < 1), a malformed script or
// unreadable evidence, 130 when interrupted.
func diagnoseMain(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("diagnose", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print the diagnosis as one JSON object instead of text")
	line := fs.Int("line", 0, "diagnose the op at this line of FILE, ≥ 1 (default: the first op that failed)")
	var files evidenceFiles
	fs.StringVar(&files.err, "error", "", "evidence: the error, as the replay output's error object or a whole result line")
	fs.StringVar(&files.snapshot, "snapshot", "", "evidence: the snapshot at the failure (replay output's, or a system.Snapshot as encoding/json writes it)")
	fs.StringVar(&files.trace, "trace", "", "evidence: the trace at the failure (replay output's, or a []system.Transition as encoding/json writes it); optional")
	fs.StringVar(&files.decision, "decision", "", "evidence: the decision whose scope failed (replay output's decision object or a decide result line); optional")
	fs.StringVar(&files.explanation, "explanation", "", "evidence: the explanation of the failed plan (replay output's explanation object or an explain result line); optional")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), diagnoseUsage)
		fs.PrintDefaults()
	}
	positional, code, ok := parseFlagsInterleaved(fs, args, stdout, stderr)
	if !ok {
		return code
	}
	lineSet := false
	fs.Visit(func(f *flag.Flag) { lineSet = lineSet || f.Name == "line" })
	if files.any() {
		if len(positional) > 0 || lineSet {
			fmt.Fprintln(stderr, "demo diagnose: give either a script FILE or evidence files (--error, --snapshot, …), not both")
			fs.Usage()
			return 2
		}
		return diagnoseEvidenceFiles(files, *asJSON, stdout, stderr)
	}
	if len(positional) != 1 {
		if len(positional) > 1 {
			fmt.Fprintf(stderr, "demo diagnose: one script at a time (got %d)\n", len(positional))
		}
		fs.Usage()
		return 2
	}
	if lineSet && *line < 1 {
		fmt.Fprintf(stderr, "demo diagnose: --line %d: a line number is ≥ 1 (leave --line out to diagnose the first op that failed)\n", *line)
		return 2
	}
	return diagnoseScript(ctx, positional[0], *line, *asJSON, stdin, stdout, stderr)
}

const diagnoseUsage = `usage: demo diagnose [--line N] [--json] FILE
       demo diagnose [--json] --error E.json --snapshot S.json [--trace T.json]
                     [--decision D.json] [--explanation X.json]

The first form replays the script FILE (- for standard input) up to its
first failed op, or up to line N, captures the snapshot and trace right
there and prints the diagnosis. The second diagnoses evidence saved earlier.
`

// diagnoser is the state of `demo diagnose FILE`: the op it stops at and
// the evidence captured there.
type diagnoser struct {
	target int // the line to diagnose; 0: the first failed op
	runner *replay.Runner
	ev     *diagnose.Evidence
	cerr   error      // Capture's error
	at     *replay.Op // the op it stopped at
	atRes  *replay.Result
}

func diagnoseScript(ctx context.Context, path string, target int, asJSON bool, stdin io.Reader, stdout, stderr io.Writer) int {
	d := &diagnoser{target: target}
	h := &replayHooks{cmd: "diagnose", quiet: true}
	h.setup = func(r *replay.Runner) {
		d.runner = r
		r.SetHooks(replay.Hooks{
			ExplainFirst: func(o replay.Op) bool { return d.target == 0 || o.Line == d.target },
			OnFail:       d.capture,
		})
	}
	h.after = func(o replay.Op, res *replay.Result) bool {
		if d.target == 0 && d.ev == nil && d.cerr == nil {
			return false
		}
		if d.target != 0 && o.Line < d.target {
			return false
		}
		oo, rr := o, *res
		d.at, d.atRes = &oo, &rr
		return true
	}
	var info replay.Info
	code := runScript(ctx, path, stdin, stderr, h, func(i replay.Info) resultWriter {
		info = i
		if !asJSON {
			h.progress = newProgress(stderr, i.Ops, "diagnose "+path)
		}
		return discardWriter{}
	})
	if code != 0 {
		return code
	}
	switch {
	case d.cerr != nil:
		fmt.Fprintf(stderr, "demo diagnose: %s: line %d: capturing the evidence: %s\n", escapeText(path), d.at.Line, escapeText(d.cerr.Error()))
		if ctx.Err() != nil {
			return exitInterrupted
		}
		return 1
	case d.at == nil && d.target == 0:
		fmt.Fprintf(stderr, "demo diagnose: %s: no op failed (%d ops ran): nothing to diagnose\n", escapeText(path), info.Ops)
		return 1
	case d.at == nil || d.at.Line != d.target && d.target != 0:
		fmt.Fprintf(stderr, "demo diagnose: %s: line %d is not an op of the script (its ops are on lines up to %d; blank and # lines are not ops)\n", escapeText(path), d.target, info.LastLine)
		return 2
	case d.ev == nil:
		fmt.Fprintf(stderr, "demo diagnose: %s: line %d (%s) succeeded: nothing to diagnose\n", escapeText(path), d.at.Line, d.at.Name)
		return 1
	}
	diag := diagnose.DiagnoseEvidence(*d.ev)
	line, name := d.at.Line, d.at.Name
	return printDiagnosis(diag, &line, name, asJSON, stdout, stderr)
}

// capture is the runner's onFail: it takes the evidence of the op to
// diagnose right after the op returned, before anything else runs.
func (d *diagnoser) capture(ctx context.Context, o replay.Op, err error) {
	if d.target != 0 && o.Line != d.target || d.target == 0 && (d.ev != nil || d.cerr != nil) {
		return
	}
	r := d.runner
	ev, cerr := diagnose.Capture(ctx, r.System(), err, r.Operation(o))
	if cerr != nil {
		d.cerr = cerr
		return
	}
	ev = r.Evidence(o, ev) // the op's decision or plan, in the script's words
	d.ev = &ev
}

// discardWriter is the result writer of diagnose: the ops before the
// failure print nothing.
type discardWriter struct{}

func (discardWriter) Write(*replay.Result) error { return nil }
func (discardWriter) Flush() error               { return nil }

// diagnoseOutputJSON is the output of `demo diagnose --json`: which line
// of a script the diagnosis explains (null for evidence files), and the
// diagnosis in its JSON form (package system/diagnose).
type diagnoseOutputJSON struct {
	Line      *int               `json:"line"`
	Op        *string            `json:"op"`
	Diagnosis diagnose.Diagnosis `json:"diagnosis"`
}

// printDiagnosis prints d as text or JSON; line and op say which line of
// a script it explains (nil and "" for evidence files).
func printDiagnosis(d diagnose.Diagnosis, line *int, opName string, asJSON bool, stdout, stderr io.Writer) int {
	var b bytes.Buffer
	if asJSON {
		out, err := replay.Marshal(diagnoseOutputJSON{Line: line, Op: nullable(opName), Diagnosis: d})
		if err != nil {
			fmt.Fprintf(stderr, "demo diagnose: %v\n", err)
			return 2
		}
		b.Write(out)
		b.WriteByte('\n')
	} else {
		if line != nil {
			fmt.Fprintf(&b, "line %d (%s), diagnosed at the failure:\n\n", *line, opName)
		}
		b.WriteString(escapeDiagnosis(d.String()))
	}
	if _, err := stdout.Write(b.Bytes()); err != nil {
		fmt.Fprintf(stderr, "demo diagnose: writing output: %v\n", err)
		return 1
	}
	return 0
}

// escapeDiagnosis escapes the control characters a script's names may
// carry, line by line (the text keeps its newlines).
func escapeDiagnosis(s string) string {
	var b bytes.Buffer
	for _, l := range bytes.SplitAfter([]byte(s), []byte("\n")) {
		nl := bytes.HasSuffix(l, []byte("\n"))
		b.WriteString(escapeText(string(bytes.TrimSuffix(l, []byte("\n")))))
		if nl {
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// ---- evidence files -------------------------------------------------------

type evidenceFiles struct {
	err, snapshot, trace, decision, explanation string
}

func (f evidenceFiles) any() bool {
	return f.err != "" || f.snapshot != "" || f.trace != "" || f.decision != "" || f.explanation != ""
}

// maxEvidenceBytes bounds one evidence file.
const maxEvidenceBytes = 256 << 20

// diagnoseEvidenceFiles diagnoses saved evidence. Each file is normalized
// to the replay output's form and the lot is read by diagnose.DecodeEvidence,
// so these files and `demo replay --json` output read the same.
func diagnoseEvidenceFiles(f evidenceFiles, asJSON bool, stdout, stderr io.Writer) int {
	if f.err == "" || f.snapshot == "" {
		fmt.Fprintln(stderr, "demo diagnose: evidence files need --error and --snapshot (--trace, --decision and --explanation are optional)")
		return 2
	}
	fail := func(path string, err error) int {
		fmt.Fprintf(stderr, "demo diagnose: %s: %s\n", escapeText(path), escapeText(err.Error()))
		return 2
	}
	var lines [][]byte
	var paths []string // the file of each line
	add := func(op string, ok bool, key string, v json.RawMessage) {
		b, _ := replay.Marshal(replay.Object{{Key: "line", Value: len(lines) + 1}, {Key: "op", Value: op}, {Key: "ok", Value: ok}, {Key: key, Value: v}})
		lines = append(lines, b)
		paths = append(paths, map[string]string{"decision": f.decision, "explanation": f.explanation, "error": f.err, "snapshot": f.snapshot, "trace": f.trace}[key])
	}
	if f.decision != "" {
		v, _, err := readEvidence(f.decision, "decision", "expected_state_version")
		if err != nil {
			return fail(f.decision, err)
		}
		add("decide", true, "decision", v)
	}
	if f.explanation != "" {
		v, _, err := readEvidence(f.explanation, "explanation", "feasible")
		if err != nil {
			return fail(f.explanation, err)
		}
		add("explain", true, "explanation", v)
	}
	e, opName, err := readEvidence(f.err, "error", "type")
	if err != nil {
		return fail(f.err, err)
	}
	add(opName, false, "error", e)
	failedLine := len(lines)
	s, _, err := readSnapshot(f.snapshot)
	if err != nil {
		return fail(f.snapshot, err)
	}
	add("snapshot", true, "snapshot", s)
	if f.trace != "" {
		t, err := readTrace(f.trace)
		if err != nil {
			return fail(f.trace, err)
		}
		add("trace", true, "trace", t)
	}
	ev, err := diagnose.DecodeEvidence(bytes.NewReader(bytes.Join(lines, []byte("\n"))), failedLine)
	var lineErr *diagnose.LineError
	switch {
	case errors.As(err, &lineErr) && lineErr.Line >= 1 && lineErr.Line <= len(paths):
		return fail(paths[lineErr.Line-1], lineErr.Err) // the file that line came from
	case errors.Is(err, diagnose.ErrNoSnapshot):
		return fail(f.snapshot, errors.New("a snapshot without locations"))
	case err != nil:
		return fail(f.err, err)
	}
	return printDiagnosis(diagnose.DiagnoseEvidence(ev), nil, opName, asJSON, stdout, stderr)
}

func readEvidenceFile(path string) ([]byte, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	b, err := io.ReadAll(io.LimitReader(fh, maxEvidenceBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxEvidenceBytes {
		return nil, fmt.Errorf("larger than %d bytes", maxEvidenceBytes)
	}
	return bytes.TrimSpace(b), nil
}

// readEvidence reads an object of the replay output: bare (it has the key
// mark) or inside a result line (under key; the line's op is returned).
func readEvidence(path, key, mark string) (json.RawMessage, string, error) {
	b, err := readEvidenceFile(path)
	if err != nil {
		return nil, "", err
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(b, &obj); err != nil {
		return nil, "", fmt.Errorf("want a JSON object (the replay output's %s, or a result line with one): %w", key, jsonerr.Words(err))
	}
	if v, ok := obj[key]; ok && string(v) != "null" {
		var op string
		_ = json.Unmarshal(obj["op"], &op)
		return v, op, nil
	}
	if _, ok := obj[mark]; ok {
		return b, "", nil
	}
	return nil, "", fmt.Errorf("neither the replay output's %s object (no %q) nor a result line with one", key, mark)
}

// readSnapshot reads a snapshot: the replay output's (bare or in a result
// line), or a system.Snapshot as encoding/json writes it, which is put in
// the replay output's form.
func readSnapshot(path string) (json.RawMessage, string, error) {
	b, err := readEvidenceFile(path)
	if err != nil {
		return nil, "", err
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(b, &obj); err == nil {
		if _, ok := obj["StateVersion"]; ok {
			var s system.Snapshot
			if err := json.Unmarshal(b, &s); err != nil {
				return nil, "", fmt.Errorf("a snapshot as package system encodes it (system.Snapshot): %w", jsonerr.Words(err))
			}
			out, err := replay.Marshal(replay.SnapshotOf(s))
			return out, "", err
		}
	}
	return readEvidence(path, "snapshot", "state_version")
}

// readTrace reads a trace: the replay output's array (bare or in a result
// line), or a []system.Transition as encoding/json writes it.
func readTrace(path string) (json.RawMessage, error) {
	b, err := readEvidenceFile(path)
	if err != nil {
		return nil, err
	}
	if len(b) > 0 && b[0] == '{' {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(b, &obj); err != nil {
			return nil, jsonerr.Words(err)
		}
		v, ok := obj["trace"]
		if !ok {
			return nil, errors.New(`want the replay output's trace array, or a result line with "trace"`)
		}
		b = v
	}
	var elems []map[string]json.RawMessage
	if err := json.Unmarshal(b, &elems); err != nil {
		return nil, fmt.Errorf("want a JSON array of transitions: %w", jsonerr.Words(err))
	}
	if len(elems) > 0 {
		if _, ok := elems[0]["Version"]; ok {
			var ts []system.Transition
			if err := json.Unmarshal(b, &ts); err != nil {
				return nil, fmt.Errorf("transitions as package system encodes them (system.Transition): %w", jsonerr.Words(err))
			}
			return replay.Marshal(withFields(ts))
		}
	}
	return b, nil
}

// fieldTransition is a transition in the replay output's form with the
// fields a system.Transition carries next to its detail (which lease,
// hold, event or reservation; which kind of failure), which
// diagnose.DecodeEvidence reads when they are there.
type fieldTransition struct {
	replay.Transition
	ID      uint64 `json:"id,omitempty"`
	Lease   uint64 `json:"lease,omitempty"`
	Name    string `json:"name,omitempty"`
	Failure string `json:"failure,omitempty"`
}

func withFields(ts []system.Transition) []fieldTransition {
	out := make([]fieldTransition, len(ts))
	for i, t := range replay.TransitionsOf(ts) {
		out[i] = fieldTransition{Transition: t, ID: ts[i].ID, Lease: ts[i].Lease, Name: ts[i].Name, Failure: ts[i].Failure.String()}
	}
	return out
}
