package staging

import "sync"

// A job queue with one long-lived worker goroutine: the copy queue and the
// committer. Jobs are served highest priority first (0–7), first in first
// out within a priority; the committer's jobs all have one priority, so it
// serves them in the order they came. A push never blocks. (These were
// protoactor actors; a mailbox starts a goroutine whenever it goes from
// idle to busy, and each grew its stack through the pipeline's call chain
// again: a long-lived worker pays neither.)

// job is what a jobQueue serves, held by value (no allocation per job):
// for the copy queue a task's copy stage (t) or a demotion's copy
// (demote), for the committer a task's pool write (t and chunks).
type job struct {
	t      *taskRef
	chunks []*taskChunk // committer: the task's chunks, frozen since its claim
	demote *demoteJob
	// prio (0–7): the copy queue's priority (prioDemote, prioLow,
	// prioHigh, prioFront); the committer's jobs are all 0. Duplicates (a
	// task re-queued at a higher priority) are harmless: only the first
	// job to claim the task runs it.
	prio int8
}

// jobLevels is the number of priorities (0–7).
const jobLevels = 8

type jobQueue struct {
	serve func(job)

	mu     sync.Mutex
	levels [jobLevels]jobFIFO
	queued int
	closed bool

	wake chan struct{} // one token: there may be jobs
	quit chan struct{} // closed by stop
	done chan struct{} // closed when the worker has returned
}

// jobFIFO is one priority's jobs, first in first out. Its backing array
// is reused once it empties.
type jobFIFO struct {
	jobs []job
	head int
}

func startJobQueue(serve func(job)) *jobQueue {
	q := &jobQueue{serve: serve, wake: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
	go q.run()
	return q
}

// push queues j (dropped once the queue is stopped).
func (q *jobQueue) push(j job) {
	prio := min(max(int(j.prio), 0), jobLevels-1)
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return
	}
	f := &q.levels[prio]
	f.jobs = append(f.jobs, j)
	q.queued++
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default: // a wake is pending already
	}
}

// pop takes the first job of the highest priority that has one.
func (q *jobQueue) pop() (job, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.queued == 0 || q.closed {
		return job{}, false
	}
	for i := jobLevels - 1; i >= 0; i-- {
		f := &q.levels[i]
		if f.head == len(f.jobs) {
			continue
		}
		j := f.jobs[f.head]
		f.jobs[f.head] = job{}
		f.head++
		if f.head == len(f.jobs) {
			f.jobs, f.head = f.jobs[:0], 0
		}
		q.queued--
		return j, true
	}
	return job{}, false
}

func (q *jobQueue) run() {
	defer close(q.done)
	for {
		if j, ok := q.pop(); ok {
			q.serve(j)
			continue
		}
		select {
		case <-q.wake:
		case <-q.quit:
			return
		}
	}
}

// stop ends the worker once the job it is serving (if any) is done; the
// jobs still queued are dropped. Idempotent.
func (q *jobQueue) stop() {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		<-q.done
		return
	}
	q.closed = true
	q.levels = [jobLevels]jobFIFO{}
	q.queued = 0
	q.mu.Unlock()
	close(q.quit)
	<-q.done
}
