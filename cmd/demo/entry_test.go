package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/internal/offload"
	"github.com/residency-go/residency/internal/testsys"
)

// fullWriter is a standard output that cannot be written (> /dev/full).
type fullWriter struct{}

func (fullWriter) Write([]byte) (int, error) { return 0, errors.New("no space left on device") }

// TestOutputThatCannotBeWritten: a command whose standard output cannot
// be written exits 1 and says so, never 0.
func TestOutputThatCannotBeWritten(t *testing.T) {
	script := "testdata/diagnose/budget_reservation.jsonl"
	for _, args := range [][]string{
		nil,
		{"scenario"},
		{"help"},
		{"offload", "--trace", repoTrace, "--limit", "20", "--speed", "5000"},
		{"offload", "--trace", repoTrace, "--limit", "20", "--speed", "5000", "--json"},
		{"diagnose", script},
		{"diagnose", "--json", script},
		{"offload", "--help"},
		{"replay", "--help"},
		{"replay", "-h", "x.jsonl"},
		{"node", "--help"},
		{"node", "-help"},
		{"serve", "--help"},
		{"diagnose", "--help"},
		{"cluster-demo", "--help"},
		{"scenario", "--help"},
	} {
		var errb bytes.Buffer
		code := run(context.Background(), args, strings.NewReader(""), fullWriter{}, &errb)
		assert.Equal(t, 1, code, "%v: %s", args, errb.String())
		assert.Regexp(t, `writing (standard )?output: no space left on device`, errb.String(), "%v", args)
	}
	// A command that failed keeps its own status.
	var errb bytes.Buffer
	code := run(context.Background(), []string{"diagnose", "--line", "0", script}, strings.NewReader(""), fullWriter{}, &errb)
	assert.Equal(t, 2, code, errb.String())
}

// TestClusterDemoOutputThatCannotBeWritten: cluster-demo too.
func TestClusterDemoOutputThatCannotBeWritten(t *testing.T) {
	exe := demoBinary(t)
	var errb lockedBuffer
	code := run(context.Background(), []string{"cluster-demo", "--provider", "automanaged", "--exe", exe}, strings.NewReader(""), fullWriter{}, &errb)
	assert.Equal(t, 1, code, errb.String())
	assert.Contains(t, errb.String(), "demo cluster-demo: writing standard output: no space left on device")
}

// TestHelpExitsZero: --help (and -h, -help) of every command prints its
// usage on standard output and exits 0, not 2.
func TestHelpExitsZero(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--help"}, "Usage:"},
		{[]string{"scenario", "--help"}, "usage: demo scenario"},
		{[]string{"replay", "--help"}, "usage: demo replay"},
		{[]string{"replay", "x.jsonl", "-h"}, "usage: demo replay"},
		{[]string{"diagnose", "--help"}, "usage: demo diagnose"},
		{[]string{"diagnose", "x.jsonl", "-help"}, "usage: demo diagnose"},
		{[]string{"serve", "--help"}, "usage: demo serve"},
		{[]string{"offload", "-h"}, "usage: demo offload"},
		{[]string{"node", "--help"}, "usage: demo node"},
		{[]string{"cluster-demo", "--help"}, "usage: demo cluster-demo"},
	} {
		code, out, errs := runDemo(t, c.args...)
		assert.Equal(t, 0, code, "%v: %s", c.args, errs)
		assert.Contains(t, out, c.want, "%v", c.args)
		assert.Empty(t, errs, "%v", c.args)
	}
	// A bad flag is still exit status 2, its error and the usage on stderr.
	for _, cmd := range []string{"serve", "offload", "node", "cluster-demo", "diagnose", "replay"} {
		code, out, errs := runDemo(t, cmd, "--no-such-flag")
		assert.Equal(t, 2, code, cmd)
		assert.Empty(t, out, cmd)
		assert.Contains(t, errs, "flag provided but not defined: -no-such-flag", cmd)
		assert.Contains(t, errs, "usage: demo "+cmd, cmd)
	}
}

// TestOffloadHostileFlags: --speed NaN, ±Inf or -1 and --limit -1 are
// usage errors (exit status 2), never a run that reports NaN or reads
// -1 as "all".
func TestOffloadHostileFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--speed", "NaN"}, {"--speed", "Inf"}, {"--speed", "-Inf"}, {"--speed", "-1"}, {"--limit", "-1"},
	} {
		code, out, errs := runDemo(t, append([]string{"offload", "--trace", repoTrace}, args...)...)
		assert.Equal(t, 2, code, "%v", args)
		assert.Empty(t, out)
		assert.Contains(t, errs, "demo offload: "+args[0], "%v", args)
	}
}

