package messages

import "fmt"

// ---- the write pipeline (package staging) --------------------------------
//
// The plain data of the device→host write pipeline: task identity, the
// task lifecycle and its legal moves, join modes, rows and copy
// priorities. The messages the pipeline's actors exchange carry device
// buffers, events and reply channels and never leave the process, so they
// are unexported types of package actors; only these data types are shared.

// TaskID identifies one write task within its pipeline (never reused).
type TaskID uint64

// TaskState is where a write task is in its lifecycle. The chain is strict:
//
//	Pending → Queued → Copying → HostReady → Written
//
// plus Failed from any state that is not terminal. Written and Failed are
// terminal. See [CanTransition].
type TaskState int32

// The states of a write task.
const (
	// TaskPending: registered, not on a copy queue (a JOIN_ON_FINISH task
	// waits here for finish or for budget pressure).
	TaskPending TaskState = iota
	// TaskQueued: on a copy queue.
	TaskQueued
	// TaskCopying: one worker owns the copy stage (waiting for the step's
	// device→host copy, or copying the device clone to host).
	TaskCopying
	// TaskHostReady: the task's rows are in host memory; its device
	// clone, if any, is dropped.
	TaskHostReady
	// TaskWritten: the rows are in the CPU block pool.
	TaskWritten
	// TaskFailed: the pipeline could not finish the task.
	TaskFailed
)

var taskStateNames = [...]string{"PENDING", "QUEUED", "COPYING", "HOST_READY", "WRITTEN", "FAILED"}

func (s TaskState) String() string {
	if s >= 0 && int(s) < len(taskStateNames) {
		return taskStateNames[s]
	}
	return fmt.Sprintf("TaskState(%d)", int32(s))
}

// Terminal reports whether s is Written or Failed.
func (s TaskState) Terminal() bool { return s == TaskWritten || s == TaskFailed }

// CanTransition reports whether a task may move from one state to another:
// to the next state of the chain, or to Failed from a non-terminal state.
// Everything else (a skip, a step back, staying put, leaving a terminal
// state) is illegal.
func CanTransition(from, to TaskState) bool {
	if from.Terminal() || from < TaskPending || to < TaskPending || to > TaskFailed {
		return false
	}
	if to == TaskFailed {
		return true
	}
	return to == from+1
}

// JoinMode says how a write reaches host memory.
type JoinMode int

const (
	// JoinNextStep: at save, one whole-step device→host copy lands in a
	// pinned staging slot (ordered after the step's freeze event); the
	// task's rows are ranges of that slot. The task is queued at submit.
	JoinNextStep JoinMode = iota
	// JoinOnFinish: at save, the step's rows are cloned on the device
	// (charged to the GPU-byte budget); the task stays pending until it is
	// submitted (the request finished or was aborted) or budget pressure
	// flushes it; the copy stage then copies the clone to host.
	JoinOnFinish
)

func (m JoinMode) String() string {
	switch m {
	case JoinNextStep:
		return "JOIN_NEXT_STEP"
	case JoinOnFinish:
		return "JOIN_ON_FINISH"
	}
	return fmt.Sprintf("JoinMode(%d)", int(m))
}

// StagingRow is one row a write task puts in the CPU block pool: the row of
// pool slot Slot for Key, found at byte Offset of the save's buffer (the
// staging slot for JoinNextStep, the device clone for JoinOnFinish). Every
// row has the pool's row size.
type StagingRow struct {
	Key    string
	Slot   int
	Offset int64
}

// Copy priorities of the pipeline's priority mailboxes (protoactor serves
// 0–7, highest first, FIFO within a level).
const (
	// PriorityLow: a task submitted in the normal course.
	PriorityLow int8 = 2
	// PriorityHigh: a task flushed by GPU-byte budget pressure.
	PriorityHigh int8 = 5
	// PriorityFront: a task named by Prioritize; served before every
	// other queued task.
	PriorityFront int8 = 7
)
