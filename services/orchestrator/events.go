package orchestrator

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/authz"
	"github.com/v0m3/v0m3/internal/ids"
	"github.com/v0m3/v0m3/internal/telemetry"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	ostore "github.com/v0m3/v0m3/services/orchestrator/store"
)

// notifier wakes WatchTask streams when a task gets a new event. It only
// signals; the events themselves are read from the store, so a watcher that
// misses a signal still sees every event on its next read.
type notifier struct {
	mu   sync.Mutex
	subs map[string]map[chan struct{}]struct{}
}

func newNotifier() *notifier { return &notifier{subs: map[string]map[chan struct{}]struct{}{}} }

func (n *notifier) subscribe(taskID string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	n.mu.Lock()
	if n.subs[taskID] == nil {
		n.subs[taskID] = map[chan struct{}]struct{}{}
	}
	n.subs[taskID][ch] = struct{}{}
	n.mu.Unlock()
	return ch, func() {
		n.mu.Lock()
		delete(n.subs[taskID], ch)
		if len(n.subs[taskID]) == 0 {
			delete(n.subs, taskID)
		}
		n.mu.Unlock()
	}
}

func (n *notifier) notify(taskID string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for ch := range n.subs[taskID] {
		select {
		case ch <- struct{}{}:
		default: // a wake-up is already pending
		}
	}
}

// followEvents wakes this server's watchers of tasks whose events any
// replica stored, until Close; a broken subscription is made again.
func (s *Server) followEvents(ctx context.Context, f ostore.EventFollower) {
	backoff := watchBackoffMin
	for {
		ch, err := f.FollowEvents(ctx)
		if err == nil {
			backoff = watchBackoffMin
			for taskID := range ch {
				s.notes.notify(taskID)
			}
		} else if ctx.Err() == nil {
			s.log.WarnContext(ctx, "follow task events of other replicas", "retry_in", backoff, "err", err)
		}
		if !sleep(ctx, backoff) {
			return
		}
		backoff = min(backoff*2, watchBackoffMax)
	}
}

// watchPoll is how often a WatchTask stream reads the store without a
// wake-up: the bound on the delay a lost signal can cause.
const watchPoll = 5 * time.Second

// checkpoint holds the trace events and task events of one call until the
// call's next state change, which writes them in its own transaction (see
// updateRequest), or until it reaches a checkpoint (before the adapter is
// called, and before the RPC returns), where what is left is written in
// one transaction too. Either way the trace events go to the outbox with
// the task events, and the call then delivers them in one AppendTraces
// round trip (flushTrace): nobody learns of an event before it is
// durable, and a call whose writes are fenced (another replica took its
// request over) writes none of what it held.
type checkpoint struct {
	mu     sync.Mutex
	traces []*evidencev1.TraceEvent
	events []*orchestratorv1.TaskEvent
	// task, when set, is a change of the task's checkpoint text, written
	// with the held events (see commit).
	task *ostore.TaskChange
	// written are the outbox entries of trace events this call's state
	// changes wrote, which it delivers at its next checkpoint.
	written []ostore.OutboxEntry
	// claimed is when the first of written was written: the call's claim
	// on delivering them lapses claimTTL later (see OutboxClaim).
	claimed time.Time
	// dead is set when a fail point stopped the call: what it held dies
	// with it, as with a process that was killed.
	dead bool
}

// kill drops what c holds and keeps it from holding more: the call ended
// as if its process died.
func (c *checkpoint) kill() {
	c.mu.Lock()
	c.dead = true
	c.mu.Unlock()
}

type checkpointKey struct{}

// withCheckpoint returns ctx holding the events traced and emitted under
// it until flush; the caller must flush before it returns.
func withCheckpoint(ctx context.Context) context.Context {
	return context.WithValue(ctx, checkpointKey{}, &checkpoint{})
}

func checkpointOf(ctx context.Context) *checkpoint {
	c, _ := ctx.Value(checkpointKey{}).(*checkpoint)
	return c
}

