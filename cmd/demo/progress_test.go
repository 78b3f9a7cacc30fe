package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// longScript is a script of about 600 ops whose last op fails.
func longScript(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	b.WriteString(`{"op":"start","locations":{"pageable-host":null,"cuda:0":"1MiB"}}` + "\n")
	for i := 0; i < 200; i++ {
		fmt.Fprintf(&b, `{"op":"register","handle":"v%d","bytes":64,"at":"pageable-host"}`+"\n", i)
		fmt.Fprintf(&b, `{"op":"place","handle":"v%d","location":"cuda:0"}`+"\n", i)
		fmt.Fprintf(&b, `{"op":"place","handle":"v%d","location":"pageable-host"}`+"\n", i)
	}
	b.WriteString(`{"op":"reserve","location":"cuda:0","name":"big","bytes":"2MiB","expect":"ResidencyBudgetError"}` + "\n")
	p := filepath.Join(t.TempDir(), "long.jsonl")
	require.NoError(t, os.WriteFile(p, []byte(b.String()), 0o644))
	return p
}

// noDelay shows the bar from the first op on, for the test.
func noDelay(t *testing.T) {
	old := progressDelay
	progressDelay = 0
	t.Cleanup(func() { progressDelay = old })
}

func runWith(args []string, stdout, stderr io.Writer) int {
	return run(context.Background(), args, strings.NewReader(""), stdout, stderr)
}

// TestProgressNotOnANonTerminal: with standard error not a terminal (a
// buffer, a file) no bar byte is written, whatever the mode.
func TestProgressNotOnANonTerminal(t *testing.T) {
	noDelay(t)
	script := longScript(t)
	for _, args := range [][]string{
		{"replay", script}, {"replay", "--json", script},
		{"diagnose", script}, {"diagnose", "--json", script},
	} {
		var out, errb bytes.Buffer
		runWith(args, &out, &errb)
		assert.NotContains(t, errb.String(), "\r", args)
		assert.NotContains(t, errb.String(), "\x1b", args)
		assert.NotContains(t, errb.String(), "ops", args)

		f, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
		require.NoError(t, err)
		runWith(args, io.Discard, f)
		require.NoError(t, f.Close())
		b, err := os.ReadFile(f.Name())
		require.NoError(t, err)
		assert.NotContains(t, string(b), "\r", args)
		assert.NotContains(t, string(b), "\x1b", args)
	}
}

// TestProgressOnATerminal: on a terminal the bar is drawn on standard
// error and cleared at the end; the output on standard output is the same
// as without it; --json never draws it.
func TestProgressOnATerminal(t *testing.T) {
	noDelay(t)
	script := longScript(t)
	var plain bytes.Buffer
	runWith([]string{"replay", script}, &plain, io.Discard)
	var plainDiag bytes.Buffer
	runWith([]string{"diagnose", script}, &plainDiag, io.Discard)

	var errb bytes.Buffer
	old := isTerminal
	isTerminal = func(w io.Writer) bool { return w == &errb }
	t.Cleanup(func() { isTerminal = old })

	for _, c := range []struct {
		args []string
		bar  bool
		want string
	}{
		{[]string{"replay", script}, true, plain.String()},
		{[]string{"diagnose", script}, true, plainDiag.String()},
		{[]string{"replay", "--json", script}, false, ""},
		{[]string{"diagnose", "--json", script}, false, ""},
	} {
		errb.Reset()
		var out bytes.Buffer
		start := time.Now()
		runWith(c.args, &out, &errb)
		if !c.bar {
			assert.Empty(t, errb.String(), c.args)
			continue
		}
		assert.Contains(t, errb.String(), "ops", c.args)
		assert.Contains(t, errb.String(), "\x1b[2K\r", c.args)
		assert.True(t, strings.HasSuffix(errb.String(), "\x1b[2K\r"), "the bar is cleared at the end: %q", tail(errb.String()))
		assert.Equal(t, c.want, out.String(), "standard output is the same with a bar")
		assert.Less(t, time.Since(start), time.Minute)
	}
}

func tail(s string) string {
	if len(s) > 200 {
		return s[len(s)-200:]
	}
	return s
}
