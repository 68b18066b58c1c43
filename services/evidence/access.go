package evidence

import (
	"context"
	"errors"

	"github.com/v0m3/v0m3/internal/authz"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/store"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
)

// WithAuthorizer sets who decides what people and product services may
// read and change here (the policy service). Without one they are refused;
// peer services the access table admits are not asked.
func (s *Server) WithAuthorizer(d authz.Decider) *Server {
	s.authz = d
	return s
}

// require checks that the caller may take action on the resource.
func (s *Server) require(ctx context.Context, action, resType, resID string) error {
	_, err := s.authz.Require(ctx, action, authz.Resource{Type: resType, ID: resID}, nil)
	return err
}

// requireTask checks that the caller may take action on a task's evidence:
// policy sees the task's requester and actor, as the orchestrator recorded
// them when the task started, so a requester may read its own task.
func (s *Server) requireTask(ctx context.Context, action, taskID string) error {
	// A peer the table admitted needs no attributes: skip the trace read.
	if c, ok := identity.CallerFrom(ctx); ok && c.Kind == identity.KindService {
		return nil
	}
	attrs := map[string]string{}
	if taskID != "" {
		events, err := s.st.ListTrace(ctx, taskID)
		if err != nil {
			return s.storeError(ctx, err, "read the task's trace", "", "", nil)
		}
		for _, ev := range events {
			if p := ev.GetProduct(); p.GetKind() == evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_TASK_STARTED {
				attrs["requester"], attrs["actor"] = p.GetRequester(), p.GetActor()
				break
			}
		}
	}
	_, err := s.authz.Require(ctx, action, authz.Resource{Type: "task", ID: taskID}, attrs)
	return err
}

// observationFor loads observation id for an action on its task's
// evidence, checked as requireTask checks it: the task's requester and
// actor, as recorded, may. An unknown id is asked without a task first, so
// whoever may not take the action learns nothing about which ids exist.
func (s *Server) observationFor(ctx context.Context, action, id, op, unknown string) (*evidencev1.SourceObservation, error) {
	obs, err := s.st.GetObservation(ctx, id)
	if err != nil {
		if !errors.Is(err, store.ErrNotFound) {
			return nil, s.storeError(ctx, err, op, "", "", nil)
		}
		if err := s.requireTask(ctx, action, ""); err != nil {
			return nil, err
		}
		return nil, s.storeError(ctx, err, op, "OBSERVATION_UNKNOWN", unknown, map[string]string{"observation_id": id})
	}
	if err := s.requireTask(ctx, action, obs.GetTaskId()); err != nil {
		return nil, err
	}
	return obs, nil
}