// flush writes what ctx's checkpoint holds, if anything: a held task
// change with the held task and trace events in one transaction (under a
// lease, the held events alone when there is no task change: fenced, see
// Fence), then the call's trace (what its state changes put in the
// outbox, then the rest) in one delivery, then any task event left.
func (s *Server) flush(ctx context.Context) {
	ctx = context.WithoutCancel(ctx)
	c := checkpointOf(ctx)
	if c == nil {
		return
	}
	c.mu.Lock()
	dead, holds := c.dead, len(c.events)+len(c.traces) > 0
	changes := c.task != nil
	c.mu.Unlock()
	f := leaseOf(ctx).Fence()
	if !dead && (changes || (holds && f.Generation != 0)) {
		held, giveBack := s.held(ctx, nil)
		held.Fence = f
		w, err := s.st.EmitHeld(ctx, held)
		s.sweep.Settle(held.Delivered, err == nil)
		switch {
		case errors.Is(err, ostore.ErrFenced):
			_ = s.fenced(ctx, f.RequestID, err)
		case err != nil:
			giveBack()
			s.log.WarnContext(ctx, "write the call's held events", "err", err)
		default:
			s.written(ctx, w)
		}
	}
	s.flushTrace(ctx)
	c.mu.Lock()
	events, dead := c.events, c.dead
	c.events = nil
	c.mu.Unlock()
	if dead {
		return
	}
	for _, e := range events {
		s.appendEvent(ctx, e)
	}
}

// flushTrace delivers the call's trace: the outbox entries its state
// changes wrote, then the trace events still held, in one round trip.
// Delivered entries leave the outbox; what evidence did not take waits
// there for the outbox loop.
func (s *Server) flushTrace(ctx context.Context) {
	c := checkpointOf(ctx)
	if c == nil {
		return
	}
	c.mu.Lock()
	written, traces, dead, claimed := c.written, c.traces, c.dead, c.claimed
	c.written, c.traces = nil, nil
	c.mu.Unlock()
	if dead {
		// The written entries are durable: the outbox loop sends them.
		s.undirect(written)
		return
	}
	if len(written) == 0 && len(traces) == 0 {
		return
	}
	ctx = context.WithoutCancel(ctx)
	if len(written) > 0 && time.Since(claimed) >= s.claimTTL()/2 {
		// The call was slow (or its process frozen): its claim may lapse
		// while it delivers, and another replica may have delivered the
		// entries already. The outbox loop sends them, once, and what the
		// call still holds goes behind them.
		s.undirect(written)
		s.outboxPending.Store(true)
		if len(traces) > 0 {
			s.toOutbox(ctx, traces)
		}
		return
	}
	evs := make([]*evidencev1.TraceEvent, 0, len(written)+len(traces))
	for _, e := range written {
		evs = append(evs, e.Event)
	}
	evs = append(evs, traces...)
	n, err := s.deliverTraces(ctx, evs, true)
	delivered := min(n, len(written))
	s.undirect(written[delivered:])
	s.sweep.Add(written[:delivered])
	if n < len(written) {
		s.outboxPending.Store(true)
	}
	s.keepRest(ctx, evs, n, len(traces), err)
}

// claimTTL is how long a call's claim on delivering what it wrote lasts:
// a third of a lease ttl, less than the least time before another replica
// may take the request over (a lease renewed every third of its ttl
// expires no sooner than two thirds of a ttl after a write made under
// it). So the claim of a replica that stopped lapses first, and the
// recovery pass of the replica that takes the request over delivers the
// stopped one's entries (deliverOutbox runs first) before it writes and
// delivers its own: the request's trace stays in order.
func (s *Server) claimTTL() time.Duration { return s.leaseTTL / 3 }

// deleteDelivered removes the first n of entries, delivered, from the
// outbox. A failure is logged and returned: the entries are sent again
// (delivery is at least once).
func (s *Server) deleteDelivered(ctx context.Context, entries []ostore.OutboxEntry, n int) error {
	n = min(n, len(entries))
	if n == 0 {
		return nil
	}
	if err := s.st.DeleteTraceOutbox(ctx, ostore.OutboxKeys(entries[:n])); err != nil {
		s.log.WarnContext(ctx, "delete delivered trace outbox entries", "err", err)
		return err
	}
	return nil
}

// keepRest handles what a delivery of evs left after the first n: it
// logs why (err), and puts in the outbox those not there already (the
// last fresh of evs).
func (s *Server) keepRest(ctx context.Context, evs []*evidencev1.TraceEvent, n, fresh int, err error) {
	if n == len(evs) {
		return
	}
	if err != nil {
		s.log.WarnContext(ctx, "append product trace; kept in the outbox", "task", evs[n].GetTaskId(), "events", len(evs)-n, "err", err)
	}
	if rest := evs[max(n, len(evs)-fresh):]; len(rest) > 0 {
		s.toOutbox(ctx, rest)
	}
}

