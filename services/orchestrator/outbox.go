package orchestrator

import (
	"context"

	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	"github.com/v0m3/v0m3/services/orchestrator/outbox"
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
const outboxLease = outbox.Lease

// outboxPage bounds the entries read per delivery step.
const outboxPage = outbox.Page

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
			if s.sweep.Holds(e.Key) {
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
