package orchestrator

import (
	"context"
	"fmt"
	"slices"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/authz"
	"github.com/v0m3/v0m3/internal/identity"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
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

// groupAssert is the Cedar action a product service needs, on resource
// "group:<group>" with context.user the end user's id, to name a group in
// on_behalf_of.groups without the user's own token: the per-service
// allow-list of delegated groups, kept in policy.
const groupAssert = "group.assert"

// requesterOf returns the requester and actor of a new task: the caller
// itself, or, when it starts the task for an end user, that user, if
// policy grants the caller delegation. The user's groups never come from
// the request body alone: they are the groups of the user's own token
// (identity.UserTokenHeader, verified by the guard), or groups policy lets
// this caller assert (groupAssert). on_behalf_of.groups, when given, narrow
// them; a group neither verified nor allowed is refused, never dropped.
func (s *Server) requesterOf(ctx context.Context, onBehalfOf *policyv1.Principal) (*policyv1.Principal, string, error) {
	c, err := caller(ctx)
	if err != nil {
		return nil, "", err
	}
	user, hasUser := identity.OnBehalfOfFrom(ctx)
	if onBehalfOf == nil {
		if hasUser {
			return nil, "", apierror.InvalidArgument(apierror.ReasonFieldRequired,
				"a user token ("+identity.UserTokenHeader+") was sent without on_behalf_of: set on_behalf_of.id to the user the task is for",
				apierror.FieldViolation{Field: "on_behalf_of.id", Description: "required with a user token"})
		}
		return &policyv1.Principal{Id: c.ID, Groups: c.Groups}, "", nil
	}
	if onBehalfOf.GetId() == "" {
		return nil, "", apierror.InvalidArgument(apierror.ReasonFieldRequired, "on_behalf_of.id is required when on_behalf_of is set",
			apierror.FieldViolation{Field: "on_behalf_of.id", Description: "required"})
	}
	if err := identity.CheckPerson(onBehalfOf.GetId()); err != nil {
		// The task would act, and be recorded, as a service.
		return nil, "", apierror.InvalidArgument(identity.ReasonPrincipalReserved, "on_behalf_of.id names a service, not a person: "+err.Error(),
			apierror.FieldViolation{Field: "on_behalf_of.id", Description: "must be a person's id"})
	}
	if hasUser && user.ID != onBehalfOf.GetId() {
		return nil, "", apierror.InvalidArgument("USER_TOKEN_MISMATCH",
			fmt.Sprintf("the user token (%s) names %q, not on_behalf_of.id %q: send the token of the user the task is for", identity.UserTokenHeader, user.ID, onBehalfOf.GetId()),
			apierror.FieldViolation{Field: "on_behalf_of.id", Description: "must be the subject of the user token"})
	}
	if onBehalfOf.GetId() == c.ID {
		groups, err := verifiedGroups(onBehalfOf.GetGroups(), c.Groups, "your token")
		if err != nil {
			return nil, "", err
		}
		return &policyv1.Principal{Id: c.ID, Groups: groups}, "", nil
	}
	if _, err := s.authz.Require(ctx, authz.TaskActFor, authz.Resource{Type: "user", ID: onBehalfOf.GetId()}, nil); err != nil {
		return nil, "", err
	}
	if hasUser {
		groups, err := verifiedGroups(onBehalfOf.GetGroups(), user.Groups, "the user token ("+identity.UserTokenHeader+")")
		if err != nil {
			return nil, "", err
		}
		return &policyv1.Principal{Id: user.ID, Groups: groups}, c.ID, nil
	}
	for i, g := range onBehalfOf.GetGroups() {
		_, ref, err := s.authz.Check(ctx, groupAssert, authz.Resource{Type: "group", ID: g}, map[string]string{"user": onBehalfOf.GetId()})
		if err != nil {
			return nil, "", err
		}
		if ref != nil {
			return nil, "", groupNotAsserted(i, g, fmt.Sprintf("policy does not let %s assert group %q for its users (action %s, policies %v, revision %s): "+
				"send the user's own token in %s, or ask a policy administrator to allow the group", c.ID, g, groupAssert, ref.Policies, ref.Revision, identity.UserTokenHeader))
		}
	}
	return &policyv1.Principal{Id: onBehalfOf.GetId(), Groups: onBehalfOf.GetGroups()}, c.ID, nil
}

// verifiedGroups returns the groups a task's requester acts with when a
// verified token vouches for them: asked, each of which must be among
// verified, or all of verified when none is asked for.
func verifiedGroups(asked, verified []string, from string) ([]string, error) {
	if len(asked) == 0 {
		return verified, nil
	}
	for i, g := range asked {
		if !slices.Contains(verified, g) {
			return nil, groupNotAsserted(i, g, fmt.Sprintf("group %q is not in %s: on_behalf_of.groups may only narrow the groups a verified token carries", g, from))
		}
	}
	return asked, nil
}

// groupNotAsserted refuses on_behalf_of.groups[i].
func groupNotAsserted(i int, group, msg string) error {
	field := fmt.Sprintf("on_behalf_of.groups[%d]", i)
	return apierror.WithFieldViolations(apierror.New(codes.PermissionDenied, "GROUP_NOT_VERIFIED", msg,
		map[string]string{"field": field, "group": group}), apierror.FieldViolation{Field: field, Description: "group not verified"})
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