// undirect hands written entries back to the outbox loop.
func (s *Server) undirect(written []ostore.OutboxEntry) {
	for _, e := range written {
		s.direct.Delete(e.Key)
	}
}

// held takes the task and trace events and the task change ctx's
// checkpoint holds, followed by those tell traces, emits and changes (run
// once, now), for the transaction of one state change; giveBack returns
// what the checkpoint held when that transaction failed (what tell held
// tells of a change that did not happen and is dropped).
func (s *Server) held(ctx context.Context, tell func(context.Context)) (ostore.Held, func()) {
	// The call delivers what it writes (see written), so other replicas
	// leave it while the claim lasts.
	// The deletes of what calls delivered ride the write (see outbox.Sweeper);
	// its caller settles them (outbox.Sweeper.Settle).
	h := ostore.Held{Claim: ostore.OutboxClaim{Owner: s.replica, TTL: s.claimTTL()}, Delivered: s.sweep.Take()}
	giveBack := func() {}
	if c := checkpointOf(ctx); c != nil {
		c.mu.Lock()
		h.Events, h.Traces, h.Task = c.events, c.traces, c.task
		c.events, c.traces, c.task = nil, nil, nil
		c.mu.Unlock()
		prior := h
		giveBack = func() {
			c.mu.Lock()
			c.events = append(prior.Events, c.events...)
			c.traces = append(prior.Traces, c.traces...)
			c.task = thenChange(prior.Task, c.task)
			c.mu.Unlock()
		}
	}
	if tell != nil {
		t := &checkpoint{}
		tell(context.WithValue(ctx, checkpointKey{}, t))
		h.Events = append(h.Events[:len(h.Events):len(h.Events)], t.events...)
		h.Traces = append(h.Traces[:len(h.Traces):len(h.Traces)], t.traces...)
		h.Task = thenChange(h.Task, t.task)
	}
	return h, giveBack
}

// thenChange is a then b, either of which may be nil. A call acts on one
// task (see updateTaskAtCheckpoint), so both change the same one.
func thenChange(a, b *ostore.TaskChange) *ostore.TaskChange {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	}
	return &ostore.TaskChange{ID: a.ID, Fn: func(t *orchestratorv1.Task) error {
		if err := a.Fn(t); err != nil {
			return err
		}
		return b.Fn(t)
	}}
}

// written wakes the watchers of w's task events and has w's trace
// entries delivered: at ctx's next checkpoint when it holds one, else now.
func (s *Server) written(ctx context.Context, w ostore.Written) {
	if w.TaskErr != nil {
		// What the task's checkpoint text sums up is durable in the
		// request that was written.
		s.log.WarnContext(ctx, "update task checkpoint", "err", w.TaskErr)
	}
	s.notify(w.Events)
	if len(w.Outbox) == 0 {
		return
	}
	for _, e := range w.Outbox {
		s.direct.Store(e.Key, struct{}{})
	}
	c := checkpointOf(ctx)
	if c == nil {
		c = &checkpoint{}
		ctx = context.WithValue(ctx, checkpointKey{}, c)
		defer s.flushTrace(ctx)
	}
	c.mu.Lock()
	if len(c.written) == 0 {
		c.claimed = time.Now()
	}
	c.written = append(c.written, w.Outbox...)
	c.mu.Unlock()
}

// updateRequest applies fn to the request in one store transaction with
// the events ctx's checkpoint holds and those tell traces and emits of
// the change: a state change and what tells of it are durable together,
// so a process killed right after cannot lose them. This is the one way
// the server changes a request.
//
// Under a lease on the request the write carries the lease's generation:
// when another replica took the request over since, the store refuses it
// and the call ends with REQUEST_LEASE_LOST, writing nothing it held
// (see fenced).
func (s *Server) updateRequest(ctx context.Context, id string, fn func(*orchestratorv1.ToolRequest) error, tell func(context.Context)) (*orchestratorv1.ToolRequest, error) {
	held, giveBack := s.held(ctx, tell)
	held.Fence = fenceOn(ctx, id)
	out, w, err := s.st.UpdateRequestEmit(ctx, id, fn, held)
	s.sweep.Settle(held.Delivered, err == nil)
	if errors.Is(err, ostore.ErrFenced) {
		return nil, s.fenced(ctx, id, err)
	}
	if err != nil {
		giveBack()
		return nil, err
	}
	s.written(ctx, w)
	if l := leaseOf(ctx); l != nil && l.RequestID() == id {
		l.Settled(out.GetState() == orchestratorv1.RequestState_REQUEST_STATE_EXECUTED && !recoverable(out))
	}
	return out, nil
}

