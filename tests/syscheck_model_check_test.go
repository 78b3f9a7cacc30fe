package tests

import (
	"testing"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// op is one sequential or overlapping call of a hand-made history.
func scOp(client int, call, ret int64, in, out any) porcupine.Operation {
	return porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret}
}

// The models can fail: histories that break a documented rule are reported
// non-linearizable, and their correct variants pass. Without this a model
// that accepts everything would pass the checker.
func TestSyscheckModelsRejectWrongHistories(t *testing.T) {
	reg := rmInput{op: "register", val: "v", at: 2, exclusive: true, hasSource: true}
	acq := rmInput{op: "acquire", val: "v", loc: 2}
	rel := rmInput{op: "release", val: "v", loc: 2}
	evict := rmInput{op: "evict", val: "v", loc: 2}
	place := rmInput{op: "place", val: "v", loc: 3}
	never := int64(1 << 60)
	cases := []struct {
		name string
		ops  []porcupine.Operation
		want porcupine.CheckResult
	}{
		{"evicted while leased", []porcupine.Operation{
			scOp(0, 0, 1, reg, resOK), scOp(0, 2, 3, acq, resOK), scOp(1, 4, 5, evict, resOK), scOp(0, 6, 7, rel, resOK),
		}, porcupine.Illegal},
		{"evicted after the release", []porcupine.Operation{
			scOp(0, 0, 1, reg, resOK), scOp(0, 2, 3, acq, resOK), scOp(0, 4, 5, rel, resOK), scOp(1, 6, 7, evict, resOK),
		}, porcupine.Ok},
		{"evict overlapping the release", []porcupine.Operation{
			scOp(0, 0, 1, reg, resOK), scOp(0, 2, 3, acq, resOK), scOp(0, 4, 8, rel, resOK), scOp(1, 5, 7, evict, resOK),
		}, porcupine.Ok},
		{"acquire granted on an absent copy", []porcupine.Operation{
			scOp(0, 0, 1, reg, resOK), scOp(1, 2, 3, evict, resOK), scOp(0, 4, 5, acq, resOK),
		}, porcupine.Illegal},
		{"in use without a protection", []porcupine.Operation{
			scOp(0, 0, 1, reg, resOK), scOp(1, 2, 3, evict, resInUse),
		}, porcupine.Illegal},
		{"moved away from a leased copy", []porcupine.Operation{
			scOp(0, 0, 1, reg, resOK), scOp(0, 2, 3, acq, resOK), scOp(1, 4, 5, place, resOK),
		}, porcupine.Illegal},
		{"a cancelled evict may happen late", []porcupine.Operation{
			scOp(0, 0, 1, reg, resOK), scOp(1, 2, never, evict, resUnknown), scOp(0, 4, 5, acq, resEndpoint),
		}, porcupine.Ok},
		{"an admission's victim was leased", []porcupine.Operation{
			scOp(0, 0, 1, reg, resOK), scOp(0, 2, 3, acq, resOK),
			scOp(1, 4, 5, rmInput{op: "admit", val: "v", effects: []rmEffect{{kind: "remove", loc: 2}}}, resOK),
		}, porcupine.Illegal},
		{"use after discard", []porcupine.Operation{
			scOp(0, 0, 1, reg, resOK), scOp(1, 2, 3, rmInput{op: "discard", val: "v"}, resOK), scOp(0, 4, 5, acq, resOK),
		}, porcupine.Illegal},
	}
	for _, c := range cases {
		res, _ := porcupine.CheckOperationsVerbose(residencyModel.ToModel(), c.ops, 0)
		assert.Equal(t, c.want, res, "residency model: %s", c.name)
	}

	load := cmInput{op: "load", key: "k"}
	cases = []struct {
		name string
		ops  []porcupine.Operation
		want porcupine.CheckResult
	}{
		{"two values for a held key", []porcupine.Operation{
			scOp(0, 0, 1, load, cmOutput{res: resOK, id: 1}), scOp(1, 2, 3, load, cmOutput{res: resOK, id: 2}),
		}, porcupine.Illegal},
		{"concurrent loads share one value", []porcupine.Operation{
			scOp(0, 0, 4, load, cmOutput{res: resOK, id: 1}), scOp(1, 1, 3, load, cmOutput{res: resOK, id: 1}),
		}, porcupine.Ok},
		{"a reload after the release", []porcupine.Operation{
			scOp(0, 0, 1, load, cmOutput{res: resOK, id: 1}), scOp(0, 2, 3, cmInput{op: "release", key: "k", id: 1}, cmOutput{res: resOK}),
			scOp(1, 4, 5, load, cmOutput{res: resOK, id: 2}),
		}, porcupine.Ok},
		{"an old value comes back", []porcupine.Operation{
			scOp(0, 0, 1, load, cmOutput{res: resOK, id: 2}), scOp(0, 2, 3, cmInput{op: "release", key: "k", id: 2}, cmOutput{res: resOK}),
			scOp(1, 4, 5, load, cmOutput{res: resOK, id: 1}),
		}, porcupine.Illegal},
		{"a held entry evicted", []porcupine.Operation{
			scOp(0, 0, 1, load, cmOutput{res: resOK, id: 1}), scOp(1, 2, 3, cmInput{op: "evict", key: "k"}, cmOutput{res: resOK, removed: true}),
		}, porcupine.Illegal},
		{"a held key failed to load", []porcupine.Operation{
			scOp(0, 0, 1, load, cmOutput{res: resOK, id: 1}), scOp(1, 2, 3, load, cmOutput{res: resRefused}),
		}, porcupine.Illegal},
	}
	for _, c := range cases {
		res, _ := porcupine.CheckOperationsVerbose(cacheModel.ToModel(), c.ops, 0)
		assert.Equal(t, c.want, res, "cache model: %s", c.name)
	}
	require.False(t, t.Failed())
}
