package staging

// Stats is a snapshot of the pipeline's counters.
type Stats struct {
	Slots, FreeSlots, SlotHolders int
	SlotClaims, SlotWaits         int64 // claims, and claims that had to wait
	// CloneBytes is the GPU-byte budget in use by device clones, of
	// CloneBudgetBytes: the bytes of the clone reservations the runtime's
	// ledger granted the pipeline in its cap and that are not being given
	// back; PeakCloneBytes the most that clones held at once (a save
	// dropped or refused never counts). While only the pipeline reserves
	// in its cap's group they are the cap's UsedBytes in the runtime's
	// snapshot, once nothing is being granted or given back.
	CloneBytes, CloneBudgetBytes, PeakCloneBytes int64
	// Flushes counts deferred tasks escalated by budget pressure; Drops
	// counts try-reserves that failed at once, by reason (DropBudget,
	// DropLocation).
	Flushes int64
	Drops   map[string]int64
	// WaitingAppends counts blocking appends asleep in the GPU-byte budget:
	// waiting for clone bytes to come back, with no wake-up on its way.
	// WaitingStages counts stages asleep waiting for a slot (to be freed,
	// or ready) with nothing they wait for having happened yet.
	WaitingAppends, WaitingStages int
	// PendingFrees counts buffers (device clones, landing buffers) that
	// wait for a copy to finish before they are freed and their bytes
	// released: after a failure, the clones and landings of copies still
	// in flight.
	PendingFrees int
	// CloneCopies counts device clone copies enqueued and not done yet:
	// waiting for their freeze event (or for a clone enqueued before
	// them), or on their way.
	CloneCopies int
	// Tasks counts live tasks by state; Opened, Written and Failed count
	// every task so far.
	Tasks                   map[TaskState]int
	Opened, Written, Failed int64
	StepsStaged, LiveSteps  int64
	// CommittedBytes counts the bytes the committer wrote to the pool.
	CommittedBytes int64
	// Demotions counts the runtime's demotion copies the pipeline carried
	// out (DemotedBytes their bytes), DemotionFailures those that failed
	// or were given up before they ran (the runtime dropped the value),
	// DemotionsDeclined those it handed back to the runtime (closing or
	// failed pipeline); DemotionsQueued are waiting on the copy queue now.
	// See [DemotionServer].
	Demotions, DemotedBytes, DemotionFailures, DemotionsDeclined int64
	DemotionsQueued                                              int
	// Failure is the failure record (nil while healthy).
	Failure error
}

// Stats returns a snapshot of the pipeline's counters. It never blocks on
// the pipeline's work and works after Close.
func (p *Pipeline) Stats() Stats {
	ss, bs := p.slots.state(), p.budget.state()
	st := Stats{
		Slots: p.cfg.Slots, FreeSlots: ss.free, SlotHolders: ss.holders, SlotClaims: ss.claims, SlotWaits: ss.waits,
		CloneBytes: bs.used, CloneBudgetBytes: p.cfg.CloneBudgetBytes, PeakCloneBytes: bs.peak,
		Flushes: bs.flushes, Drops: bs.drops, WaitingAppends: bs.asleep, WaitingStages: ss.asleep,
		PendingFrees: int(p.pendingFrees.Load()), Tasks: map[TaskState]int{},
	}
	p.mu.Lock()
	p.cloning = pruneDone(p.cloning)
	for _, ev := range p.cloning {
		if !ev.Query() {
			st.CloneCopies++
		}
	}
	for _, t := range p.tasks {
		st.Tasks[t.State()]++
	}
	st.Opened, st.Written, st.Failed = p.counts.opened, p.counts.written, p.counts.failed
	st.StepsStaged, st.LiveSteps = p.counts.stepsStaged, int64(len(p.steps))
	st.CommittedBytes = p.counts.committedBytes
	dc := p.demo.counts
	st.Demotions, st.DemotedBytes, st.DemotionFailures, st.DemotionsDeclined = dc.done, dc.bytes, dc.failed, dc.declined
	st.DemotionsQueued = len(p.demo.queued)
	if p.failure != nil {
		st.Failure = p.failure
	}
	p.mu.Unlock()
	return st
}
