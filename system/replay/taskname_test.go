package replay

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/staging"
)

// A task's script name reaches the pipeline (TaskSpec.Name): its errors
// name it, and carry it in their task field, with no message rewritten.
// An empty name is refused by the replay, a name the pipeline refuses is
// its StagingConfigError.
func TestTaskNamesReachThePipeline(t *testing.T) {
	long := strings.Repeat("n", staging.MaxTaskNameBytes+1)
	script := `{"op":"start","locations":{"pageable-host":"64KiB","pinned-host":"16KiB","cuda:0":"8KiB"}}
{"op":"staging_start","name":"kv","device":"cuda:0","slots":1,"slot_bytes":"1KiB","claim_timeout_ms":0,"keys":["k"],"pool_slots":4,"row_bytes":512,"clone_budget":"2KiB"}
{"op":"task_open","pipeline":"kv","task":"","req":"r","mode":"on_finish","expect":"InvalidInput"}
{"op":"task_open","pipeline":"kv","task":"` + long + `","req":"r","mode":"on_finish","expect":"StagingConfigError"}
{"op":"task_open","pipeline":"kv","task":"t 1","req":"r","mode":"on_finish"}
{"op":"append","task":"t 1","device_bytes":512,"rows":[{"key":"k","slot":0,"offset":0}]}
{"op":"submit","tasks":["t 1"]}
{"op":"wait","task":"t 1","until":"written"}
{"op":"append","task":"t 1","device_bytes":512,"rows":[{"key":"k","slot":1,"offset":0}],"expect":"StagingAppendRefusedError"}
`
	var out bytes.Buffer
	sum, err := Run(context.Background(), strings.NewReader(script), &out, Options{})
	require.NoError(t, err, out.String())
	require.Empty(t, sum.Failed, out.String())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 9)
	require.Contains(t, lines[2], `a task name must not be empty`)
	require.Contains(t, lines[3], `longer than 256`)
	require.Contains(t, lines[8], `"message":"staging: task \"t 1\": append refused: the task is WRITTEN; open a fresh task"`)
	require.Contains(t, lines[8], `"task":"t 1"`)
}
