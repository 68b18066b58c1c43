package orchestrator

import (
	"context"
	"errors"
	ostore "github.com/v0m3/v0m3/services/orchestrator/store"
	"slices"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/authz"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/paging"
	"github.com/v0m3/v0m3/internal/store"
	"github.com/v0m3/v0m3/internal/telemetry"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
)

// Lists read everything they may show from the store and page it (see
// internal/paging): tasks and requests are ordered by creation
// time, then id.

func taskOrder(t *orchestratorv1.Task) string { return paging.TimeKey(t.GetCreateTime(), t.GetId()) }

func requestOrder(r *orchestratorv1.ToolRequest) string {
	return paging.TimeKey(r.GetCreateTime(), r.GetId())
}

// ListTasks returns the tasks the caller may see. A V0M3 service and a
// caller policy lets read the task collection (task.read on resource type
// "task" with no id: the default grants it to auditors and approvers) see
// every task; anyone else sees the tasks they requested or started for
// someone, and may not ask for another requester's.
func (s *Server) ListTasks(ctx context.Context, req *orchestratorv1.ListTasksRequest) (*orchestratorv1.ListTasksResponse, error) {
	c, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	all := c.Kind == identity.KindService
	if !all {
		_, ref, err := s.authz.Check(ctx, authz.TaskRead, authz.Resource{Type: "task"}, nil)
		if err != nil {
			return nil, err
		}
		all = ref == nil
		if ref != nil && req.GetRequester() != "" && req.GetRequester() != c.ID {
			return nil, ref.Err()
		}
	}
	scope := "all"
	if !all {
		scope = "own:" + c.ID
	}
	filter := paging.Filter("scope", scope, "state", req.GetState().String(), "profile", req.GetProfile(), "requester", req.GetRequester())
	if _, err := paging.After(req, filter); err != nil {
		return nil, err
	}
	tasks, err := s.st.ListTasks(ctx, req.GetState())
	if err != nil {
		return nil, s.internal(ctx, "list tasks", err)
	}
	tasks = slices.DeleteFunc(tasks, func(t *orchestratorv1.Task) bool {
		return (req.GetProfile() != "" && t.GetProfile() != req.GetProfile()) ||
			(req.GetRequester() != "" && t.GetRequester().GetId() != req.GetRequester()) ||
			(!all && t.GetRequester().GetId() != c.ID && t.GetActor() != c.ID)
	})
	page, next, err := paging.Page(req, filter, tasks, taskOrder)
	if err != nil {
		return nil, err
	}
	return &orchestratorv1.ListTasksResponse{Tasks: page, NextPageToken: next}, nil
}

// allTasks is the task id that reads across every task (AIP-159).
const allTasks = "-"

// ListRequests returns a task's requests (in one state, or awaiting
// settlement, when asked), oldest first; with task id "-", the requests
// awaiting settlement the caller may settle, across every task.
func (s *Server) ListRequests(ctx context.Context, req *orchestratorv1.ListRequestsRequest) (*orchestratorv1.ListRequestsResponse, error) {
	switch req.GetTaskId() {
	case "":
		return nil, missing("task_id")
	case allTasks:
		return s.listAwaitingSettlement(ctx, req)
	}
	filter := requestFilter(req)
	if _, err := paging.After(req, filter); err != nil {
		return nil, err
	}
	if _, err := s.openTask(ctx, req.GetTaskId(), authz.TaskRead); err != nil {
		return nil, err
	}
	rs, err := s.st.ListRequests(ctx, req.GetTaskId())
	if err != nil {
		return nil, s.internal(ctx, "list requests", err)
	}
	rs = slices.DeleteFunc(rs, func(r *orchestratorv1.ToolRequest) bool { return !requestMatches(req, r) })
	page, next, err := paging.Page(req, filter, rs, requestOrder)
	if err != nil {
		return nil, err
	}
	return &orchestratorv1.ListRequestsResponse{Requests: page, NextPageToken: next}, nil
}

// listAwaitingSettlement lists, across every task, the requests whose
// unknown outcome the caller may settle, read from the store's index of
// unsettled requests: policy decides each as SettleRequest would
// (request.settle with the task's attributes and the capability), so a
// caller who may settle nothing gets an empty list. Only this filter reads
// across tasks: any other would read every request of every task.
func (s *Server) listAwaitingSettlement(ctx context.Context, req *orchestratorv1.ListRequestsRequest) (*orchestratorv1.ListRequestsResponse, error) {
	if !req.GetAwaitingSettlement() {
		return nil, apierror.InvalidArgument("TASK_WILDCARD_UNSUPPORTED",
			`task_id "-" (every task) lists only the requests awaiting settlement: set awaiting_settlement, or name one task`,
			apierror.FieldViolation{Field: "task_id", Description: `a task id, or "-" with awaiting_settlement`})
	}
	c, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	filter := requestFilter(req, "caller", c.ID)
	if _, err := paging.After(req, filter); err != nil {
		return nil, err
	}
	out, err := s.actionable(ctx, authz.RequestSettle, func(r *orchestratorv1.ToolRequest) bool { return requestMatches(req, r) }, nil)
	if err != nil {
		return nil, err
	}
	page, next, err := paging.Page(req, filter, out, requestOrder)
	if err != nil {
		return nil, err
	}
	return &orchestratorv1.ListRequestsResponse{Requests: page, NextPageToken: next}, nil
}

