package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestInterruptWhileReading: Ctrl-C while the script is still being read
// from standard input (a pipe nobody closes) stops the command at once:
// exit status 130, a message on stderr, nothing run.
func TestInterruptWhileReading(t *testing.T) {
	pr, pw := io.Pipe()
	defer pw.Close() // lets the reading goroutine go
	go pw.Write([]byte(okStart))
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	var out, errb bytes.Buffer
	start := time.Now()
	code := run(ctx, []string{"replay", "--json", "-"}, pr, &out, &errb)
	assert.Equal(t, exitInterrupted, code)
	assert.Less(t, time.Since(start), 5*time.Second)
	assert.Contains(t, errb.String(), "interrupted while reading the script; nothing ran")
	assert.Empty(t, out.String())
}

// TestInterruptMidReplay: Ctrl-C between ops stops the replay after the
// op that was running: no further op runs, no "context canceled" results,
// exit status 130 with a message saying where it stopped.
func TestInterruptMidReplay(t *testing.T) {
	script := okStart + strings.Repeat(`{"op":"reserve","location":"cuda:0","name":"r","bytes":1}`+"\n"+`{"op":"unreserve","name":"r"}`+"\n", 500)
	path := writeScript(t, script)
	for _, asJSON := range []bool{true, false} {
		ctx, cancel := context.WithCancel(context.Background())
		w := &cancelAfter{lines: 5, cancel: cancel} // the header and start, then 3 ops (table); 5 results (JSON)
		args := []string{"replay", path}
		if asJSON {
			args = []string{"replay", "--json", path}
		}
		var errb bytes.Buffer
		code := run(ctx, args, strings.NewReader(""), w, &errb)
		cancel()
		assert.Equal(t, exitInterrupted, code, "json=%v", asJSON)
		assert.Equal(t, 5, strings.Count(w.buf.String(), "\n"), "json=%v: ops ran after the interrupt:\n%s", asJSON, w.buf.String())
		assert.NotContains(t, w.buf.String(), "context canceled")
		assert.Contains(t, errb.String(), "interrupted after line")
		assert.Contains(t, errb.String(), "of 1001 ops finished, the rest did not run")
	}
}

// cancelAfter cancels a context once it has been written lines lines.
type cancelAfter struct {
	lines  int
	cancel context.CancelFunc
	buf    bytes.Buffer
}

func (c *cancelAfter) Write(p []byte) (int, error) {
	c.buf.Write(p)
	if strings.Count(c.buf.String(), "\n") >= c.lines {
		c.cancel()
	}
	return len(p), nil
}

// TestInterruptedOp: an op cut short by Ctrl-C has no result; the replay
// stops with 130.
func TestInterruptedOp(t *testing.T) {
	assert.True(t, isContextError(fmt.Errorf("wrapped: %w", context.Canceled)))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out, errb bytes.Buffer
	code := run(ctx, []string{"replay", "--json", writeScript(t, okStart+`{"op":"snapshot"}`+"\n")}, strings.NewReader(""), &out, &errb)
	assert.Equal(t, exitInterrupted, code)
	assert.Contains(t, errb.String(), "interrupted")
	assert.NotContains(t, out.String(), "context canceled")
}

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// demoBinary builds the command once for the tests that send it signals.
func demoBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the binary")
	}
	if runtime.GOOS == "windows" {
		t.Skip("no SIGINT to send on windows")
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "demo-bin-*")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "demo")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	require.NoError(t, buildErr)
	return binPath
}

func exitCode(t *testing.T, cmd *exec.Cmd, timeout time.Duration) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		require.NoError(t, err)
		return 0
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("still running %v after SIGINT", timeout)
		return -1
	}
}

// signalWhileReading starts bin with args, writes okStart to its standard
// input and sends sig while the command waits for more. Nothing shows from
// outside when the process has installed its handler and blocks reading,
// so the signal is sent after a delay. A signal that arrives before the
// handler (a very slow machine) ends the process the Go runtime's default
// way, without our message: then it tries again with a longer delay, so
// the test never fails because the machine is slow. It returns the exit
// code, standard output and standard error of the last try.
func signalWhileReading(t *testing.T, bin string, sig os.Signal, args ...string) (int, string, string) {
	t.Helper()
	for _, delay := range []time.Duration{300 * time.Millisecond, 2 * time.Second, 8 * time.Second} {
		cmd := exec.Command(bin, args...)
		stdin, err := cmd.StdinPipe()
		require.NoError(t, err)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		require.NoError(t, cmd.Start())
		_, err = io.WriteString(stdin, okStart)
		require.NoError(t, err)
		time.Sleep(delay)
		require.NoError(t, cmd.Process.Signal(sig))
		code := exitCode(t, cmd, 10*time.Second)
		_ = stdin.Close()
		if code != exitInterrupted && !strings.Contains(stderr.String(), "interrupted") && delay < 8*time.Second {
			t.Logf("the signal came before the handler was installed (exit %d); trying with a longer delay", code)
			continue
		}
		return code, stdout.String(), stderr.String()
	}
	panic("unreachable: the last delay returns")
}

// TestSIGINT sends a real SIGINT to the built command: while it reads
// standard input, and in the middle of a long replay. Both stop at once
// with exit status 130 and say so on stderr.
func TestSIGINT(t *testing.T) {
	bin := demoBinary(t)

	t.Run("while reading standard input", func(t *testing.T) {
		code, stdout, stderr := signalWhileReading(t, bin, syscall.SIGINT, "replay", "-")
		assert.Equal(t, exitInterrupted, code, "stderr: %s", stderr)
		assert.Contains(t, stderr, "interrupted")
		assert.Empty(t, stdout)
	})

	t.Run("mid-replay", func(t *testing.T) {
		const pairs = 100_000
		path := writeScript(t, okStart+strings.Repeat(`{"op":"reserve","location":"cuda:0","name":"r","bytes":1}`+"\n"+`{"op":"unreserve","name":"r"}`+"\n", pairs))
		cmd := exec.Command(bin, "replay", path, "--json")
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		require.NoError(t, cmd.Start())
		sc := bufio.NewScanner(stdout)
		require.True(t, sc.Scan(), "no first result")
		require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
		lines := 1
		for sc.Scan() {
			lines++
			assert.NotContains(t, sc.Text(), "context canceled")
		}
		assert.Equal(t, exitInterrupted, exitCode(t, cmd, 10*time.Second), "stderr: %s", stderr.String())
		assert.Less(t, lines, 2*pairs+1, "the replay ran to its end")
		assert.Contains(t, stderr.String(), "interrupted")
		assert.Contains(t, stderr.String(), fmt.Sprintf("of %d ops finished", 2*pairs+1))
	})
}
