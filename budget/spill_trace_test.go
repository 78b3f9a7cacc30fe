package budget

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// The conversation trace of data/ (see data/README.md), read relative to
// this package's directory.
const spillTracePath = "../data/AzureLLMInferenceTrace_conv.csv"

// spillTraceEnv names the environment variable that sets how many of the
// trace's requests TestSpillPolicyTrace runs: a count, or "all" (19,366).
// Unset, it runs the first spillTraceDefaultRows, a few seconds.
const (
	spillTraceEnv         = "RESIDENCY_SPILL_TRACE_ROWS"
	spillTraceDefaultRows = 500
)

// The trace model's fixed parameters (see TestSpillPolicyTrace).
const (
	stBlockTokens   = 128  // tokens per KV block (one value)
	stBytesPerToken = 64   // scaled KV bytes per token, as demo offload's default
	stGPUBlocks     = 256  // each GPU's budget, in blocks (32,768 tokens)
	stPinnedBlocks  = 1024 // pinned-host's budget, in blocks
	stFollowPercent = 50   // share of requests that are a next turn
	stRecentConvs   = 32   // a next turn continues one of this many recent conversations
)

// TestSpillPolicyTrace compares the controller with and without spill
// targets on the Azure LLM conversation trace (data/), run as KV blocks in
// a pure ledger simulation. The trace gives each request's prompt
// (ContextTokens) and output (GeneratedTokens) lengths but no
// conversation ids, so conversations are drawn by a seeded rule:
//
//   - Each request, in trace order, is with probability 1/2 the next turn
//     of a conversation picked uniformly among the 32 most recently active
//     ones (when there is one); otherwise it starts a new conversation.
//   - A conversation's KV is its blocks of 128 tokens (8 KiB each: 64
//     bytes stand for a token) from its previous turn's prompt and output.
//     A next turn's prompt shares its first min(prompt, previous KV)
//     tokens with the conversation: the whole blocks among them are
//     reused; the turn's other blocks (the rest of its prompt and its
//     output) are new, and the reused prefix plus the new blocks become the
//     conversation's KV (blocks past the prefix are discarded).
//   - Conversations are routed sticky: conversation c always decodes on
//     cuda:(c mod 2). Each request is one decision requiring all its
//     blocks on that GPU, executed at once (no overlap in time).
//   - Budgets: 256 blocks per GPU, 1,024 on pinned-host; the blocks'
//     source is pageable-host (no budget), standing for recomputation.
//     With spill, cuda:0 and cuda:1 spill to pinned-host.
//
// A reused block is a hit when it is on the GPU, warm when it is copied
// from another resident copy (a demoted one on pinned-host), cold when it
// is recomputed. New blocks are computed under both policies and counted
// apart. Blocks that are not reused (ended conversations, as the trace
// cannot say) stay where they are until the controller evicts them.
// Demoted B is the victims' bytes demoted to pinned-host; dropped B the
// victims' bytes whose only copy was dropped (with spill: pinned-host had
// no room, and the rule evicts nothing there to make it).
//
// It asserts what must hold whatever the numbers: new bytes equal under
// both policies, no warm or demoted bytes without spill, demotions with
// spill, cold bytes with spill never above those without, and the
// ledger's invariants. Run with -v for the table; set
// RESIDENCY_SPILL_TRACE_ROWS=all for the whole trace.
func TestSpillPolicyTrace(t *testing.T) {
	rows := spillTraceRows(t)
	t.Logf("requests: %d of the trace; blocks of %d tokens, %d B each", len(rows), stBlockTokens, stBlockTokens*stBytesPerToken)
	t.Logf("%-5s %-6s %6s %5s %5s %6s %10s %10s %10s %10s %11s", "seed", "policy", "hits", "warm", "cold", "new", "warm B", "cold B", "demoted B", "dropped B", "new B")
	var sumCold, sumColdSpill int64
	for seed := range uint64(4) {
		plain := spillTraceRun(t, rows, seed, false)
		spill := spillTraceRun(t, rows, seed, true)
		for _, r := range []spillTraceStats{plain, spill} {
			t.Logf("%-5d %-6s %6d %5d %5d %6d %10d %10d %10d %10d %11d", seed, r.policy, r.hits, r.warm, r.cold, r.fresh, r.warmBytes, r.coldBytes, r.demotedBytes, r.droppedBytes, r.freshBytes)
		}
		t.Logf("%-5d cold bytes spill/drop: %.3f", seed, float64(spill.coldBytes)/float64(plain.coldBytes))
		sumCold += plain.coldBytes
		sumColdSpill += spill.coldBytes
		require.Equal(t, plain.freshBytes, spill.freshBytes, "seed %d: new blocks do not depend on the policy", seed)
		require.Equal(t, plain.hits+plain.warm+plain.cold, spill.hits+spill.warm+spill.cold, "seed %d: reused blocks", seed)
		require.Zero(t, plain.warmBytes, "seed %d: without spill nothing is left on pinned-host", seed)
		require.Zero(t, plain.demotedBytes, "seed %d", seed)
		require.Positive(t, plain.coldBytes, "seed %d: the GPUs must be under pressure for the comparison to mean anything", seed)
		require.Positive(t, spill.demotedBytes, "seed %d: spill demotes", seed)
		require.LessOrEqual(t, spill.coldBytes, plain.coldBytes, "seed %d: spill never recomputes more", seed)
	}
	t.Logf("cold bytes with spill / without, all seeds: %.3f", float64(sumColdSpill)/float64(sumCold))
}

type spillTraceRow struct{ context, generated int64 }

