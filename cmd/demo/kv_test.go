package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// kvTraceFile writes a small Mooncake-format trace: a shared prefix of
// four blocks, then each request its own two.
func kvTraceFile(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for i := range 30 {
		b.WriteString(`{"timestamp": ` + strconv.Itoa(i*10) + `, "input_length": 3072, "output_length": 8, "hash_ids": [1, 2, 3, 4, ` + strconv.Itoa(100+i%7) + `, ` + strconv.Itoa(200+i%11) + "]}\n")
	}
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o600))
	return path
}

func TestKVHelpDocumentsEveryFlag(t *testing.T) {
	code, out, errOut := runDemo(t, "kv", "--help")
	require.Equal(t, 0, code, errOut)
	for _, flag := range []string{"-trace", "-block-size", "-gpu", "-spill", "-spill-size", "-limit", "-json", "-plot"} {
		require.Regexp(t, "\n  "+flag+"[ \n]", out, "demo kv --help does not document %s", flag)
	}
	require.Contains(t, out, "soft backend (a simulation")
	code, out, _ = runDemo(t, "help")
	require.Equal(t, 0, code)
	require.Contains(t, out, "demo kv [--trace FILE]")
}

func TestKVTableJSONAndPlot(t *testing.T) {
	path := kvTraceFile(t)
	svg := filepath.Join(t.TempDir(), "kv.svg")
	code, out, errOut := runDemo(t, "kv", "--trace", path, "--gpu", "6,8,12", "--spill-size", "4", "--block-size", "1KiB", "--plot", svg)
	require.Equal(t, 0, code, errOut)
	for _, want := range []string{"30 requests, 180 block uses, 22 distinct blocks", "blocks of 1 KiB, on the soft backend", "spill tier pinned-host: 4 blocks",
		"LRU 6", "two-tier LRU 6+4", "optimal 6", "optimal 10", "GPU 12: residency GPU hits"} {
		require.Contains(t, out, want)
	}
	b, err := os.ReadFile(svg)
	require.NoError(t, err)
	require.Contains(t, string(b), "<svg")
	require.Contains(t, string(b), "two-tier LRU")

	code, out, errOut = runDemo(t, "kv", "--trace", path, "--gpu", "6", "--spill", "none", "--json", "--limit", "10")
	require.Equal(t, 0, code, errOut)
	var rep kvReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	require.Equal(t, 10, rep.Requests)
	require.Len(t, rep.Points, 1)
	p := rep.Points[0]
	require.Equal(t, int64(60), p.Residency.Uses)
	require.Equal(t, p.Residency.Uses, p.Residency.GPUHits+p.Residency.Misses)
	require.Nil(t, p.TwoTierLRU)
	require.GreaterOrEqual(t, p.OptimalGPU.GPUHits, p.LRU.GPUHits)
}

func TestKVRefusesBadInput(t *testing.T) {
	path := kvTraceFile(t)
	bad := filepath.Join(t.TempDir(), "bad.jsonl")
	require.NoError(t, os.WriteFile(bad, []byte("{\"hash_ids\": [1]}\n{\"hash_ids\": [-1]}\n"), 0o600))
	for _, c := range []struct {
		args []string
		text string
	}{
		{[]string{"--gpu", "0"}, "--gpu \"0\": want block counts > 0"},
		{[]string{"--gpu", "10,5"}, "ascending"},
		{[]string{"--block-size", "0"}, "--block-size \"0\""},
		{[]string{"--spill", "cuda:1"}, "--spill \"cuda:1\""},
		{[]string{"--spill-size", "-2x"}, "--spill-size \"-2x\""},
		{[]string{"--spill-size", "many"}, "--spill-size \"many\""},
		{[]string{"--limit", "-1"}, "--limit -1"},
		{[]string{"extra"}, "unexpected argument \"extra\""},
		{[]string{"--trace", bad}, "bad.jsonl: line 2: hash_ids[0] is -1"},
		{[]string{"--trace", filepath.Join(t.TempDir(), "absent.jsonl")}, "absent.jsonl"},
	} {
		args := append([]string{"kv", "--trace", path}, c.args...)
		code, _, errOut := runDemo(t, args...)
		require.Equal(t, 2, code, "%v: %s", c.args, errOut)
		require.Contains(t, errOut, c.text, "%v", c.args)
	}
	code, out, errOut := runDemo(t, "kv", "--no-such-flag")
	require.Equal(t, 2, code)
	require.Empty(t, out)
	require.Contains(t, errOut, "flag provided but not defined: -no-such-flag")
	require.Contains(t, errOut, "usage: demo kv")
	code, _, errOut = runDemo(t, "kv", "--trace", path, "--gpu", "6", "--plot", filepath.Join(t.TempDir(), "no", "such", "dir.svg"))
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "--plot")
}
