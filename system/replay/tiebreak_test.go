package replay

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const tieStart = `{"op":"start","locations":{"pageable-host":null,"cuda:0":10,"cuda:1":10}}
{"op":"register","handle":"x","bytes":1,"source":"pageable-host"}
`

func tieDecide(tie string) string {
	return `{"op":"decide","request":{"name":"r","requirements":[{"handle":"x","locations":[["cuda:0","cuda:1"]]}]` + tie + `},"as":"d"}` + "\n"
}

func TestRequestTieBreakParses(t *testing.T) {
	for tie, mostFree := range map[string]bool{``: false, `,"tie_break":"first_listed"`: false, `,"tie_break":"most_free"`: true} {
		ops, err := Parse(strings.NewReader(tieStart + tieDecide(tie)))
		require.NoError(t, err, tie)
		require.Equal(t, mostFree, ops[len(ops)-1].request.mostFree, tie)
	}
}

func TestRequestTieBreakRefused(t *testing.T) {
	for _, tie := range []string{`,"tie_break":"most-free"`, `,"tie_break":1`, `,"tie_break":null`} {
		_, err := Parse(strings.NewReader(tieStart + tieDecide(tie)))
		var se *ScriptError
		require.True(t, errors.As(err, &se), "%s: %v", tie, err)
		require.Equal(t, 3, se.Line, tie)
		require.Contains(t, se.Msg, "tie_break", tie)
	}
}
