package orchestrator

import (
	"context"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	"github.com/v0m3/v0m3/services/internal/authz"
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

// emit stores a task event and wakes the task's watchers. A failure is
// logged, not returned: the state change it describes is already durable.
func (s *Server) emit(ctx context.Context, taskID, requestID, typ, detail string) {
	_, err := s.st.AppendEvent(context.WithoutCancel(ctx), &orchestratorv1.TaskEvent{
		TaskId: taskID, RequestId: requestID, Type: typ, Detail: detail, Time: s.timestamp(),
	})
	if err != nil {
		s.log.WarnContext(ctx, "append task event", "task", taskID, "type", typ, "err", err)
		return
	}
	s.notes.notify(taskID)
}

// trace appends a product-layer event to the task's trace in the evidence
// service. The product decision it records has already been made and
// persisted here, so a trace failure is logged rather than undoing it.
func (s *Server) trace(ctx context.Context, taskID string, ev *evidencev1.ProductEvent) {
	if s.deps.Evidence == nil {
		return
	}
	_, err := s.deps.Evidence.AppendTrace(context.WithoutCancel(ctx), &evidencev1.AppendTraceRequest{Event: &evidencev1.TraceEvent{
		TaskId: taskID,
		Time:   s.timestamp(),
		Layer:  &evidencev1.TraceEvent_Product{Product: ev},
	}})
	if err != nil {
		s.log.WarnContext(ctx, "append product trace", "task", taskID, "kind", ev.GetKind().String(), "err", err)
	}
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
		}
	}
}

func listOrNone(xs []string) string {
	if len(xs) == 0 {
		return "nothing"
	}
	return strings.Join(xs, ", ")
}

func stateName(st orchestratorv1.TaskState) string {
	return strings.ToLower(strings.TrimPrefix(st.String(), "TASK_STATE_"))
}

func errorMessage(err error) string { return status.Convert(err).Message() }
