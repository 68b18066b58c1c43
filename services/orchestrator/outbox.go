package orchestrator

import (
	"context"
	"sync"
	"time"

	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
)

// Trace events are never dropped because evidence is down: a batch it did
// not take goes to the outbox in this service's own store, and every
// recovery pass delivers the outbox in order, deleting what evidence took.
// While the outbox holds events, new ones queue behind them. Delivery is
// at least once: a batch evidence took whose deletion failed is sent
// again. An event evidence refuses as invalid is dropped and logged, not
// retried (see deliverTraces): it would hold every later event back.

// outboxLease names the claim on delivering the outbox, so among replicas
// on one store one delivers at a time, in order.
const outboxLease = "trace-outbox"

// outboxPage bounds the entries read per delivery step.
const outboxPage = 256

// toOutbox keeps evs for later delivery; only a store that is down too
// loses them, which is logged.
func (s *Server) toOutbox(ctx context.Context, evs []*evidencev1.TraceEvent) {
	if err := s.st.PutTraceOutbox(ctx, evs); err != nil {
		s.log.ErrorContext(ctx, "trace events lost: neither evidence nor the outbox took them", "task", evs[0].GetTaskId(), "events", len(evs), "err", err)
		return
	}
	s.outboxPending.Store(true)
}

// queueBehindOutbox makes this replica's next trace deliveries wait behind
// the outbox when it holds events. A person's decision (approve, deny,
// settle) may act on a request another replica worked on until it
// stopped, leaving that work's events there: the decision's events must
// not reach evidence before them. Recovery needs none of this: its pass
// delivers the outbox before it takes a request over. Entries this
// replica's own calls deliver (or delivered, and are being deleted) are
// not what the decision must wait for.
func (s *Server) queueBehindOutbox(ctx context.Context) {
	if s.outboxPending.Load() {
		return
	}
	waiting, err := s.st.ListTraceOutbox(ctx, outboxPage)
	if err != nil {
		s.outboxPending.Store(true)
		return
	}
	for _, e := range waiting {
		if _, direct := s.direct.Load(e.Key); !direct {
			s.outboxPending.Store(true)
			return
		}
	}
}

// deliverOutbox sends the outbox to evidence, oldest first, until it is
// empty or evidence refuses again.
func (s *Server) deliverOutbox(ctx context.Context) {
	if s.deps.Evidence == nil {
		return
	}
	l, ok, err := s.own(ctx, outboxLease)
	if err != nil || !ok {
		return // another replica delivers, or the store is down
	}
	defer l.Release()
	for ctx.Err() == nil {
		entries, err := s.st.ListTraceOutbox(ctx, outboxPage)
		if err != nil {
			s.log.WarnContext(ctx, "read the trace outbox", "err", err)
			return
		}
		if len(entries) == 0 {
			s.outboxPending.Store(false)
			return
		}
		cut := false
		pending := entries[:0:0]
		for _, e := range entries {
			if s.sweep.holds(e.Key) {
				continue // delivered by its call, and about to be deleted
			}
			_, direct := s.direct.Load(e.Key)
			if direct || (e.Claimant != "" && e.Claimant != s.replica) {
				// A live call, of this replica or (while its claim
				// lasts) of another, delivers this one; the loop
				// resumes after it.
				cut = true
				break
			}
			pending = append(pending, e)
		}
		entries = pending
		if len(entries) == 0 {
			return
		}
		evs := make([]*evidencev1.TraceEvent, len(entries))
		for i, e := range entries {
			evs[i] = e.Event
		}
		sent, err := s.deliverTraces(ctx, evs, false)
		if err != nil {
			s.log.WarnContext(ctx, "deliver the trace outbox; tried again on the next pass", "waiting", len(entries)-sent, "err", err)
		}
		if err := s.deleteDelivered(ctx, entries, sent); err != nil {
			return
		}
		if sent < len(entries) || cut {
			return
		}
	}
}

