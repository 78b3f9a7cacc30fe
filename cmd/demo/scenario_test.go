package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestScenario runs the embedded demo (what `make demo` runs) and checks
// that it completes and prints the evidence of every step.
func TestScenario(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(context.Background(), nil, strings.NewReader(""), &out, &errb); code != 0 {
		t.Fatalf("exit status %d; stderr:\n%s\nstdout:\n%s", code, errb.String(), out.String())
	}
	text := out.String()
	for _, want := range []string{
		"soft (simulated devices)",
		"No GPU is used",
		"1 MiB here stands for 1 GiB",
		"ResidencyUnavailableError: handle=embedder location=cuda:1",
		"ResidencyInUseError: handle=llm-small location=cuda:0 use_count=1 hold_count=0 pending_event_count=0",
		"ResidencyInUseError: handle=llm-small location=cuda:0 use_count=0 hold_count=0 pending_event_count=1",
		"use_count=0 hold_count=0 pending_event_count=0",
		"ResidencyBudgetError: location=cuda:0 budget_bytes=8388608 used_bytes=6291456 reserved_bytes=2097152 requested_bytes=1048576",
		"expected_state_version=",
		"evict llm-small at cuda:0",
		"predicted peak: pageable-host",
		"the scope holds 2 leases",
		"ResidencyPlanExecutionError: phase=enter failed_action=embedder at cuda:1 failed_action_index=2",
		"cause: soft backend: injected copy fault at cuda:1",
		"warmup reservation was released: cuda:1 reserved_bytes=0",
		"check: llm-large  at cuda:0",
		"identical ✓",
		"location  budget",
		"bytes still charged anywhere: 0",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the demo's output lacks %q", want)
		}
	}
	if errb.Len() != 0 {
		t.Errorf("stderr: %s", errb.String())
	}
	if t.Failed() {
		t.Logf("output:\n%s", text)
	}
}
