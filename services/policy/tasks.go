package policy

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	"github.com/v0m3/v0m3/services/internal/apierror"
	"github.com/v0m3/v0m3/services/internal/store"
)

// Bounds of a registered source scope.
const (
	maxScopeTargets = 1000
	maxTargetBytes  = 4096
)

// RegisterTask records a task's requester and source scope, once. Policy
// does not own tasks; it keeps what it needs to mint handles only within
// a task's scope, written by the orchestrator when the task starts.
func (s *Server) RegisterTask(ctx context.Context, req *policyv1.RegisterTaskRequest) (*policyv1.TaskScope, error) {
	var bad []apierror.FieldViolation
	if req.GetTaskId() == "" {
		bad = append(bad, apierror.FieldViolation{Field: "task_id", Description: "required"})
	}
	if req.GetRequester() == "" {
		bad = append(bad, apierror.FieldViolation{Field: "requester", Description: "required"})
	}
	if len(req.GetSourceScope()) > maxScopeTargets {
		bad = append(bad, apierror.FieldViolation{Field: "source_scope", Description: fmt.Sprintf("at most %d targets", maxScopeTargets)})
	}
	seen := map[string]bool{}
	for i, t := range req.GetSourceScope() {
		field := fmt.Sprintf("source_scope[%d]", i)
		switch {
		case t == "":
			bad = append(bad, apierror.FieldViolation{Field: field, Description: "empty target"})
		case len(t) > maxTargetBytes:
			bad = append(bad, apierror.FieldViolation{Field: field, Description: fmt.Sprintf("at most %d bytes", maxTargetBytes)})
		case seen[t]:
			bad = append(bad, apierror.FieldViolation{Field: field, Description: "duplicate target"})
		}
		seen[t] = true
	}
	if len(bad) > 0 {
		return nil, apierror.InvalidArgument("INVALID_TASK_SCOPE", "the task registration is invalid", bad...)
	}
	ts := &policyv1.TaskScope{
		TaskId:       req.GetTaskId(),
		Requester:    req.GetRequester(),
		SourceScope:  slices.Sorted(slices.Values(req.GetSourceScope())),
		RegisterTime: timestamppb.New(s.now()),
	}
	err := s.store.CreateTaskScope(ctx, ts)
	if errors.Is(err, store.ErrExists) {
		prev, gerr := s.store.GetTaskScope(ctx, ts.GetTaskId())
		if gerr != nil {
			return nil, apierror.Propagate(fmt.Errorf("read task scope: %w", gerr), "policy: register task")
		}
		// A retry of the same registration is answered with the record;
		// a different one never replaces it.
		if prev.GetRequester() == ts.GetRequester() && slices.Equal(prev.GetSourceScope(), ts.GetSourceScope()) {
			return prev, nil
		}
		s.log.WarnContext(ctx, "task registration refused: already registered differently", "task_id", ts.GetTaskId())
		return nil, apierror.New(codes.AlreadyExists, "TASK_ALREADY_REGISTERED",
			fmt.Sprintf("task %s is already registered with another requester or source scope; a task's scope never changes", ts.GetTaskId()),
			map[string]string{"task_id": ts.GetTaskId()})
	}
	if err != nil {
		return nil, apierror.Propagate(fmt.Errorf("store task scope: %w", err), "policy: register task")
	}
	s.log.InfoContext(ctx, "task registered", "task_id", ts.GetTaskId(), "requester", ts.GetRequester(), "targets", len(ts.GetSourceScope()))
	return proto.CloneOf(ts), nil
}

// inScope returns nil when the task is registered for requester and target
// is in its source scope; else the refusal. The error never names the
// target.
func (s *Server) inScope(ctx context.Context, taskID, requester, target string) error {
	ts, err := s.store.GetTaskScope(ctx, taskID)
	if errors.Is(err, store.ErrNotFound) {
		return apierror.New(codes.FailedPrecondition, "TASK_NOT_REGISTERED",
			fmt.Sprintf("task %s is not registered with policy; the orchestrator registers a task's scope (RegisterTask) before it asks for handles", taskID),
			map[string]string{"task_id": taskID})
	}
	if err != nil {
		return apierror.Propagate(fmt.Errorf("read task scope: %w", err), "policy: mint handle")
	}
	if ts.GetRequester() != requester {
		return apierror.New(codes.PermissionDenied, "TASK_REQUESTER_MISMATCH",
			fmt.Sprintf("task %s was registered for another requester; a handle is minted only for the task's requester", taskID),
			map[string]string{"task_id": taskID})
	}
	if _, found := slices.BinarySearch(ts.GetSourceScope(), target); !found {
		return apierror.New(codes.PermissionDenied, "HANDLE_TARGET_OUT_OF_SCOPE",
			fmt.Sprintf("the target is not in task %s's source scope; a handle is minted only for a source the task was started with", taskID),
			map[string]string{"task_id": taskID})
	}
	return nil
}