type spillTraceStats struct {
	policy                                                       string
	hits, warm, cold, fresh                                      int
	warmBytes, coldBytes, demotedBytes, droppedBytes, freshBytes int64
}

// spillTraceRows reads the trace's first rows (spillTraceEnv says how many).
func spillTraceRows(t *testing.T) []spillTraceRow {
	t.Helper()
	limit := spillTraceDefaultRows
	if s := os.Getenv(spillTraceEnv); s == "all" {
		limit = -1
	} else if s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err, "%s: a count or \"all\"", spillTraceEnv)
		require.Positive(t, n, "%s", spillTraceEnv)
		limit = n
	}
	f, err := os.Open(spillTracePath)
	require.NoError(t, err)
	defer f.Close()
	r := csv.NewReader(f)
	r.FieldsPerRecord = 3
	head, err := r.Read()
	require.NoError(t, err)
	require.Equal(t, []string{"TIMESTAMP", "ContextTokens", "GeneratedTokens"}, head)
	var rows []spillTraceRow
	for limit < 0 || len(rows) < limit {
		rec, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		c, err1 := strconv.ParseInt(rec[1], 10, 64)
		g, err2 := strconv.ParseInt(rec[2], 10, 64)
		require.NoError(t, errors.Join(err1, err2), "row %d", len(rows)+1)
		require.True(t, c >= 0 && g >= 0, "row %d: negative token count", len(rows)+1)
		rows = append(rows, spillTraceRow{c, g})
	}
	require.NotEmpty(t, rows)
	return rows
}

type spillTraceConv struct {
	id     int
	tokens int64    // prompt + output of its last turn
	blocks []Handle // its KV, in token order
}

func spillTraceRun(t *testing.T, rows []spillTraceRow, seed uint64, withSpill bool) spillTraceStats {
	t.Helper()
	const blockBytes = stBlockTokens * stBytesPerToken
	cfg := Config{ManagerID: "trace", Locations: []LocationConfig{{Name: "pageable-host"},
		{Name: "pinned-host", HasBudget: true, BudgetBytes: stPinnedBlocks * blockBytes},
		{Name: "cuda:0", HasBudget: true, BudgetBytes: stGPUBlocks * blockBytes},
		{Name: "cuda:1", HasBudget: true, BudgetBytes: stGPUBlocks * blockBytes}}}
	st := spillTraceStats{policy: "drop"}
	if withSpill {
		st.policy = "spill"
		cfg.Locations[2].SpillTo, cfg.Locations[3].SpillTo = "pinned-host", "pinned-host"
	}
	l, err := New(cfg)
	require.NoError(t, err)
	r := rand.New(rand.NewPCG(seed, 0x21))
	var recent []*spillTraceConv // most recently active last
	nextConv, nextBlock := 0, 0
	for n, row := range rows {
		var c *spillTraceConv
		if len(recent) > 0 && r.IntN(100) < stFollowPercent {
			i := len(recent) - 1 - r.IntN(min(len(recent), stRecentConvs))
			c = recent[i]
			recent = append(recent[:i], recent[i+1:]...)
		} else {
			c = &spillTraceConv{id: nextConv}
			nextConv++
		}
		recent = append(recent, c)
		if len(recent) > stRecentConvs {
			recent = recent[1:]
		}
		gpu := fmt.Sprint("cuda:", c.id%2)
		reused := int(min(row.context, c.tokens) / stBlockTokens)
		for _, h := range c.blocks[reused:] {
			_, err := l.Discard(h)
			require.NoError(t, err)
		}
		c.blocks = c.blocks[:reused]
		req := Request{Name: fmt.Sprint("r", n)}
		for _, h := range c.blocks {
			st.countReused(l, h, gpu)
			req.Requirements = append(req.Requirements, Requirement{Handle: h, Tiers: [][]string{{gpu}}})
		}
		for range (row.context+row.generated+stBlockTokens-1)/stBlockTokens - int64(reused) {
			h, _, err := l.Register(ValueSpec{Name: fmt.Sprint("kv", nextBlock), Bytes: blockBytes, Source: "pageable-host"})
			require.NoError(t, err)
			nextBlock++
			st.fresh++
			st.freshBytes += blockBytes
			c.blocks = append(c.blocks, h)
			req.Requirements = append(req.Requirements, Requirement{Handle: h, Tiers: [][]string{{gpu}}})
		}
		c.tokens = row.context + row.generated
		if len(req.Requirements) == 0 {
			continue
		}
		d, err := l.Decide(req, 0)
		require.NoError(t, err, "request %d", n)
		for _, e := range d.Evictions {
			switch {
			case e.To != "":
				st.demotedBytes += e.Bytes
			case len(l.valueByID(e.Handle.ID).mats) == 1:
				st.droppedBytes += e.Bytes // its only copy
			}
		}
		_, err = dtExecute(l, d)
		require.NoError(t, err, "request %d", n)
	}
	require.NoError(t, l.CheckInvariants())
	return st
}

// countReused classifies a reused block before its request: a hit on gpu,
// warm from another resident copy, cold (recomputed) with none.
func (st *spillTraceStats) countReused(l *Ledger, h Handle, gpu string) {
	v := l.valueByID(h.ID)
	onGPU, elsewhere := false, false
	for _, m := range v.mats {
		if l.locs[m.loc].name == gpu {
			onGPU = true
		} else {
			elsewhere = true
		}
	}
	switch {
	case onGPU:
		st.hits++
	case elsewhere:
		st.warm++
		st.warmBytes += v.bytes
	default:
		st.cold++
		st.coldBytes += v.bytes
	}
}