// TestOffloadRefusesOversizedRequest: a request with more KV than one
// request may hold (10^9 tokens) is refused and counted, as a server
// would, without allocating its 64 GB; the rest of the trace runs.
func TestOffloadRefusesOversizedRequest(t *testing.T) {
	trace := writeFile(t, t.TempDir(), "trace.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"+
		"2023-11-16 18:15:46.00,300,20\n2023-11-16 18:15:46.50,1000000000,5\n2023-11-16 18:15:47.00,10,2000000000\n2023-11-16 18:15:48.00,100,10\n")
	var rep offload.Report
	var errb bytes.Buffer
	var out bytes.Buffer
	n := testsys.Allocated(func() {
		code := run(context.Background(), []string{"offload", "--trace", trace, "--speed", "1000", "--json"}, strings.NewReader(""), &out, &errb)
		require.Equal(t, 0, code, errb.String())
	})
	require.NoError(t, json.Unmarshal(out.Bytes(), &rep), out.String())
	assert.Equal(t, 4, rep.Requests)
	assert.Equal(t, 2, rep.RequestsRefused)
	assert.Equal(t, int64(16<<30)/8192, rep.MaxRequestBytes, "the clone budget (16 GiB), scaled 1:8192")
	assert.Positive(t, rep.RefusedBytes)
	assert.Equal(t, int64(300+20+100+10), rep.Tokens, "the served requests' tokens")
	assert.Equal(t, int64(2), rep.TasksWritten)
	assert.Zero(t, rep.TasksFailed)
	assert.Less(t, n, uint64(1<<30), "no refused request's bytes were made")

	out.Reset()
	code := run(context.Background(), []string{"offload", "--trace", trace, "--speed", "1000"}, strings.NewReader(""), &out, &errb)
	require.Equal(t, 0, code, errb.String())
	assert.Contains(t, out.String(), "refused 2 requests with more KV than one request may hold (the clone budget, 2 MiB (2097152), standing for 16 GiB), as a server would")
}

// TestDiagnoseLineZero: a line number is ≥ 1; --line 0 is a usage
// error, not "the first failure".
func TestDiagnoseLineZero(t *testing.T) {
	script := "testdata/diagnose/budget_reservation.jsonl"
	for _, line := range []string{"0", "-3"} {
		code, out, errs := runDemo(t, "diagnose", "--line", line, script)
		assert.Equal(t, 2, code, line)
		assert.Empty(t, out)
		assert.Contains(t, errs, "demo diagnose: --line "+line+": a line number is ≥ 1")
	}
	code, _, errs := runDemo(t, "diagnose", "--line", "0", "--error", "E.json", "--snapshot", "S.json")
	assert.Equal(t, 2, code)
	assert.Contains(t, errs, "not both", "--line is for a script")
}

// TestServeExitStatus stops a real serve process with SIGINT and with
// SIGTERM: both say "stopped" and exit 0 when every expectation held, 1
// when one failed (SIGTERM never kills it with status 143 and no
// message).
func TestServeExitStatus(t *testing.T) {
	bin := demoBinary(t)
	good := writeScript(t, okStart+`{"op":"reserve","location":"cuda:0","name":"r","bytes":"512KiB","expect":"ok"}`+"\n")
	bad := writeScript(t, okStart+`{"op":"reserve","location":"cuda:0","name":"r","bytes":"2MiB","expect":"ok"}`+"\n")
	for _, c := range []struct {
		name   string
		script string
		sig    syscall.Signal
		code   int
	}{
		{"SIGINT, expectations held", good, syscall.SIGINT, 0},
		{"SIGTERM, expectations held", good, syscall.SIGTERM, 0},
		{"SIGINT, an expectation failed", bad, syscall.SIGINT, 1},
		{"SIGTERM, an expectation failed", bad, syscall.SIGTERM, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command(bin, "serve", "--addr", "127.0.0.1:0", "--delay", "0s", "--script", c.script)
			stdout, err := cmd.StdoutPipe()
			require.NoError(t, err)
			var stderr lockedBuffer
			cmd.Stderr = &stderr
			require.NoError(t, cmd.Start())
			defer func() { _ = cmd.Process.Kill() }()
			sc := bufio.NewScanner(stdout)
			require.True(t, sc.Scan(), "no line from serve: %s", stderr.String())
			line := sc.Text()
			i := strings.Index(line, "http://")
			require.Positive(t, i, line)
			url := strings.Fields(line[i:])[0]
			for finished := false; !finished; {
				resp, err := http.Get(url + "activity")
				require.NoError(t, err)
				var a activityView
				require.NoError(t, json.NewDecoder(resp.Body).Decode(&a))
				resp.Body.Close()
				finished = a.Finished
				if !finished {
					time.Sleep(10 * time.Millisecond) // polls the state, bounded by the test's timeout
				}
			}
			go func() { _, _ = io.Copy(io.Discard, stdout) }()
			require.NoError(t, cmd.Process.Signal(c.sig))
			assert.Equal(t, c.code, exitCode(t, cmd, 30*time.Second), stderr.String())
			assert.Contains(t, stderr.String(), "demo serve: stopped")
			if c.code == 1 {
				assert.Contains(t, stderr.String(), "1 failed expectation(s)")
			}
		})
	}
}
