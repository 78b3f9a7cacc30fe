package replay

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestNamesMustBeUTF8: a script whose name is not valid UTF-8 (or holds
// a lone escaped surrogate) is refused naming the line and the column,
// never read as U+FFFD (then "a\xff" and "a\xfe" would collide as a
// duplicate name). A name is exactly what the script said.
func TestNamesMustBeUTF8(t *testing.T) {
	start := `{"op":"start","locations":{"pageable-host":null,"cuda:0":"1MiB"}}` + "\n"
	for _, c := range []struct{ script, want string }{
		{start + "{\"op\":\"register\",\"handle\":\"a\xff\",\"bytes\":1,\"at\":\"cuda:0\"}\n" +
			"{\"op\":\"register\",\"handle\":\"a\xfe\",\"bytes\":1,\"at\":\"cuda:0\"}\n", "line 2: malformed JSON: column 29: bad string: byte 0xff is not valid UTF-8"},
		{start + `{"op":"register","handle":"a\udfff","bytes":1,"at":"cuda:0"}` + "\n", `line 2: malformed JSON: column 29: bad string: \udfff is half of a UTF-16 surrogate pair`},
	} {
		_, err := Parse(strings.NewReader(c.script))
		require.Error(t, err)
		assert.Contains(t, err.Error(), c.want)
	}
	ops, err := Parse(strings.NewReader(start + `{"op":"register","handle":"\ud83d\ude00","bytes":1,"at":"cuda:0"}` + "\n" +
		`{"op":"register","handle":"` + "\ufffd" + `","bytes":1,"at":"cuda:0"}` + "\n"))
	require.NoError(t, err)
	assert.Equal(t, "😀", ops[1].handle)
	assert.Equal(t, "\ufffd", ops[2].handle)
}
