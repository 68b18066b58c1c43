package orchestrator

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"

	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	"github.com/v0m3/v0m3/services/identity"
	"github.com/v0m3/v0m3/services/internal/apierror"
	"github.com/v0m3/v0m3/services/internal/authz"
)

// taskWrite is the Cedar action a caller other than the task's requester
// or actor needs to submit requests to or cancel a task (no default policy
// grants it).
const taskWrite = "task.write"

// caller returns the authenticated caller of ctx.
func caller(ctx context.Context) (identity.Caller, error) {
	c, ok := identity.CallerFrom(ctx)
	if !ok || c.ID == "" {
		return identity.Caller{}, apierror.New(codes.Unauthenticated, "CREDENTIALS_MISSING", "no authenticated caller", nil)
	}
	return c, nil
}

// requesterOf returns the requester and actor of a new task: the caller
// itself, or, when it starts the task for an end user, that user, if
// policy grants the caller delegation.
func (s *Server) requesterOf(ctx context.Context, onBehalfOf *policyv1.Principal) (*policyv1.Principal, string, error) {
	c, err := caller(ctx)
	if err != nil {
		return nil, "", err
	}
	if onBehalfOf == nil {
		return &policyv1.Principal{Id: c.ID, Groups: c.Groups}, "", nil
	}
	if onBehalfOf.GetId() == "" {
		return nil, "", apierror.InvalidArgument("MISSING_FIELD", "on_behalf_of.id is required when on_behalf_of is set",
			apierror.FieldViolation{Field: "on_behalf_of.id", Description: "required"})
	}
	if err := identity.CheckPerson(onBehalfOf.GetId()); err != nil {
		// The task would act, and be recorded, as a service.
		return nil, "", apierror.InvalidArgument(identity.ReasonPrincipalReserved, "on_behalf_of.id names a service, not a person: "+err.Error(),
			apierror.FieldViolation{Field: "on_behalf_of.id", Description: "must be a person's id"})
	}
	if onBehalfOf.GetId() == c.ID {
		return &policyv1.Principal{Id: c.ID, Groups: c.Groups}, "", nil
	}
	if _, err := s.authz.Require(ctx, authz.TaskActFor, authz.Resource{Type: "user", ID: onBehalfOf.GetId()}, nil); err != nil {
		return nil, "", err
	}
	return onBehalfOf, c.ID, nil
}

// taskAttributes are the facts about a task policies compare with the
// principal.
func taskAttributes(task *orchestratorv1.Task) map[string]string {
	return map[string]string{"requester": task.GetRequester().GetId(), "actor": task.GetActor()}
}

// maxActorTasks bounds the tasks openTaskToAct keeps.
const maxActorTasks = 8192

// openTaskToAct is openTask for a call that reads the task again in the
// transaction that acts on it (a submission reads it with the request's
// creation): what decides who may act, the task's requester and actor,
// never changes and a task is never deleted, so the task read the first
// time is kept and its access checked again on every call. Anything else
// about the returned task may be stale.
func (s *Server) openTaskToAct(ctx context.Context, id, action string) (*orchestratorv1.Task, error) {
	task, ok := s.actors.Get(id)
	if !ok {
		var err error
		if task, err = s.loadTask(ctx, id); err != nil {
			return nil, err
		}
		s.actors.Add(id, task)
	}
	if err := s.checkTask(ctx, task, action); err != nil {
		return nil, err
	}
	return task, nil
}

// openTask loads a task and checks that the caller may take action on it:
// its requester and its actor may; anyone else needs policy to grant the
// action on this task. A refusal is recorded in the task's trace.
func (s *Server) openTask(ctx context.Context, id, action string) (*orchestratorv1.Task, error) {
	task, err := s.loadTask(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := s.checkTask(ctx, task, action); err != nil {
		return nil, err
	}
	return task, nil
}

// checkTask checks that the caller may take action on task (see
// openTask).
func (s *Server) checkTask(ctx context.Context, task *orchestratorv1.Task, action string) error {
	c, err := caller(ctx)
	if err != nil {
		return err
	}
	if c.Kind == identity.KindService || c.ID == task.GetRequester().GetId() || (task.GetActor() != "" && c.ID == task.GetActor()) {
		return nil
	}
	return s.require(ctx, task, action, authz.Resource{Type: "task", ID: task.GetId()}, taskAttributes(task))
}

// openRequest loads a request and its task, checking the caller as
// openTask does.
func (s *Server) openRequest(ctx context.Context, id, action string) (*orchestratorv1.ToolRequest, *orchestratorv1.Task, error) {
	req, err := s.loadRequest(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	task, err := s.openTask(ctx, req.GetTaskId(), action)
	if err != nil {
		return nil, nil, err
	}
	return req, task, nil
}

// require asks policy whether the caller may take action on res of task,
// recording a refusal in the task's trace.
func (s *Server) require(ctx context.Context, task *orchestratorv1.Task, action string, res authz.Resource, attrs map[string]string) error {
	_, ref, err := s.authz.Check(ctx, action, res, attrs)
	if err != nil {
		return err
	}
	if ref == nil {
		return nil
	}
	s.trace(ctx, task.GetId(), &evidencev1.ProductEvent{
		Kind:   evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_POLICY_DECISION,
		Reason: ref.Reason,
		Detail: fmt.Sprintf("%s refused: %s on %s %s (policies %v, revision %s)", ref.Caller, action, res.Type, res.ID, ref.Policies, ref.Revision),
	})
	return ref.Err()
}