// requestFilter names a ListRequests call's filters, and the extra
// name/value pairs, for its page tokens.
func requestFilter(req *orchestratorv1.ListRequestsRequest, extra ...string) string {
	pairs := []string{"task_id", req.GetTaskId(), "state", req.GetState().String()}
	if req.GetAwaitingSettlement() {
		// Named only when set, so tokens of calls without it stay valid.
		pairs = append(pairs, "awaiting_settlement", "true")
	}
	return paging.Filter(append(pairs, extra...)...)
}

// requestMatches reports whether r passes a ListRequests call's filters.
func requestMatches(req *orchestratorv1.ListRequestsRequest, r *orchestratorv1.ToolRequest) bool {
	if st := req.GetState(); st != orchestratorv1.RequestState_REQUEST_STATE_UNSPECIFIED && r.GetState() != st {
		return false
	}
	return !req.GetAwaitingSettlement() || awaitingSettlement(r)
}

// allowedOn reports whether policy lets the caller take action on request
// r of task t, asked as the action's own RPC asks (the task's attributes
// and the capability), so that a list shows what the caller could act on.
func (s *Server) allowedOn(ctx context.Context, action string, t *orchestratorv1.Task, r *orchestratorv1.ToolRequest) (bool, error) {
	attrs := taskAttributes(t)
	attrs["capability"] = r.GetCapability()
	_, ref, err := s.authz.Check(ctx, action, authz.Resource{Type: "request", ID: r.GetId()}, attrs)
	return ref == nil, err
}

// actionable returns, across every task, the requests waiting on a person
// that the caller may take action on: read from the store's index of
// unsettled requests (which holds every request awaiting approval or
// settlement, never the executed and refused), kept when keep holds for
// the request and taskOK (nil: any) for its task, then decided by policy
// one by one (allowedOn). A request whose task is gone is left out.
func (s *Server) actionable(ctx context.Context, action string, keep func(*orchestratorv1.ToolRequest) bool, taskOK func(*orchestratorv1.Task) bool) ([]*orchestratorv1.ToolRequest, error) {
	rs, err := s.st.ListUnsettledRequests(ctx)
	if err != nil {
		return nil, s.internal(ctx, "list unsettled requests", err)
	}
	tasks := map[string]*orchestratorv1.Task{}
	var out []*orchestratorv1.ToolRequest
	for _, r := range rs {
		if !keep(r) {
			continue
		}
		t, seen := tasks[r.GetTaskId()]
		if !seen {
			t, err = s.st.GetTask(ctx, r.GetTaskId())
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				return nil, s.internal(ctx, "load task", err)
			}
			tasks[r.GetTaskId()] = t
		}
		if t == nil || (taskOK != nil && !taskOK(t)) {
			continue
		}
		ok, err := s.allowedOn(ctx, action, t, r)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, r)
		}
	}
	return out, nil
}

// ListPendingApprovals returns the requests of active tasks waiting for a
// person that the caller may approve: policy decides each as Approve
// would (request.approve with the task's requester and actor and the
// capability), so separation of duties leaves out the caller's own
// tasks. Expired approvals are left out: approving them would fail. The
// requests are read from the store's index of unsettled requests, not
// from every request of every active task.
func (s *Server) ListPendingApprovals(ctx context.Context, req *orchestratorv1.ListPendingApprovalsRequest) (*orchestratorv1.ListPendingApprovalsResponse, error) {
	c, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	filter := paging.Filter("caller", c.ID, "task_id", req.GetTaskId(), "capability", req.GetCapability())
	if _, err := paging.After(req, filter); err != nil {
		return nil, err
	}
	now := s.now()
	// Each request is asked about as Approve would ask, so a policy on any
	// of its attributes is honoured.
	pending, err := s.actionable(ctx, authz.RequestApprove, func(r *orchestratorv1.ToolRequest) bool {
		a := r.GetApproval()
		return r.GetState() == orchestratorv1.RequestState_REQUEST_STATE_AWAITING_APPROVAL && a != nil && a.GetUseTime() == nil &&
			now.Before(a.GetExpireTime().AsTime()) &&
			(req.GetTaskId() == "" || r.GetTaskId() == req.GetTaskId()) &&
			(req.GetCapability() == "" || r.GetCapability() == req.GetCapability())
	}, func(t *orchestratorv1.Task) bool { return t.GetState() == orchestratorv1.TaskState_TASK_STATE_ACTIVE })
	if err != nil {
		return nil, err
	}
	page, next, err := paging.Page(req, filter, pending, requestOrder)
	if err != nil {
		return nil, err
	}
	return &orchestratorv1.ListPendingApprovalsResponse{Requests: page, NextPageToken: next}, nil
}

// WaitingRequests reads from st, for the metrics, when each request now
// waiting on a person started to wait: those awaiting approval (since
// their last change) and those whose unknown outcome awaits settlement
// (since their attempt ended). Both are in the store's index of unsettled
// requests.
func WaitingRequests(st ostore.Store) telemetry.WaitingRequests {
	return func(ctx context.Context) (telemetry.Waiting, error) {
		rs, err := st.ListUnsettledRequests(ctx)
		if err != nil {
			return telemetry.Waiting{}, err
		}
		var w telemetry.Waiting
		for _, r := range rs {
			switch {
			case r.GetState() == orchestratorv1.RequestState_REQUEST_STATE_AWAITING_APPROVAL:
				w.Approvals = append(w.Approvals, r.GetUpdateTime().AsTime())
			case awaitingSettlement(r):
				since := lastAttempt(r).GetEndTime()
				if since == nil {
					since = r.GetUpdateTime()
				}
				w.Settlements = append(w.Settlements, since.AsTime())
			}
		}
		return w, nil
	}
}
