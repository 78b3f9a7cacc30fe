package actors

import (
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
)

// callerRunsMailbox is the supervisor's mailbox. Like protoactor's default
// mailbox on a synchronized dispatcher, the sender whose message finds the
// mailbox idle processes it, and whatever queues behind it, on its own
// goroutine, one message at a time (the ledger stays single-threaded);
// system messages go first; a suspended mailbox processes only system
// messages. What it changes is the cost per message on the lease hot
// path:
//
//   - The queue is a slice under a mutex, taken by the consumer a burst at
//     a time: one lock per message posted and one per burst, and no
//     allocation once the slices have grown (protoactor's unbounded queue
//     locks twice per message; its lock-free one allocates a node per
//     message).
//   - A lease caller answered while it was parked (its request carried a
//     ReplySink) is woken after the burst, once the mailbox is free
//     again, not from inside the serialized section: waking a goroutine
//     costs about as much as the ledger's work, and another sender can
//     run the mailbox on the other core meanwhile.
//   - A sender that served other senders' messages yields once when the
//     burst is over, so that the callers it answered (made runnable on its
//     processor) run now instead of after its time slice. A sender that
//     served only itself does not yield: a lone caller pays no scheduler
//     round trip.
//
// The right to run the mailbox (running) is also taken by direct calls:
// lease steps that their callers run on their own goroutines, without a
// message, and that wait for the run right on their contexts when it is
// taken (see direct.go and mailbox_lock.go). Whoever gives the run right
// back (release) first runs whatever was queued meanwhile, then wakes
// one waiting direct caller, or hands the run right straight to it while
// one starves.
type callerRunsMailbox struct {
	mu        sync.Mutex
	user      []any // queued user messages, oldest first
	system    []any // queued system messages
	userN     atomic.Int32
	systemN   atomic.Int32
	running   atomic.Bool
	suspended atomic.Bool

	invoker    actor.MessageInvoker
	dispatcher actor.Dispatcher
	processFn  func() // m.process, made once (a method value allocates)

	// Owned by the goroutine running the mailbox.
	batch []any // the user burst being processed; batch[next:] still to do
	next  int
	wakes []ReplySink // callers answered in this burst, still parked

	spareMu sync.Mutex
	spare   []ReplySink // an emptied wake list, for the next runner

	// Direct callers parked until the run right is given back (see
	// lock), oldest first; nwait counts them.
	waitMu   sync.Mutex
	waiters  []chan bool
	nwait    atomic.Int32
	woken    atomic.Bool // a woken caller has yet to try: wake no other
	starving atomic.Bool // a caller waited too long: hand the run right over
}

// callerRunsMailboxProducer makes the supervisor's mailbox (a protoactor
// MailboxProducer).
func callerRunsMailboxProducer() actor.Mailbox { return &callerRunsMailbox{} }

// throughput is how many messages a sender processes before it yields once
// in a long burst (protoactor's dispatcher throughput).
const throughput = 64

func (m *callerRunsMailbox) PostUserMessage(msg any) { m.post(&m.user, &m.userN, msg) }

func (m *callerRunsMailbox) PostSystemMessage(msg any) { m.post(&m.system, &m.systemN, msg) }

// post queues msg (counted in n) and runs the mailbox if it is idle.
func (m *callerRunsMailbox) post(queue *[]any, n *atomic.Int32, msg any) {
	m.mu.Lock()
	*queue = append(*queue, msg)
	m.mu.Unlock()
	n.Add(1)
	m.schedule()
}

func (m *callerRunsMailbox) RegisterHandlers(invoker actor.MessageInvoker, dispatcher actor.Dispatcher) {
	m.invoker, m.dispatcher = invoker, dispatcher
	m.processFn = m.process
}

func (m *callerRunsMailbox) Start() {}

func (m *callerRunsMailbox) UserMessageCount() int { return int(m.userN.Load()) }

func (m *callerRunsMailbox) schedule() {
	if m.running.CompareAndSwap(false, true) {
		m.dispatcher.Schedule(m.processFn)
	}
}

// process runs the mailbox until it is empty (or suspended with only user
// messages left, or a direct caller waits), then yields once if it served
// more than one message.
func (m *callerRunsMailbox) process() { m.release(m.run(runYielding)) }

// release ends a turn that has served served user messages: it wakes the
// callers answered meanwhile and gives the run right back, or hands it
// straight to a starving direct caller. Then, if a direct caller waits,
// it wakes one (that caller runs whatever is queued before its step);
// otherwise it takes the run right again for whatever was posted while
// it was being given back. It yields once if the turn served more than
// its own message (or, on one processor, left the run right to a woken
// direct caller).
func (m *callerRunsMailbox) release(served int) {
	for {
		wakes := m.takeWakes()
		if m.handOff() {
			m.wake(wakes)
			break
		}
		m.running.Store(false)
		// Wake the callers answered in this burst now that the mailbox is
		// free: another sender can run it meanwhile.
		m.wake(wakes)
		if m.nwait.Load() > 0 {
			if m.wakeWaiter() {
				if !multiProcessor() {
					// The woken caller would otherwise wait for this
					// goroutine's time slice to end, while it takes the
					// run right again and again.
					served = 2
				}
				break
			}
			if m.woken.Load() {
				break // a woken caller is about to try: it goes next
			}
		}
		// A message posted after run found the queues empty, but before
		// running was cleared, scheduled nothing: look again.
		if !m.idle() && m.running.CompareAndSwap(false, true) {
			served += m.run(runYielding)
			continue
		}
		break
	}
	if served > 1 {
		runtime.Gosched()
	}
}