// saveAttempt inserts or updates att in the request (see mergeAttempt),
// with what tell traces and emits, as updateRequest does.
func (s *Server) saveAttempt(ctx context.Context, id string, att *orchestratorv1.Attempt, tell func(context.Context)) (*orchestratorv1.ToolRequest, error) {
	return s.updateRequest(ctx, id, func(r *orchestratorv1.ToolRequest) error {
		mergeAttempt(r, att)
		return nil
	}, tell)
}

// createRequest is CreateRequestEmit with what tells of the creation
// written in its transaction (as updateRequest does), taking this
// replica's lease on the new request with it; nothing is written and no
// lease is taken when the request existed.
func (s *Server) createRequest(ctx context.Context, r *orchestratorv1.ToolRequest, tell func(context.Context)) (ostore.Creation, error) {
	held, giveBack := s.held(ctx, tell)
	c, err := s.st.CreateRequestEmit(ctx, r, held, ostore.LeaseTake{Owner: s.replica, TTL: s.leaseTTL})
	s.sweep.Settle(held.Delivered, err == nil && c.Created)
	if err != nil || !c.Created {
		giveBack()
		return c, err
	}
	s.written(ctx, c.Written)
	return c, nil
}

// notify wakes the watchers of the tasks of stored events.
func (s *Server) notify(stored []*orchestratorv1.TaskEvent) {
	for i, e := range stored {
		if i == 0 || e.GetTaskId() != stored[i-1].GetTaskId() {
			s.notes.notify(e.GetTaskId())
		}
	}
}

