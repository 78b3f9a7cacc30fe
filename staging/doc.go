// Package staging is the device→host write pipeline of a KV-cache offload:
// rows a model computes on a device are copied to host memory and written
// into a CPU block pool, asynchronously, under the runtime's byte budgets.
//
// # Pieces
//
//   - Staging slots: a fixed number of pinned landing zones of SlotBytes
//     each (reserved at the pinned location for the pipeline's life). A
//     save claims one for its step and launches ONE device→host copy of the
//     whole step into it. A slot has several holders: the step (until
//     [Step.Release], i.e. the step was materialized or discarded) and each
//     task bound to it (until that task's pool write). It is free, and
//     reused, only when every holder let go. A claim waits up to
//     Config.ClaimTimeout (0 or less: not at all); a step larger than a slot
//     is a configuration error ([*SlotOverflowError]); a leftover-only save
//     (no device buffer) still takes a slot. A step of another size than
//     the slot's last one reallocates the slot's buffer, after waiting for
//     that last copy to land.
//   - Write tasks ([Task]): one write of (key, slot) rows for one request,
//     identified by its id, request id and the how-many-th write of that
//     request; several keys per task. Each task is a protoactor actor, a
//     child of the pipeline's actor named after the task ("task-<id>"),
//     spawned by Open and stopped once the task is terminal; the actor
//     alone owns the task's state machine and chunks, and every move is a
//     message to it:
//     Pending → Queued → Copying → HostReady → Written, or Failed from any
//     state that is not terminal; its Receive refuses everything else
//     ([*IllegalTransitionError]). Readers ask the actor, or read the
//     state it publishes on the task's handle after each move;
//     [Task.WaitHostReady] and [Task.Wait] return only when those
//     transitions happen.
//   - Two join modes. JoinNextStep: the rows are ranges of the step's slot;
//     the task is queued at Submit and its copy stage waits for the step's
//     copy. JoinOnFinish: the rows are cloned on the device at Append
//     (ordered after the freeze event), the clone is charged to the GPU-byte
//     budget, the task stays Pending until Submit (its request finished or
//     was aborted) or until budget pressure flushes it; its copy stage then
//     copies each clone to a pinned landing buffer, on a stream of its own,
//     and drops the clones. A copy stage waits for all its copies, even
//     after one failed, then reports the first failure in chunk order.
//   - The GPU-byte budget: every clone is a named reservation on the
//     runtime's device location, so clones share that location's budget with
//     resident values and appear in its snapshot, made in the group of the
//     pipeline's cap (Config.CloneBudgetBytes), "<Name>/clones", in the
//     runtime's ledger (Runtime.ReserveCapped): the ledger alone admits a
//     clone, within the cap and the location's budget, and its refusal
//     names which and by how much. A reserve the cap refuses flushes
//     deferred tasks, oldest enqueue time first, just enough that the
//     clones already on their way out (of tasks queued, flushed or
//     submitted) cover the shortfall the refusal names (and what the
//     reserves queued before it wait for), and waits for their release (a
//     task's clones come back together; waiting reserves are served first
//     in first out; a release wakes only those its bytes satisfy, or the
//     first in line); when the device location refuses instead, it flushes
//     one task at a time, and sleeps until the pipeline's own clone bytes
//     come back. It returns the location's refusal only when nothing of the
//     pipeline's holds bytes there, is on its way out or could be flushed,
//     and none of its bytes came back after the runtime answered (those the
//     refusal may have counted: it asks again). The flushes thus depend on
//     the tasks and their sizes, not on timing; a flush that takes the
//     appending task itself refuses the append (state QUEUED). Waiting
//     reserves are woken when a task that released clones ends, so one that
//     waited for a task it flushed sees that task's outcome. A try-reserve (Chunk.NoWait) fails
//     at once with a [*DropError], counted by reason in [Stats].
//   - A copy queue and a single committer, each an actor on protoactor's
//     priority mailbox, each run by a goroutine of its own for the
//     pipeline's life: the copy queue serves the highest priority first
//     (front, then high, then low, then the runtime's demotions) and runs
//     copy stages; the committer's jobs all have one priority, so it takes
//     them in the order they come and writes the pool in the order the
//     copy stages finished, scattering host rows into the CPU block pool,
//     a buffer at the host location written in place through its host
//     view (cuda.HostMemory).
//     [Pipeline.Prioritize] moves pending or low-priority tasks to the
//     front and leaves alone a task queued high (a budget flush) or
//     already at the front; a task re-queued at a higher priority leaves a
//     duplicate behind that loses its claim (only one claim can move a
//     task from Queued to Copying), so it is harmless.
//   - Reassigned rows: a later append that writes the same (key, slot)
//     takes it; the older task's pool write skips it (the pool write reads
//     who owns each row under the pool's lock, so the newest append wins in
//     whatever order the two are written), the older task refuses chunks
//     for it ([*AppendRefusedError] with Reassigned) and reads it as
//     ErrNoRow. A row written twice by one task keeps the later entry. A
//     task also refuses chunks once its copy stage is claimed. A refused
//     append takes nothing: it is refused before any slot hold, budget byte
//     or copy is taken for it (a device clone's copy starts only once the
//     task has accepted the chunk).
//
// # Failure
//
// A failed copy or pool write marks its task Failed; the pipeline's failure
// record ([*FailedError]) is published before any waiter wakes; the task's
// budget tickets, slot holds and buffers are released; every pending task
// fails with the record; and every later entry of the pipeline (Stage,
// Open, Append, Submit, Prioritize, reads) returns it. Tasks already queued
// finish on their own. Open a new pipeline to go on.
//
// # Eager mode
//
// With Config.Eager there are no copy streams, no copy queue and no
// committer: Stage and Append copy synchronously after waiting for the
// freeze event, and Submit runs the copy stage and the pool write inline.
// For CPU-only tests and tools.
//
// # Reads
//
// [Task.ReadRow] returns ErrNoRow for a row the task does not have (no
// chunk of it wrote the row, or a later task took it before its pool
// write). A JOIN_ON_FINISH task that is not written yet reads the landed
// host rows, or the device clone while its copy to host has not landed; a
// written task, and a JOIN_NEXT_STEP task (after waiting for its pool
// write), are read from the pool. [Pipeline.ReadPool] reads the pool.
//
// # Runtime
//
// [New] takes a [Runtime]: the backend and named reservations of a running
// residency runtime (*system.System satisfies it). It checks the Config's
// sizes ([MaxSlots], [MaxPoolRows], no 64-bit overflow) and reserves the
// slots and the pool before it allocates anything for them. The pipeline
// uses the runtime's backend for its streams, events and copies; every
// buffer it allocates or frees (device clones, landing buffers, slot
// buffers, the CPU block pool) goes through the actor of its location: the runtime's when the
// runtime is a [LocationAllocator] (*system.System is), else a location
// actor of the pipeline's own. On the soft backend (a simulation in Go
// memory) every byte is real. Every
// blocking call takes a context. [Pipeline.Close] drains: it writes every
// task that has not failed, frees every buffer and releases every
// reservation.
//
// # Demotions
//
// When the Runtime is also a [DemotionServer] (*system.System is) and the
// pipeline is not eager, the runtime's demotions from Device to Pinned
// (spill: docs/semantics.md) are copied by the pipeline's copy queue at
// the lowest priority, below every write task, on its landing stream. The
// runtime's ledger has charged them as moves; the pipeline only copies.
// A failing or closing pipeline hands them back to the runtime, which
// copies itself. See Stats (Demotions and its siblings) and
// Config.OnDemotion.
package staging
