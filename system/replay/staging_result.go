package replay

import (
	"github.com/residency-go/residency/staging"
	"github.com/residency-go/residency/system/wire"
)

// The staging ops' results and errors, in the script's words.

type TaskTransition struct {
	Pipeline string  `json:"pipeline"`
	Task     string  `json:"task"`
	From     *string `json:"from"`
	To       string  `json:"to"`
	Cause    string  `json:"cause,omitempty"`
}

// Staging is the payload of a staging op's result.
type Staging struct {
	Step  *StagedStep        `json:"step,omitempty"`
	Row   *Row               `json:"row,omitempty"`
	State *string            `json:"state,omitempty"`
	Stats *wire.StagingStats `json:"stats,omitempty"`
}

type StagedStep struct {
	Name  string `json:"name"`
	Slot  int    `json:"slot"`
	Bytes int64  `json:"bytes"`
}

// Row is a row read back: its length, and its byte value when every
// byte is the same (rows are filled that way), else null.
type Row struct {
	Key   string `json:"key"`
	Slot  int64  `json:"slot"`
	Bytes int    `json:"bytes"`
	Value *int   `json:"value"`
}

func (r *Runner) toStagingStats(st staging.Stats) *wire.StagingStats {
	out := &wire.StagingStats{
		Slots: st.Slots, FreeSlots: st.FreeSlots, SlotHolders: st.SlotHolders, SlotClaims: st.SlotClaims, SlotWaits: st.SlotWaits,
		CloneBytes: st.CloneBytes, CloneBudgetBytes: st.CloneBudgetBytes, PeakCloneBytes: st.PeakCloneBytes,
		Flushes: st.Flushes,
		Drops:   Object{{Key: staging.DropBudget, Value: st.Drops[staging.DropBudget]}, {Key: staging.DropLocation, Value: st.Drops[staging.DropLocation]}},
		Opened:  st.Opened, Written: st.Written, Failed: st.Failed, StepsStaged: st.StepsStaged, LiveSteps: st.LiveSteps,
		CommittedBytes: st.CommittedBytes,
	}
	for _, s := range []staging.TaskState{staging.Pending, staging.Queued, staging.Copying, staging.HostReady} {
		out.Tasks = append(out.Tasks, Field{Key: s.String(), Value: st.Tasks[s]})
	}
	if st.Failure != nil {
		out.Failure = nullable(st.Failure.Error())
	}
	return out
}

// stepFill writes the deterministic content of a save's device buffer:
// row k (bytes k·rowBytes onward) holds the byte fill+k (mod 256).
func stepFill(n, rowBytes, fill int64) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(fill + int64(i)/rowBytes)
	}
	return b
}

func toRow(key string, slot int64, b []byte) *Row {
	out := &Row{Key: key, Slot: slot, Bytes: len(b)}
	if len(b) > 0 {
		v := int(b[0])
		for _, c := range b {
			if int(c) != v {
				return out
			}
		}
		out.Value = &v
	}
	return out
}

// taskField is a staging error's task in the script's words: the name the
// script gave it (the replay opens every task with its script name), else
// its id.
func taskField(id staging.TaskID, name string) any {
	if name != "" {
		return name
	}
	return uint64(id)
}

// classifyStaging names the pipeline's error types (see classify).
func classifyStaging(e error) (string, bool) {
	switch e.(type) {
	case *staging.TaskNameError:
		return "StagingConfigError", true
	case *staging.FailedError:
		return "StagingFailedError", true
	case *staging.DropError:
		return "StagingDropError", true
	case *staging.AppendRefusedError:
		return "StagingAppendRefusedError", true
	case *staging.SlotTimeoutError:
		return "StagingSlotTimeoutError", true
	case *staging.SlotOverflowError:
		return "StagingSlotOverflowError", true
	}
	switch e {
	case staging.ErrConfig:
		return "StagingConfigError", true
	case staging.ErrClosed:
		return "StagingClosedError", true
	case staging.ErrNoRow:
		return "StagingNoRowError", true
	case staging.ErrStepReleased:
		return "StagingStepReleasedError", true
	}
	return "", false
}

// stagingErrorFields are the JSON fields of the pipeline's errors.
func (r *Runner) stagingErrorFields(e error) []Field {
	cause := func(err error) any {
		if err == nil {
			return nil
		}
		typ, _ := classify(err)
		return Object{{Key: "type", Value: typ}, {Key: "message", Value: err.Error()}}
	}
	switch x := e.(type) {
	case *staging.FailedError:
		return []Field{{Key: "task", Value: taskField(x.Task, x.TaskName)}, {Key: "cause", Value: cause(x.Err)}}
	case *staging.DropError:
		return []Field{{Key: "reason", Value: x.Reason}, {Key: "requested_bytes", Value: x.Requested}, {Key: "cause", Value: cause(x.Err)}}
	case *staging.AppendRefusedError:
		return []Field{{Key: "task", Value: taskField(x.Task, x.TaskName)}, {Key: "state", Value: x.State.String()}, {Key: "reassigned", Value: x.Reassigned}}
	case *staging.SlotTimeoutError:
		return []Field{{Key: "slots", Value: x.Slots}, {Key: "timeout_ms", Value: x.Timeout.Milliseconds()}}
	case *staging.SlotOverflowError:
		return []Field{{Key: "step_bytes", Value: x.StepBytes}, {Key: "slot_bytes", Value: x.SlotBytes}}
	}
	return nil
}
