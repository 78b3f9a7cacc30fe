package replay

import (
	"github.com/residency-go/residency/staging"
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
	Step  *StagedStep   `json:"step,omitempty"`
	Row   *Row          `json:"row,omitempty"`
	State *string       `json:"state,omitempty"`
	Stats *StagingStats `json:"stats,omitempty"`
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

type StagingStats struct {
	Slots            int     `json:"slots"`
	FreeSlots        int     `json:"free_slots"`
	SlotHolders      int     `json:"slot_holders"`
	SlotClaims       int64   `json:"slot_claims"`
	SlotWaits        int64   `json:"slot_waits"`
	CloneBytes       int64   `json:"clone_bytes"`
	CloneBudgetBytes int64   `json:"clone_budget_bytes"`
	PeakCloneBytes   int64   `json:"peak_clone_bytes"`
	Flushes          int64   `json:"flushes"`
	Drops            Object  `json:"drops"`
	Tasks            Object  `json:"tasks"`
	Opened           int64   `json:"opened"`
	Written          int64   `json:"written"`
	Failed           int64   `json:"failed"`
	StepsStaged      int64   `json:"steps_staged"`
	LiveSteps        int64   `json:"live_steps"`
	CommittedBytes   int64   `json:"committed_bytes"`
	Failure          *string `json:"failure"`
}

func (r *Runner) toStagingStats(st staging.Stats) *StagingStats {
	out := &StagingStats{
		Slots: st.Slots, FreeSlots: st.FreeSlots, SlotHolders: st.SlotHolders, SlotClaims: st.SlotClaims, SlotWaits: st.SlotWaits,
		CloneBytes: st.CloneBytes, CloneBudgetBytes: st.CloneBudgetBytes, PeakCloneBytes: st.PeakCloneBytes,
		Flushes: st.Flushes,
		Drops:   Object{{staging.DropBudget, st.Drops[staging.DropBudget]}, {staging.DropLocation, st.Drops[staging.DropLocation]}},
		Opened:  st.Opened, Written: st.Written, Failed: st.Failed, StepsStaged: st.StepsStaged, LiveSteps: st.LiveSteps,
		CommittedBytes: st.CommittedBytes,
	}
	for _, s := range []staging.TaskState{staging.Pending, staging.Queued, staging.Copying, staging.HostReady} {
		out.Tasks = append(out.Tasks, Field{s.String(), st.Tasks[s]})
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
		return Object{{"type", typ}, {"message", err.Error()}}
	}
	switch x := e.(type) {
	case *staging.FailedError:
		return []Field{{"task", taskField(x.Task, x.TaskName)}, {"cause", cause(x.Err)}}
	case *staging.DropError:
		return []Field{{"reason", x.Reason}, {"requested_bytes", x.Requested}, {"cause", cause(x.Err)}}
	case *staging.AppendRefusedError:
		return []Field{{"task", taskField(x.Task, x.TaskName)}, {"state", x.State.String()}, {"reassigned", x.Reassigned}}
	case *staging.SlotTimeoutError:
		return []Field{{"slots", x.Slots}, {"timeout_ms", x.Timeout.Milliseconds()}}
	case *staging.SlotOverflowError:
		return []Field{{"step_bytes", x.StepBytes}, {"slot_bytes", x.SlotBytes}}
	}
	return nil
}
