//go:build unix

package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestInterruptFIFONoWriter: `demo replay FIFO` while nobody writes to
// the FIFO waits in open(2); Ctrl-C ends that wait at once: exit status
// 130, a message, nothing run, no goroutine left (the open does not block
// the command, so the first Ctrl-C is heeded).
func TestInterruptFIFONoWriter(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "script.fifo")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	for _, delay := range []time.Duration{0, 50 * time.Millisecond} {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(delay, cancel)
		var out, errb bytes.Buffer
		done := make(chan int, 1)
		go func() { done <- run(ctx, []string{"replay", fifo}, strings.NewReader(""), &out, &errb) }()
		select {
		case code := <-done:
			assert.Equal(t, exitInterrupted, code, errb.String())
		case <-time.After(10 * time.Second):
			// Release the blocked open so that the test can end.
			if w, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
				w.Close()
			}
			<-done
			t.Fatal("still waiting for a writer 10 s after the interrupt")
		}
		cancel()
		assert.Contains(t, errb.String(), "interrupted while opening the script; nothing ran")
		assert.Empty(t, out.String())
	}

	// A FIFO whose writer comes runs as a script from a pipe does.
	go func() {
		w, err := os.OpenFile(fifo, os.O_WRONLY, 0)
		if err == nil {
			w.WriteString(okStart + `{"op":"snapshot","expect":"ok"}` + "\n")
			w.Close()
		}
	}()
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"replay", "--json", fifo}, strings.NewReader(""), &out, &errb)
	require.Equal(t, 0, code, errb.String())
	assert.Equal(t, 2, strings.Count(out.String(), "\n"))
}

// TestSIGINTFIFO: the same with the built command and a real SIGINT.
func TestSIGINTFIFO(t *testing.T) {
	bin := demoBinary(t)
	fifo := filepath.Join(t.TempDir(), "script.fifo")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	// As in TestSIGINT: a signal that comes before the handler is
	// installed ends the process the Go runtime's way; then try again,
	// later.
	for _, delay := range []time.Duration{300 * time.Millisecond, 2 * time.Second, 8 * time.Second} {
		cmd := exec.Command(bin, "replay", fifo)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		require.NoError(t, cmd.Start())
		time.Sleep(delay)
		require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
		code := exitCode(t, cmd, 10*time.Second)
		if code != exitInterrupted && !strings.Contains(stderr.String(), "interrupted") && delay < 8*time.Second {
			t.Logf("the signal came before the handler was installed (exit %d); trying with a longer delay", code)
			continue
		}
		assert.Equal(t, exitInterrupted, code, "stderr: %s", stderr.String())
		assert.Contains(t, stderr.String(), "interrupted while opening the script; nothing ran")
		assert.Empty(t, stdout.String())
		return
	}
}
