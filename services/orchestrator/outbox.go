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
	defer l.release()
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
		for i, e := range entries {
			_, direct := s.direct.Load(e.Key)
			if direct || (e.Claimant != "" && e.Claimant != s.replica) {
				// A live call, of this replica or (while its claim
				// lasts) of another, delivers this one; the loop
				// resumes after it.
				entries, cut = entries[:i], true
				break
			}
		}
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
// calls' path: a call hands its delivered entries over and returns, and
// one delete takes every entry handed over meanwhile, so concurrent calls
// share it (one store write for many calls, where each call made two).
// The entries stay this replica's (direct) until deleted, so its outbox
// loop does not send them again. A delete that fails or never runs (the
// process stopped) leaves them to be delivered again, under the same
// delivery ids, which evidence stores once: delivery stays at least once.
type sweeper struct {
	s *Server

	mu      sync.Mutex
	queued  []OutboxEntry
	running bool
	closed  bool
	done    sync.WaitGroup
}

// sweepTimeout bounds one delete of delivered entries.
const sweepTimeout = 10 * time.Second

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
	w.queued = append(w.queued, entries...)
	if w.running {
		return
	}
	w.running = true
	w.done.Add(1)
	go w.run()
}

// run deletes what is queued until nothing is.
func (w *sweeper) run() {
	defer w.done.Done()
	for {
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
		w.s.undirect(batch)
	}
}

// close waits for the deletes under way; later entries are left in the
// outbox.
func (w *sweeper) close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	w.done.Wait()
}
