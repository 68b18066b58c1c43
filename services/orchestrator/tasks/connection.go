package tasks

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/v0m3/v0m3/internal/store"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
)

// MarkConnectionUnavailable stops every active task whose offered
// catalogue uses the connection: the task becomes CONNECTION_UNAVAILABLE
// with a checkpoint naming its last committed request, and requests
// waiting for approval are refused. Every record stays readable.
func (s *Service) MarkConnectionUnavailable(ctx context.Context, connectionID string) error {
	active, err := s.st.ListTasks(ctx, Active)
	if err != nil {
		return fmt.Errorf("list active tasks: %w", err)
	}
	var errs []error
	for _, t := range active {
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
		if err := s.markUnavailable(ctx, t.GetId(), connectionID); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (s *Service) markUnavailable(ctx context.Context, taskID, connectionID string) error {
	checkpoint, err := s.lastCommitted(ctx, taskID)
	if err != nil {
		return err
	}
	checkpoint = fmt.Sprintf("connection %s became unavailable; %s", connectionID, checkpoint)
	changed := false
	_, err = s.st.UpdateTask(ctx, taskID, func(t *orchestratorv1.Task) error {
		if t.GetState() != Active {
			return nil
		}
		if err := Move(t, LoseConnection); err != nil {
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
	s.requests.RefusePending(ctx, taskID, "CONNECTION_UNAVAILABLE", checkpoint)
	s.report.Trace(ctx, taskID, &evidencev1.ProductEvent{
		Kind: evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_TASK_STATE, Detail: checkpoint,
	})
	s.report.Emit(ctx, taskID, "", "task.connection_unavailable", checkpoint)
	return nil
}

// lastCommitted describes the task's last committed request, its last
// safe checkpoint.
func (s *Service) lastCommitted(ctx context.Context, taskID string) (string, error) {
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