// updateTaskAtCheckpoint applies fn to the task: in the transaction of
// ctx's next write when ctx holds a checkpoint (a call's checkpoint text
// is written with the state change it sums up, see commit), else now. A
// failure is logged: what the task's checkpoint text sums up is already
// durable in the request.
func (s *Server) updateTaskAtCheckpoint(ctx context.Context, taskID string, fn func(*orchestratorv1.Task) error) {
	if c := checkpointOf(ctx); c != nil {
		c.mu.Lock()
		if c.task == nil || c.task.ID == taskID {
			c.task = thenChange(c.task, &ostore.TaskChange{ID: taskID, Fn: fn})
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		// A call acts on one task; another's change is not held.
	}
	if _, err := s.st.UpdateTask(ctx, taskID, fn); err != nil {
		s.log.WarnContext(ctx, "update task checkpoint", "task", taskID, "err", err)
	}
}

// emit stores a task event and wakes the task's watchers (at the call's
// next checkpoint, when ctx holds one). A failure is logged, not returned:
// the state change it describes is already durable.
func (s *Server) emit(ctx context.Context, taskID, requestID, typ, detail string) {
	e := &orchestratorv1.TaskEvent{TaskId: taskID, RequestId: requestID, Type: typ, Detail: detail, Time: s.timestamp()}
	if c := checkpointOf(ctx); c != nil {
		c.mu.Lock()
		c.events = append(c.events, e)
		c.mu.Unlock()
		return
	}
	s.appendEvent(ctx, e)
}

func (s *Server) appendEvent(ctx context.Context, e *orchestratorv1.TaskEvent) {
	_, err := s.st.AppendEvent(context.WithoutCancel(ctx), e)
	if err != nil {
		s.log.WarnContext(ctx, "append task event", "task", e.GetTaskId(), "type", e.GetType(), "err", err)
		return
	}
	s.notes.notify(e.GetTaskId())
}

// trace appends a product-layer event to the task's trace in the evidence
// service (at the call's next checkpoint, when ctx holds one). The product
// decision it records has already been made and persisted here, so a
// trace failure is logged rather than undoing it.
func (s *Server) trace(ctx context.Context, taskID string, ev *evidencev1.ProductEvent) {
	if s.deps.Evidence == nil {
		return
	}
	te := &evidencev1.TraceEvent{
		TaskId: taskID,
		Time:   s.timestamp(),
		Layer:  &evidencev1.TraceEvent_Product{Product: ev},
		// Delivery is at least once (a call's checkpoint, then the outbox
		// for what it could not deliver): evidence stores the event once.
		DeliveryId: ids.New("tdl"),
		// The call the event tells of, which a delivery shared with
		// other calls, or one from the outbox, is not.
		OtelTraceId: telemetry.TraceID(ctx),
	}
	if c := checkpointOf(ctx); c != nil {
		c.mu.Lock()
		c.traces = append(c.traces, te)
		c.mu.Unlock()
		return
	}
	s.appendTraces(ctx, []*evidencev1.TraceEvent{te})
}

// appendTraces writes trace events in one round trip; an evidence service
// without AppendTraces (an older version during an upgrade) gets them one
// by one. What evidence does not take now waits in the outbox.
func (s *Server) appendTraces(ctx context.Context, evs []*evidencev1.TraceEvent) {
	ctx = context.WithoutCancel(ctx)
	n, err := s.deliverTraces(ctx, evs, true)
	s.keepRest(ctx, evs, n, len(evs), err)
}

// deliverTraces sends evs to evidence in order, in batches sized so every
// message fits what the transport accepts, and returns how many are done
// with: taken, or refused as invalid. It stops at the first error worth
// retrying, or (behindOutbox) as soon as the outbox holds events, which
// then go first. An event evidence refuses as invalid would be refused
// forever and hold every later one back, so it is dropped and logged
// (without its content): events are cut to what evidence accepts
// (boundTraceEvent), so one refused is a bug to report, not data to keep
// retrying.
func (s *Server) deliverTraces(ctx context.Context, evs []*evidencev1.TraceEvent, behindOutbox bool) (int, error) {
	done := 0
	for _, batch := range traceBatches(evs) {
		if behindOutbox && s.outboxPending.Load() {
			return done, nil
		}
		// Concurrent calls' batches share a round trip (tracesend).
		err := s.traces.Send(ctx, batch)
		switch {
		case err == nil:
			done += len(batch)
		case status.Code(err) == codes.InvalidArgument && len(batch) > 1:
			// Find the refused event: the others are delivered.
			for _, ev := range batch {
				n, err := s.deliverTraces(ctx, []*evidencev1.TraceEvent{ev}, false)
				done += n
				if err != nil {
					return done, err
				}
			}
		case status.Code(err) == codes.InvalidArgument:
			s.log.ErrorContext(ctx, "trace event refused by evidence as invalid; dropped", "task", batch[0].GetTaskId(),
				"time", batch[0].GetTime().AsTime(), "reason", apierror.Reason(err), "err", apierror.Truncate(status.Convert(err).Message(), 512))
			done++
		default:
			return done, err
		}
	}
	return done, nil
}

// WatchTask streams a task's events after after_sequence, then follows new
// ones until the client goes away or the server closes.
func (s *Server) WatchTask(req *orchestratorv1.WatchTaskRequest, stream grpc.ServerStreamingServer[orchestratorv1.TaskEvent]) error {
	ctx := stream.Context()
	if req.GetTaskId() == "" {
		return missing("task_id")
	}
	if _, err := s.openTask(ctx, req.GetTaskId(), authz.TaskRead); err != nil {
		return err
	}
	// Subscribe before the first read so no event falls between them.
	wake, unsubscribe := s.notes.subscribe(req.GetTaskId())
	defer unsubscribe()
	// Events another replica stores wake this stream too (see
	// followEvents); a poll bounds the delay of a wake-up lost on the way.
	poll := time.NewTicker(s.watchPoll)
	defer poll.Stop()
	last := req.GetAfterSequence()
	for {
		events, err := s.st.ListEvents(ctx, req.GetTaskId(), last)
		if err != nil {
			return s.internal(ctx, "list task events", err)
		}
		for _, e := range events {
			if err := stream.Send(e); err != nil {
				return err
			}
			last = e.GetSequence()
		}
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-s.ctx.Done():
			return nil
		case <-wake:
		case <-poll.C:
		}
	}
}

func listOrNone(xs []string) string {
	if len(xs) == 0 {
		return "nothing"
	}
	return strings.Join(xs, ", ")
}

func errorMessage(err error) string { return status.Convert(err).Message() }
