package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/v0m3/v0m3/internal/store"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/orchestrator/tasks"
)

// Registry watch backoff bounds.
const (
	watchBackoffMin = 500 * time.Millisecond
	watchBackoffMax = 30 * time.Second
)

// MarkConnectionUnavailable stops every active task whose offered catalogue
// uses the connection: the task becomes CONNECTION_UNAVAILABLE with a
// checkpoint naming its last committed request, and requests waiting for
// approval are refused. Every record stays readable.
func (s *Server) MarkConnectionUnavailable(ctx context.Context, connectionID string) error {
	tasks, err := s.st.ListTasks(ctx, orchestratorv1.TaskState_TASK_STATE_ACTIVE)
	if err != nil {
		return fmt.Errorf("list active tasks: %w", err)
	}
	var errs []error
	for _, t := range tasks {
		cat, err := s.st.GetCatalogue(ctx, t.GetId())
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !usesConnection(cat, connectionID) {
			continue
		}
		if err := s.markTaskUnavailable(ctx, t.GetId(), connectionID); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (s *Server) markTaskUnavailable(ctx context.Context, taskID, connectionID string) error {
	checkpoint, err := s.lastCommitted(ctx, taskID)
	if err != nil {
		return err
	}
	checkpoint = fmt.Sprintf("connection %s became unavailable; %s", connectionID, checkpoint)
	changed := false
	_, err = s.st.UpdateTask(ctx, taskID, func(t *orchestratorv1.Task) error {
		if t.GetState() != orchestratorv1.TaskState_TASK_STATE_ACTIVE {
			return nil
		}
		if err := tasks.Move(t, tasks.LoseConnection); err != nil {
			return err
		}
		t.Checkpoint = checkpoint
		t.UpdateTime = s.timestamp()
		changed = true
		return nil
	})
	if err != nil || !changed {
		return err
	}
	s.log.InfoContext(ctx, "task stopped: connection unavailable", "task", taskID, "connection", connectionID)
	s.refusePending(ctx, taskID, "CONNECTION_UNAVAILABLE", checkpoint)
	s.trace(ctx, taskID, &evidencev1.ProductEvent{
		Kind: evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_TASK_STATE, Detail: checkpoint,
	})
	s.emit(ctx, taskID, "", "task.connection_unavailable", checkpoint)
	return nil
}

// lastCommitted describes the task's last committed request, its last
// safe checkpoint.
func (s *Server) lastCommitted(ctx context.Context, taskID string) (string, error) {
	rs, err := s.st.ListRequests(ctx, taskID)
	if err != nil {
		return "", fmt.Errorf("list requests of %s: %w", taskID, err)
	}
	var last *orchestratorv1.ToolRequest
	for _, r := range rs {
		if r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
			continue
		}
		if last == nil || !r.GetUpdateTime().AsTime().Before(last.GetUpdateTime().AsTime()) {
			last = r
		}
	}
	if last == nil {
		return "no request had committed", nil
	}
	return fmt.Sprintf("last committed request %s (%s) at %s", last.GetId(), last.GetCapability(),
		last.GetUpdateTime().AsTime().UTC().Format(time.RFC3339)), nil
}

func usesConnection(cat *orchestratorv1.OfferedCatalogue, connectionID string) bool {
	for _, ce := range cat.GetConsidered() {
		if ce.GetStage() == policyv1.EligibilityStage_ELIGIBILITY_STAGE_OFFERED && ce.GetConnectionId() == connectionID {
			return true
		}
	}
	return false
}

// watchRegistry follows registry events and stops tasks whose connection
// was retired. The registry may be down or restarting: the watch resumes
// after the last event seen, with capped exponential backoff, until Close.
func (s *Server) watchRegistry(ctx context.Context) {
	var after int64
	backoff := watchBackoffMin
	for {
		progressed, err := s.followRegistry(ctx, &after)
		if ctx.Err() != nil {
			return
		}
		if progressed {
			backoff = watchBackoffMin
		}
		logf := s.log.WarnContext
		if c := status.Code(err); errors.Is(err, io.EOF) || c == codes.Unavailable || c == codes.Unimplemented || c == codes.Canceled {
			logf = s.log.DebugContext // expected while the registry starts or restarts
		}
		logf(ctx, "registry event watch ended", "after", after, "retry_in", backoff, "err", err)
		if !sleep(ctx, backoff) {
			return
		}
		backoff = min(backoff*2, watchBackoffMax)
	}
}

// followRegistry reads one event stream until it ends. It reports whether
// any event arrived.
func (s *Server) followRegistry(ctx context.Context, after *int64) (bool, error) {
	stream, err := s.deps.Registry.WatchEvents(ctx, &registryv1.WatchEventsRequest{AfterSequence: *after})
	if err != nil {
		return false, err
	}
	progressed := false
	for {
		ev, err := stream.Recv()
		if err != nil {
			return progressed, err
		}
		progressed = true
		*after = ev.GetSequence()
		if ev.GetType() == registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_CONNECTION_RETIRED {
			if err := s.MarkConnectionUnavailable(ctx, ev.GetConnectionId()); err != nil {
				s.log.ErrorContext(ctx, "mark connection unavailable", "connection", ev.GetConnectionId(), "err", err)
			}
		}
	}
}

// sleep waits for d, or until ctx ends; it reports whether the full wait
// elapsed. The background loops (registry watch, recovery) back off with it.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