// sweeper deletes the outbox entries calls delivered themselves, off the
// calls' path. A call hands its delivered entries over and returns; the
// next write this replica makes anyway (a request's next stage, another
// call's creation) deletes them in its own transaction (take, settle),
// and what no write took within a moment (pause), or at once when a
// batch is queued, is deleted in one store write for all of it (run).
// So deleting costs calls no store write of their own, whether they come
// together or one at a time (each made two), and the outbox stays as
// small as before.
// The entries stay this replica's (direct) until deleted, so no outbox
// loop sends them again: this replica's skips them as delivered (holds),
// and other replicas' leave them while the claim lasts, which the pause
// is well inside. A delete that fails or never runs (the process
// stopped) leaves them to be delivered again, under the same delivery
// ids, which evidence stores once: delivery stays at least once.
type sweeper struct {
	s       *Server
	pause   time.Duration
	full    chan struct{} // a batch is queued: sweep without waiting
	closing chan struct{} // closed by close: a sweep waits no more

	mu      sync.Mutex
	queued  []OutboxEntry       // handed over, not taken by a write or a sweep
	held    map[string]struct{} // keys handed over and not yet deleted
	running bool
	closed  bool
	done    sync.WaitGroup
}

// Bounds of the sweeper.
const (
	// sweepTimeout bounds one delete of delivered entries.
	sweepTimeout = 10 * time.Second
	// sweepPause is how long delivered entries wait for a write to take
	// their deletes before a sweep deletes them.
	sweepPause = 20 * time.Millisecond
	// sweepBatch bounds the deletes one write carries, and is how many
	// queued entries are worth a sweep at once.
	sweepBatch = 64
)

// newSweeper returns s's sweeper; claim is how long other replicas leave
// a call's delivered entries alone.
func newSweeper(s *Server, claim time.Duration) *sweeper {
	return &sweeper{s: s, pause: min(sweepPause, claim/4), full: make(chan struct{}, 1), closing: make(chan struct{}),
		held: map[string]struct{}{}}
}

// add hands delivered entries over for deletion.
func (w *sweeper) add(entries []OutboxEntry) {
	if len(entries) == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		// Shutting down: the entries are delivered again after restart.
		w.s.undirect(entries)
		return
	}
	for _, e := range entries {
		w.held[e.Key] = struct{}{}
	}
	w.queue(entries)
}

// queue queues entries for deletion and makes sure a sweep follows.
// Called with mu held.
func (w *sweeper) queue(entries []OutboxEntry) {
	w.queued = append(w.queued, entries...)
	if len(w.queued) >= sweepBatch {
		select {
		case w.full <- struct{}{}:
		default:
		}
	}
	if w.running {
		return
	}
	w.running = true
	w.done.Add(1)
	go w.run()
}

// take gives a write the deletes to carry: up to sweepBatch queued
// entries, which the write's caller settles.
func (w *sweeper) take() []OutboxEntry {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := min(len(w.queued), sweepBatch)
	if n == 0 {
		return nil
	}
	taken := w.queued[:n:n]
	w.queued = w.queued[n:]
	return taken
}

// settle ends the deletes a write carried: done when it committed, else
// they are queued again.
func (w *sweeper) settle(taken []OutboxEntry, deleted bool) {
	if len(taken) == 0 {
		return
	}
	w.mu.Lock()
	if !deleted && !w.closed {
		w.queue(taken)
		w.mu.Unlock()
		return
	}
	w.mu.Unlock()
	// Deleted, or closing: the entries are delivered again after restart.
	w.forget(taken)
}

// forget drops entries whose delete ran (or failed, and are left to the
// outbox loop).
func (w *sweeper) forget(entries []OutboxEntry) {
	w.mu.Lock()
	for _, e := range entries {
		delete(w.held, e.Key)
	}
	w.mu.Unlock()
	w.s.undirect(entries)
}

// holds reports whether the entry of key was delivered and awaits its
// delete.
func (w *sweeper) holds(key string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.held[key]
	return ok
}

// run deletes what no write took, a moment after it was queued, until
// nothing is queued.
func (w *sweeper) run() {
	defer w.done.Done()
	t := time.NewTimer(w.pause)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-w.full:
		case <-w.closing:
		}
		w.mu.Lock()
		batch := w.queued
		w.queued = nil
		if len(batch) == 0 {
			w.running = false
			w.mu.Unlock()
			return
		}
		w.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), sweepTimeout)
		_ = w.s.deleteDelivered(ctx, batch, len(batch))
		cancel()
		w.forget(batch)
		t.Reset(w.pause)
	}
}

// close waits for the deletes under way; later entries are left in the
// outbox.
func (w *sweeper) close() {
	w.mu.Lock()
	if !w.closed {
		w.closed = true
		close(w.closing)
	}
	w.mu.Unlock()
	w.done.Wait()
}
