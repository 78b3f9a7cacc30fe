package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSIGTERM: SIGTERM stops replay, diagnose and offload as Ctrl-C does
// (exit status 130 and a note on stderr saying where it stopped), not
// the default handler's exit 143 with no note.
func TestSIGTERM(t *testing.T) {
	bin := demoBinary(t)

	t.Run("replay mid-run", func(t *testing.T) {
		const pairs = 100_000
		path := writeScript(t, okStart+strings.Repeat(`{"op":"reserve","location":"cuda:0","name":"r","bytes":1}`+"\n"+`{"op":"unreserve","name":"r"}`+"\n", pairs))
		cmd := exec.Command(bin, "replay", "--json", path)
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		require.NoError(t, cmd.Start())
		sc := bufio.NewScanner(stdout)
		require.True(t, sc.Scan(), "no first result")
		require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
		for sc.Scan() {
		}
		assert.Equal(t, exitInterrupted, exitCode(t, cmd, 10*time.Second), "stderr: %s", stderr.String())
		assert.Contains(t, stderr.String(), fmt.Sprintf("of %d ops finished, the rest did not run", 2*pairs+1))
	})

	t.Run("diagnose while reading the script", func(t *testing.T) {
		code, stdout, stderr := signalWhileReading(t, bin, syscall.SIGTERM, "diagnose", "-")
		assert.Equal(t, exitInterrupted, code, "stderr: %s", stderr)
		assert.Contains(t, stderr, "interrupted while reading the script; nothing ran")
		assert.Empty(t, stdout)
	})

	t.Run("offload while waiting for the trace", func(t *testing.T) {
		cmd := exec.Command(bin, "offload", "--speed", "1", "--limit", "200")
		cmd.Dir = t.TempDir() // the built-in trace: any directory
		stderr, err := cmd.StderrPipe()
		require.NoError(t, err)
		var stdout bytes.Buffer
		cmd.Stdout = &stdout
		require.NoError(t, cmd.Start())
		sc := bufio.NewScanner(stderr)
		require.True(t, sc.Scan(), "no progress line")
		assert.Contains(t, sc.Text(), "offload: replaying 200 requests")
		require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
		var rest strings.Builder
		for sc.Scan() {
			rest.WriteString(sc.Text() + "\n")
		}
		assert.Equal(t, exitInterrupted, exitCode(t, cmd, 10*time.Second), "stderr: %s", rest.String())
		assert.Contains(t, rest.String(), "demo offload: interrupted")
		assert.Empty(t, stdout.String())
	})
}
