package staging

import "fmt"

// The plain data of the pipeline: task identity, the task lifecycle and
// its legal moves, join modes, rows and copy priorities. (The jobs its
// actors exchange carry device buffers and events and never leave the
// process: see copyqueue.go and task_actor.go.)

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
	// Pending: registered, not on a copy queue (a JOIN_ON_FINISH task
	// waits here for finish or for budget pressure).
	Pending TaskState = iota
	// Queued: on a copy queue.
	Queued
	// Copying: the copy queue owns the copy stage (waiting for the step's
	// device→host copy, or copying the device clone to host).
	Copying
	// HostReady: the task's rows are in host memory; its device
	// clone, if any, is dropped.
	HostReady
	// Written: the rows are in the CPU block pool.
	Written
	// Failed: the pipeline could not finish the task.
	Failed
)

var taskStateNames = [...]string{"PENDING", "QUEUED", "COPYING", "HOST_READY", "WRITTEN", "FAILED"}

func (s TaskState) String() string {
	if s >= 0 && int(s) < len(taskStateNames) {
		return taskStateNames[s]
	}
	return fmt.Sprintf("TaskState(%d)", int32(s))
}

// Terminal reports whether s is Written or Failed.
func (s TaskState) Terminal() bool { return s == Written || s == Failed }

// CanTransition reports whether a task may move from one state to another:
// to the next state of the chain, or to Failed from a non-terminal state.
// Everything else (a skip, a step back, staying put, leaving a terminal
// state) is illegal.
func CanTransition(from, to TaskState) bool {
	if from.Terminal() || from < Pending || to < Pending || to > Failed {
		return false
	}
	if to == Failed {
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

// Row is one row a write task puts in the CPU block pool: the row of pool
// slot Slot for Key, found at byte Offset of the save's buffer (the
// staging slot for JoinNextStep, the device clone for JoinOnFinish). Every
// row is Config.RowBytes long.
type Row struct {
	Key    string
	Slot   int
	Offset int64
}

// Copy priorities of the copy queue (its priority mailbox serves 0–7,
// highest first, first in first out within a level).
const (
	// prioLow: a task submitted in the normal course.
	prioLow int8 = 2
	// prioHigh: a task flushed by GPU-byte budget pressure.
	prioHigh int8 = 5
	// prioFront: a task named by Prioritize; served before every other
	// queued task.
	prioFront int8 = 7
)
