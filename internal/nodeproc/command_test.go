package nodeproc

import (
	"bufio"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestParseCommand: a node reads its commands as strictly as the
// replay reads its ops: duplicate keys, unknown or
// mistyped fields and bad values are refused with a message naming them,
// and the reply keeps the line's id whenever one can be read.
func TestParseCommand(t *testing.T) {
	ok := []struct {
		line string
		want Command
	}{
		{`{"id":1,"op":"register","name":"w","bytes":16,"at":"cuda:0","seed":7}`, Command{ID: 1, Op: "register", Name: "w", Bytes: 16, At: "cuda:0", Seed: 7}},
		{`{"id":2,"op":"register","name":"w","bytes":"16MiB","source":"pageable-host"}`, Command{ID: 2, Op: "register", Name: "w", Bytes: 16 << 20, Source: "pageable-host"}},
		{`{"id":3,"op":"copy","name":"w","bytes":4,"from":"a","at":"cuda:0","remote":"v","source":"pinned-host","location":"cuda:1","timeout_ms":5000}`,
			Command{ID: 3, Op: "copy", Name: "w", Bytes: 4, From: "a", At: "cuda:0", Remote: "v", Source: "pinned-host", Location: "cuda:1", TimeoutMS: 5000}},
		{`{"op":"members"}`, Command{Op: "members"}},
		{`{"id":-4,"op":"place","name":"r","value":"w","tiers":[["cuda:0@*"],"pinned-host"],"hold":true,"max_attempts":2}`,
			Command{ID: -4, Op: "place", Name: "r", Value: "w", Tiers: [][]string{{"cuda:0@*"}, {"pinned-host"}}, Hold: true, MaxAttempts: 2}},
		{` {"id":5,"op":"inspect","name":"w"} `, Command{ID: 5, Op: "inspect", Name: "w"}},
	}
	for _, c := range ok {
		got, err := parseCommand([]byte(c.line))
		require.NoError(t, err, c.line)
		assert.Equal(t, c.want, got, c.line)
	}

	bad := []struct {
		line   string
		id     int64
		op     string
		reason string
	}{
		{`{"id":1,"op":"register","name":"a","name":"b","bytes":5,"at":"cuda:0"}`, 1, "register", `duplicate key "name"`},
		{`{"id":2,"op":"register","name":"a","bytes":5,"at":"cuda:0","color":"red"}`, 2, "register", `unknown field "color"`},
		{`{"id":3,"op":"register","name":"a","bytes":-5,"at":"cuda:0"}`, 3, "register", `field "bytes": must be > 0, got -5`},
		{`{"id":4,"op":"register","name":"a","bytes":0,"at":"cuda:0"}`, 4, "register", `must be > 0`},
		{`{"id":5,"op":"register","name":"a","bytes":1e30,"at":"cuda:0"}`, 5, "register", `too large`},
		{`{"id":6,"op":"register","name":"a","bytes":5}`, 6, "register", `exactly one of "at"`},
		{`{"id":7,"op":"register","name":"a","bytes":5,"at":"cuda:0","source":"pageable-host"}`, 7, "register", `exactly one of "at"`},
		{`{"id":8,"op":"register","bytes":5,"at":"cuda:0"}`, 8, "register", `needs field "name"`},
		{`{"id":9,"op":"members","timeout_ms":-1}`, 9, "members", `"timeout_ms": -1 is outside`},
		{`{"id":10,"op":"members","timeout_ms":9223372036854775807}`, 10, "members", `"timeout_ms"`},
		{`{"id":11,"op":"place","name":"r","value":"w","tiers":[["cuda:0@*"]],"hold":1}`, 11, "place", `field "hold": want true or false, got a number`},
		{`{"id":12,"op":"place","name":"r","value":"w","tiers":[["cuda:0@*"]],"max_attempts":-1}`, 12, "place", `"max_attempts": -1 is outside`},
		{`{"id":13,"op":"place","name":"r","value":"w","tiers":[[1]]}`, 13, "place", `want a location (a string), got a number`},
		{`{"id":14,"op":"explode"}`, 14, "?", `unknown op "explode"`},
		{`{"id":15,"op":"read","name":7,"at":"cuda:0"}`, 15, "read", `field "name": want a string, got a number`},
		{`{"id":"x","op":"members"}`, 0, "?", `field "id": want an integer, got a string`},
		{`{"id":1.5,"op":"members"}`, 0, "?", `not a whole number`},
		{`{"op":5}`, 0, "?", `field "op": want a string`},
		{`not json`, 0, "?", `malformed command: column 1`},
		{`[1,2]`, 0, "?", `not a JSON object`},
		{`{"id":16,"op":"members"} {"id":17}`, 0, "?", `after the end of the JSON value`},
		{strings.Repeat("[", 100), 0, "?", `nested more than`},
		// Invalid UTF-8 is refused (never read as U+FFFD, which would make
		// "a\xff" and "a\xfe" one name).
		{"{\"id\":18,\"op\":\"register\",\"name\":\"a\xff\",\"bytes\":5,\"at\":\"cuda:0\"}", 18, "register", "byte 0xff is not valid UTF-8"},
		{`{"id":19,"op":"inspect","name":"\ud800"}`, 19, "inspect", `\ud800 is half of a UTF-16 surrogate pair`},
	}
	for _, c := range bad {
		_, err := parseCommand([]byte(c.line))
		var ce *commandError
		require.ErrorAs(t, err, &ce, c.line)
		assert.Contains(t, ce.msg, c.reason, c.line)
		assert.True(t, strings.HasPrefix(ce.msg, "malformed command: "), ce.msg)
		r := ce.reply()
		assert.Equal(t, c.id, r.ID, c.line)
		assert.Equal(t, c.op, r.Op, c.line)
		assert.False(t, r.OK)
		assert.Equal(t, "InvalidInputError", r.ErrorType)
	}
}

// TestNodeCommandsOfTheDrivers: every command internal/nodeproc sends (as
// the multi-process tests and cluster-demo build them) reads back as sent.
func TestNodeCommandsOfTheDrivers(t *testing.T) {
	for _, c := range []Command{
		{ID: 1, Op: "register", Name: "w", Bytes: 16 << 20, At: "cuda:0", Seed: 42},
		{ID: 2, Op: "register", Name: "wp", Bytes: 1 << 20, Source: "pageable-host", Seed: 4},
		{ID: 3, Op: "copy", Name: "w", From: "node-a", Bytes: 16 << 20, At: "cuda:0"},
		{ID: 4, Op: "copy", Name: "w-a", Remote: "w", From: "node-a", Bytes: 16 << 20, At: "cuda:0", TimeoutMS: 5000},
		{ID: 5, Op: "read", Name: "w", At: "cuda:0"},
		{ID: 6, Op: "discard", Name: "w"},
		{ID: 7, Op: "whereis", Name: "w"},
		{ID: 8, Op: "members"},
		{ID: 9, Op: "summaries"},
		{ID: 10, Op: "refresh"},
		{ID: 11, Op: "place", Name: "serve-w", Value: "w", Tiers: [][]string{{"cuda:0@*"}}, Hold: true, TimeoutMS: 10000},
		{ID: 12, Op: "release", Name: "serve-w"},
		{ID: 13, Op: "inspect", Name: "w"},
	} {
		b, err := json.Marshal(c)
		require.NoError(t, err)
		got, err := parseCommand(b)
		require.NoError(t, err, "%s", b)
		assert.Equal(t, c, got, "%s", b)
	}
}

// TestReadCommandLine: a line longer than the bound is skipped whole (its
// bytes never held), and the next line is read as usual.
func TestReadCommandLine(t *testing.T) {
	long := strings.Repeat("x", 3*maxCommandLine)
	br := bufio.NewReaderSize(strings.NewReader(`{"op":"members"}`+"\r\n"+long+"\n"+"last"), 64<<10)
	line, tooLong, err := readCommandLine(br, nil, maxCommandLine)
	require.NoError(t, err)
	assert.False(t, tooLong)
	assert.Equal(t, `{"op":"members"}`, string(line))
	line, tooLong, err = readCommandLine(br, nil, maxCommandLine)
	require.NoError(t, err)
	assert.True(t, tooLong)
	assert.Nil(t, line)
	line, tooLong, err = readCommandLine(br, nil, maxCommandLine)
	require.NoError(t, err)
	assert.False(t, tooLong)
	assert.Equal(t, "last", string(line))
	_, _, err = readCommandLine(br, nil, maxCommandLine)
	assert.ErrorIs(t, err, io.EOF)
}