// idle reports whether no message is queued for the run right's holder (a
// suspended mailbox holds its user messages).
func (m *callerRunsMailbox) idle() bool {
	return m.systemN.Load() == 0 && (m.suspended.Load() || m.userN.Load() == 0)
}

// deferWake records a caller answered while it was parked: it is woken
// once the burst is over (process), outside the serialized section.
// Called by the supervisor, on the running goroutine.
func (m *callerRunsMailbox) deferWake(r ReplySink) {
	m.wakes = append(m.wakes, r)
}

// takeWakes hands the burst's wake list to its runner (still running) and
// gives the mailbox an empty one.
func (m *callerRunsMailbox) takeWakes() []ReplySink {
	w := m.wakes
	if len(w) == 0 {
		return nil
	}
	m.spareMu.Lock()
	m.wakes, m.spare = m.spare, nil
	m.spareMu.Unlock()
	return w
}

// wake wakes the callers in w and keeps w's array for a later burst.
func (m *callerRunsMailbox) wake(w []ReplySink) {
	if len(w) == 0 {
		return
	}
	for i, r := range w {
		r.Wake()
		w[i] = nil
	}
	m.spareMu.Lock()
	if m.spare == nil {
		m.spare = w[:0]
	}
	m.spareMu.Unlock()
}

// How far run goes (system messages always run first).
type runMode uint8

const (
	// runYielding: until the queue is empty, but it stops between bursts
	// while a direct caller waits for the run right: that caller goes next
	// (it runs what is queued before its step), so a stream of later
	// messages cannot keep it waiting.
	runYielding runMode = iota
	// runOneBurst: the user messages queued now, and none posted later (a
	// direct call's messages queued before its step).
	runOneBurst
)

// run processes messages as far as mode says (or until the mailbox is
// suspended) and returns how many user messages it invoked. A panic
// escalates like protoactor's mailbox does; the rest of the burst stays
// queued, in order.
func (m *callerRunsMailbox) run(mode runMode) (served int) {
	var msg any
	bursts := 0
	defer func() {
		if r := recover(); r != nil {
			m.requeue()
			m.invoker.EscalateFailure(r, msg)
		}
	}()
	for {
		if served > 0 && served%throughput == 0 {
			runtime.Gosched()
		}
		if m.systemN.Load() > 0 {
			msg = m.popSystem()
			m.systemN.Add(-1)
			switch msg.(type) {
			case *actor.SuspendMailbox:
				m.suspended.Store(true)
			case *actor.ResumeMailbox:
				m.suspended.Store(false)
			default:
				m.invoker.InvokeSystemMessage(msg)
			}
			continue
		}
		if m.suspended.Load() {
			m.requeue()
			return served
		}
		if m.next == len(m.batch) {
			switch {
			case mode == runOneBurst && bursts > 0,
				mode == runYielding && m.nwait.Load() > 0,
				!m.takeBurst():
				return served
			}
			bursts++
		}
		msg = m.batch[m.next]
		m.batch[m.next] = nil
		m.next++
		m.userN.Add(-1)
		served++
		m.invoker.InvokeUserMessage(msg)
	}
}

// popSystem takes the oldest system message (systemN > 0).
func (m *callerRunsMailbox) popSystem() any {
	m.mu.Lock()
	msg := m.system[0]
	m.system[0] = nil
	m.system = m.system[1:]
	if len(m.system) == 0 {
		m.system = m.system[:0:0]
	}
	m.mu.Unlock()
	return msg
}

// takeBurst moves every queued user message into the batch (whose backing
// array, emptied, becomes the queue's): one lock for the whole burst.
func (m *callerRunsMailbox) takeBurst() bool {
	if m.userN.Load() == 0 {
		return false
	}
	m.mu.Lock()
	if len(m.user) == 0 {
		m.mu.Unlock()
		return false
	}
	m.batch, m.user = m.user, m.batch[:0]
	m.mu.Unlock()
	m.next = 0
	return true
}

// requeue puts the unprocessed rest of the batch back at the head of the
// queue (suspended, or a panic), keeping the order.
func (m *callerRunsMailbox) requeue() {
	rest := m.batch[m.next:]
	if len(rest) == 0 {
		return
	}
	m.mu.Lock()
	m.user = append(append(make([]any, 0, len(rest)+len(m.user)), rest...), m.user...)
	m.mu.Unlock()
	clear(rest)
	m.batch, m.next = m.batch[:0], 0
}

var _ actor.Mailbox = (*callerRunsMailbox)(nil)
