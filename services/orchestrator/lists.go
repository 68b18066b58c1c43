package orchestrator

import (
	"context"
	"errors"
	"slices"

	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	"github.com/v0m3/v0m3/services/identity"
	"github.com/v0m3/v0m3/services/internal/authz"
	"github.com/v0m3/v0m3/services/internal/paging"
	"github.com/v0m3/v0m3/services/internal/store"
)

// Lists read everything they may show from the store and page it (see
// services/internal/paging): tasks and requests are ordered by creation
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

// ListRequests returns a task's requests (in one state, when asked),
// oldest first.
func (s *Server) ListRequests(ctx context.Context, req *orchestratorv1.ListRequestsRequest) (*orchestratorv1.ListRequestsResponse, error) {
	if req.GetTaskId() == "" {
		return nil, missing("task_id")
	}
	filter := paging.Filter("task_id", req.GetTaskId(), "state", req.GetState().String())
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
	if st := req.GetState(); st != orchestratorv1.RequestState_REQUEST_STATE_UNSPECIFIED {
		rs = slices.DeleteFunc(rs, func(r *orchestratorv1.ToolRequest) bool { return r.GetState() != st })
	}
	page, next, err := paging.Page(req, filter, rs, requestOrder)
	if err != nil {
		return nil, err
	}
	return &orchestratorv1.ListRequestsResponse{Requests: page, NextPageToken: next}, nil
}

// ListPendingApprovals returns the requests of active tasks waiting for a
// person that the caller may approve: policy decides each as Approve
// would (request.approve with the task's requester and actor and the
// capability), so separation of duties leaves out the caller's own
// tasks. Expired approvals are left out: approving them would fail.
func (s *Server) ListPendingApprovals(ctx context.Context, req *orchestratorv1.ListPendingApprovalsRequest) (*orchestratorv1.ListPendingApprovalsResponse, error) {
	c, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	filter := paging.Filter("caller", c.ID, "task_id", req.GetTaskId(), "capability", req.GetCapability())
	if _, err := paging.After(req, filter); err != nil {
		return nil, err
	}
	var tasks []*orchestratorv1.Task
	if id := req.GetTaskId(); id != "" {
		t, err := s.st.GetTask(ctx, id)
		switch {
		case errors.Is(err, store.ErrNotFound):
			// Nothing to approve; whether the task exists is not this
			// caller's to learn here.
		case err != nil:
			return nil, s.internal(ctx, "load task", err)
		case t.GetState() == orchestratorv1.TaskState_TASK_STATE_ACTIVE:
			tasks = append(tasks, t)
		}
	} else if tasks, err = s.st.ListTasks(ctx, orchestratorv1.TaskState_TASK_STATE_ACTIVE); err != nil {
		return nil, s.internal(ctx, "list tasks", err)
	}
	now := s.now()
	var pending []*orchestratorv1.ToolRequest
	for _, t := range tasks {
		rs, err := s.st.ListRequests(ctx, t.GetId())
		if err != nil {
			return nil, s.internal(ctx, "list requests", err)
		}
		for _, r := range rs {
			if r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_AWAITING_APPROVAL || r.GetApproval() == nil ||
				r.GetApproval().GetUseTime() != nil || !now.Before(r.GetApproval().GetExpireTime().AsTime()) ||
				(req.GetCapability() != "" && r.GetCapability() != req.GetCapability()) {
				continue
			}
			// Each request is asked about as Approve would ask, so a
			// policy on any of its attributes is honoured.
			attrs := taskAttributes(t)
			attrs["capability"] = r.GetCapability()
			_, ref, err := s.authz.Check(ctx, authz.RequestApprove, authz.Resource{Type: "request", ID: r.GetId()}, attrs)
			if err != nil {
				return nil, err
			}
			ok := ref == nil
			if ok {
				pending = append(pending, r)
			}
		}
	}
	page, next, err := paging.Page(req, filter, pending, requestOrder)
	if err != nil {
		return nil, err
	}
	return &orchestratorv1.ListPendingApprovalsResponse{Requests: page, NextPageToken: next}, nil
}
