package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A replay's input, memory and time are bounded.

// countingReader counts the bytes read from r.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// TestStdinBounded: a script on standard input (kept in a temporary file
// to be read twice) is bounded: an endless one stops with a clear message
// and exit status 2 once it passes maxSpoolBytes, having read about that
// much (the temporary file never grows without end).
func TestStdinBounded(t *testing.T) {
	old := maxSpoolBytes
	maxSpoolBytes = 256 << 10
	defer func() { maxSpoolBytes = old }()

	body := []byte(`{"op":"snapshot"}` + "\n")
	endless := &countingReader{r: &repeatReader{head: []byte(okStart), body: body, n: 1 << 40}}
	stdin := struct{ io.Reader }{endless} // not seekable: spooled
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"replay", "--json", "-"}, stdin, &out, &errb)
	assert.Equal(t, 2, code, errb.String())
	assert.Contains(t, errb.String(), "demo replay: -: standard input is longer than 256 KiB")
	assert.Contains(t, errb.String(), "save the script to a file and pass its path")
	assert.Empty(t, out.String(), "nothing ran")
	assert.Less(t, endless.n, maxSpoolBytes+(1<<20), "read far past the bound")

	// Up to the bound, standard input runs as before.
	script := okStart + strings.Repeat(`{"op":"snapshot"}`+"\n", 1000)
	require.Less(t, int64(len(script)), maxSpoolBytes)
	out.Reset()
	errb.Reset()
	code = run(context.Background(), []string{"replay", "--json", "-"}, struct{ io.Reader }{strings.NewReader(script)}, &out, &errb)
	require.Equal(t, 0, code, errb.String())
	assert.Equal(t, 1001, strings.Count(out.String(), "\n"))
}

// TestLeaseNamesInTrace: a released lease keeps its script name in the
// trace while the trace can show it, and its events name it too.
func TestLeaseNamesInTrace(t *testing.T) {
	script := okStart +
		`{"op":"register","handle":"a","bytes":10,"at":"cuda:0"}` + "\n" +
		`{"op":"acquire","handle":"a","location":"cuda:0","as":"reader"}` + "\n" +
		`{"op":"record_event","lease":"reader","event":"kernel"}` + "\n" +
		`{"op":"release","lease":"reader"}` + "\n" +
		`{"op":"complete_event","event":"kernel"}` + "\n" +
		`{"op":"trace"}` + "\n"
	results, code, errs := replayResults(t, script)
	require.Equal(t, 0, code, errs)
	var details []string
	for _, tr := range results[7]["trace"].([]any) {
		details = append(details, tr.(map[string]any)["detail"].(string))
	}
	assert.Contains(t, details, `lease "reader"`)
	assert.Contains(t, details, `event "kernel" on lease "reader"`)
	assert.Contains(t, details, `event "kernel"`)
}
