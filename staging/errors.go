package staging

import (
	"errors"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"
)

// Errors of the pipeline. Match them with errors.Is and errors.As.
var (
	// ErrClosed is returned by every call made after Close began.
	ErrClosed = errors.New("staging: pipeline is closed")
	// ErrConfig matches configuration errors: a bad Config, and a step
	// larger than a staging slot (*SlotOverflowError).
	ErrConfig = errors.New("staging: configuration error")
	// ErrNoSlot matches *SlotTimeoutError: no staging slot became free in
	// time.
	ErrNoSlot = errors.New("staging: no free staging slot")
	// ErrDropped matches *DropError: a try-reserve of the GPU-byte budget
	// failed at once.
	ErrDropped = errors.New("staging: save dropped")
	// ErrNoRow: the task has no such row (or a later task took it).
	ErrNoRow = errors.New("staging: no such row in the task")
	// ErrStepReleased: a chunk names a step whose slot was already
	// released.
	ErrStepReleased = errors.New("staging: step already released")
)

// IllegalTransitionError: a task was asked to move in a way its lifecycle
// does not allow (a skip, a step back, leaving a terminal state).
type IllegalTransitionError struct {
	Task     TaskID
	TaskName string // the task's TaskSpec.Name ("" when it has none)
	From, To TaskState
}

func (e *IllegalTransitionError) Error() string {
	return fmt.Sprintf("staging: %s: illegal transition %s -> %s", taskWords(e.Task, e.TaskName), e.From, e.To)
}

// AppendRefusedError: a chunk cannot be added to the task any more. State
// is the state that closed it (Copying or later), or the task's current
// state when Reassigned is true: the task already lost one of the chunk's
// rows to a later task. Open a fresh task for the chunk.
type AppendRefusedError struct {
	Task       TaskID
	TaskName   string // the task's TaskSpec.Name ("" when it has none)
	State      TaskState
	Reassigned bool
}

func (e *AppendRefusedError) Error() string {
	if e.Reassigned {
		return fmt.Sprintf("staging: %s: append refused: a later task took one of its rows; open a fresh task", taskWords(e.Task, e.TaskName))
	}
	return fmt.Sprintf("staging: %s: append refused: the task is %s; open a fresh task", taskWords(e.Task, e.TaskName), e.State)
}

// SlotOverflowError: a step is larger than a staging slot. This is a
// configuration error (SlotBytes too small for the workload); it matches
// ErrConfig.
type SlotOverflowError struct {
	StepBytes, SlotBytes int64
}

func (e *SlotOverflowError) Error() string {
	return fmt.Sprintf("staging: a step of %d bytes overflows a %d-byte staging slot (configuration error: raise SlotBytes)", e.StepBytes, e.SlotBytes)
}

// Is matches ErrConfig.
func (e *SlotOverflowError) Is(target error) bool { return target == ErrConfig }

// SlotTimeoutError: every staging slot stayed held for the whole claim
// timeout (0 or less: none was free at the call), or the free ones were not
// ready for the whole (positive) timeout (NotLanded: a free slot's buffer,
// of another size than the step, was still the target of its last step's
// copy, which had not landed). It matches ErrNoSlot.
type SlotTimeoutError struct {
	Slots     int
	Timeout   time.Duration
	NotLanded bool
}

func (e *SlotTimeoutError) Error() string {
	if e.NotLanded {
		return fmt.Sprintf("staging: no staging slot of %d was ready within %s: the free ones wait for their last step's copy to land", e.Slots, e.Timeout)
	}
	if e.Timeout <= 0 {
		return fmt.Sprintf("staging: all %d staging slots are held (claim timeout %s: no wait)", e.Slots, e.Timeout)
	}
	return fmt.Sprintf("staging: no staging slot of %d became free within %s", e.Slots, e.Timeout)
}

// Is matches ErrNoSlot.
func (e *SlotTimeoutError) Is(target error) bool { return target == ErrNoSlot }

// Drop reasons of a failed try-reserve (Stats.Drops is keyed by them).
const (
	// DropBudget: the clone does not fit in what is left of the
	// pipeline's GPU-byte budget (the runtime's ledger refused it for the
	// pipeline's cap, Config.CloneBudgetBytes).
	DropBudget = "gpu-budget"
	// DropLocation: the runtime's location refused the reservation (its
	// own budget, shared with resident values, is full).
	DropLocation = "location-budget"
)

// DropError: a save with NoWait found no room in the GPU-byte budget and
// was dropped at once. Nothing was reserved or allocated. It matches
// ErrDropped; Err is the runtime's refusal for DropLocation (for
// DropBudget, Reason and Requested say it all: the cap's figures are in
// the runtime's snapshot).
type DropError struct {
	Reason    string
	Requested int64
	Err       error
}

func (e *DropError) Error() string {
	msg := fmt.Sprintf("staging: save of %d clone bytes dropped (%s)", e.Requested, e.Reason)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is matches ErrDropped.
func (e *DropError) Is(target error) bool { return target == ErrDropped }

// Unwrap returns the runtime's refusal, if any.
func (e *DropError) Unwrap() error { return e.Err }

// FailedError is the failure record of the pipeline: the first task whose
// copy or pool write failed, and why. Once it is published every later
// entry of the pipeline returns it; errors.Unwrap gives the cause.
type FailedError struct {
	Task     TaskID
	TaskName string // the task's TaskSpec.Name ("" when it has none)
	Err      error
}

func (e *FailedError) Error() string {
	return fmt.Sprintf("staging: pipeline failed at %s: %v", taskWords(e.Task, e.TaskName), e.Err)
}

// Unwrap returns the cause.
func (e *FailedError) Unwrap() error { return e.Err }

// MaxTaskNameBytes bounds a TaskSpec.Name.
const MaxTaskNameBytes = 256

// TaskNameError: Open was given a TaskSpec.Name that is not valid UTF-8
// or is longer than MaxTaskNameBytes. No task was opened. It matches
// ErrConfig.
type TaskNameError struct {
	Name string
}

func (e *TaskNameError) Error() string {
	if len(e.Name) > MaxTaskNameBytes {
		return fmt.Sprintf("staging: a task name of %d bytes is longer than %d (configuration error)", len(e.Name), MaxTaskNameBytes)
	}
	return fmt.Sprintf("staging: task name %q is not valid UTF-8 (configuration error)", e.Name)
}

// Is matches ErrConfig.
func (e *TaskNameError) Is(target error) bool { return target == ErrConfig }

// checkTaskName returns a *TaskNameError for a name Open refuses.
func checkTaskName(name string) error {
	if len(name) > MaxTaskNameBytes || !utf8.ValidString(name) {
		return &TaskNameError{Name: name}
	}
	return nil
}

// taskWords is how the pipeline's messages name a task: by the name its
// caller gave it (`task "t1"`), else by its id (`task 3`).
func taskWords(id TaskID, name string) string {
	if name != "" {
		return "task " + strconv.Quote(name)
	}
	return "task " + strconv.FormatUint(uint64(id), 10)
}
