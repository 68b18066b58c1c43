package policy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/handlekind"
	"github.com/v0m3/v0m3/internal/store"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// Bounds of a registered source scope.
const (
	maxScopeTargets = 1000
	maxTargetBytes  = 4096
)

// RegisterTask records a task's requester, source scope and budget, once.
// Policy does not own tasks; it keeps what it needs to mint handles only
// within a task's scope and to charge the task against its own budget,
// written by the orchestrator when the task starts.
//
// The budget is the task profile's default budget. A dimension left 0
// takes the configured task budget (Deps.TaskBudget) when charged; the
// configured task budget is also the platform's ceiling, and a budget above
// it in any dimension is refused (BUDGET_ABOVE_CEILING) rather than
// quietly lowered, so a profile never promises what policy will not give.
func (s *Server) RegisterTask(ctx context.Context, req *policyv1.RegisterTaskRequest) (*policyv1.TaskScope, error) {
	var bad []apierror.FieldViolation
	if req.GetTaskId() == "" {
		bad = append(bad, apierror.FieldViolation{Field: "task_id", Description: "required"})
	}
	if req.GetRequester() == "" {
		bad = append(bad, apierror.FieldViolation{Field: "requester", Description: "required"})
	}
	for _, sc := range []struct {
		field   string
		targets []string
	}{{"source_scope", req.GetSourceScope()}, {"artifact_scope", req.GetArtifactScope()}, {"destination_scope", req.GetDestinationScope()}} {
		bad = append(bad, checkScope(sc.field, sc.targets)...)
	}
	for _, d := range taskBudgetDims(req.GetBudget(), s.deps.TaskBudget) {
		if d.value < 0 {
			bad = append(bad, apierror.FieldViolation{Field: "budget." + d.field, Description: "must not be negative"})
		}
	}
	if len(bad) > 0 {
		return nil, apierror.InvalidArgument(apierror.ReasonFieldInvalid, "the task registration is invalid", bad...)
	}
	var above []apierror.FieldViolation
	var words []string
	for _, d := range taskBudgetDims(req.GetBudget(), s.deps.TaskBudget) {
		if d.value > d.ceiling {
			above = append(above, apierror.FieldViolation{Field: "budget." + d.field,
				Description: fmt.Sprintf("%d is above the ceiling %d", d.value, d.ceiling)})
			words = append(words, fmt.Sprintf("%s %d > %d", d.field, d.value, d.ceiling))
		}
	}
	if len(above) > 0 {
		s.log.WarnContext(ctx, "task registration refused: budget above the ceiling", "task_id", req.GetTaskId(), "above", words)
		return nil, apierror.InvalidArgument("BUDGET_ABOVE_CEILING",
			fmt.Sprintf("the task's budget is above policy's configured task budget, the platform's ceiling (%s); lower the task profile's default budget or raise policy's task budget",
				strings.Join(words, ", ")), above...)
	}
	budget := req.GetBudget()
	if proto.Equal(budget, &registryv1.TaskBudget{}) {
		// No budget and an all-default budget are the same registration.
		budget = nil
	}
	ts := &policyv1.TaskScope{
		TaskId:       req.GetTaskId(),
		Requester:    req.GetRequester(),
		SourceScope:  slices.Sorted(slices.Values(req.GetSourceScope())),
		RegisterTime: timestamppb.New(s.now()),
		Budget:       proto.CloneOf(budget),
		// Sorted, so that a retry compares equal and lookups can search.
		ArtifactScope:    slices.Sorted(slices.Values(req.GetArtifactScope())),
		DestinationScope: slices.Sorted(slices.Values(req.GetDestinationScope())),
	}
	err := s.store.CreateTaskScope(ctx, ts)
	if errors.Is(err, store.ErrExists) {
		prev, gerr := s.store.GetTaskScope(ctx, ts.GetTaskId())
		if gerr != nil {
			return nil, s.storeError(ctx, gerr, "read the task scope")
		}
		// A retry of the same registration is answered with the record;
		// a different one never replaces it.
		if prev.GetRequester() == ts.GetRequester() && slices.Equal(prev.GetSourceScope(), ts.GetSourceScope()) &&
			slices.Equal(prev.GetArtifactScope(), ts.GetArtifactScope()) && slices.Equal(prev.GetDestinationScope(), ts.GetDestinationScope()) &&
			proto.Equal(prev.GetBudget(), ts.GetBudget()) {
			return prev, nil
		}
		s.log.WarnContext(ctx, "task registration refused: already registered differently", "task_id", ts.GetTaskId())
		return nil, apierror.New(codes.AlreadyExists, "TASK_ALREADY_REGISTERED",
			fmt.Sprintf("task %s is already registered with another requester, scope or budget; a task's scope never changes", ts.GetTaskId()),
			map[string]string{"task_id": ts.GetTaskId()})
	}
	if err != nil {
		return nil, s.storeError(ctx, err, "store the task scope")
	}
	s.log.InfoContext(ctx, "task registered", "task_id", ts.GetTaskId(), "requester", ts.GetRequester(), "sources", len(ts.GetSourceScope()),
		"artifacts", len(ts.GetArtifactScope()), "destinations", len(ts.GetDestinationScope()))
	return proto.CloneOf(ts), nil
}

// checkScope returns what is wrong with one registered scope: too many
// targets, an empty, oversized or duplicate target.
func checkScope(field string, targets []string) []apierror.FieldViolation {
	var bad []apierror.FieldViolation
	if len(targets) > maxScopeTargets {
		bad = append(bad, apierror.FieldViolation{Field: field, Description: fmt.Sprintf("at most %d targets", maxScopeTargets)})
	}
	seen := map[string]bool{}
	for i, t := range targets {
		at := fmt.Sprintf("%s[%d]", field, i)
		switch {
		case t == "":
			bad = append(bad, apierror.FieldViolation{Field: at, Description: "empty target"})
		case len(t) > maxTargetBytes:
			bad = append(bad, apierror.FieldViolation{Field: at, Description: fmt.Sprintf("at most %d bytes", maxTargetBytes)})
		case seen[t]:
			bad = append(bad, apierror.FieldViolation{Field: at, Description: "duplicate target"})
		}
		seen[t] = true
	}
	return bad
}

// scopeOf returns a registered task's sorted targets of one handle kind.
func scopeOf(ts *policyv1.TaskScope, kind registryv1.HandleKind) []string {
	switch handlekind.Of(kind) {
	case registryv1.HandleKind_HANDLE_KIND_ARTIFACT:
		return ts.GetArtifactScope()
	case registryv1.HandleKind_HANDLE_KIND_DESTINATION:
		return ts.GetDestinationScope()
	case registryv1.HandleKind_HANDLE_KIND_SOURCE:
		return ts.GetSourceScope()
	}
	return nil
}

// maxTaskScopeEntries bounds the task scope cache: a few MiB at most.
const maxTaskScopeEntries = 8192

// taskScope returns a task's scope, from the cache or the store. A scope
// never changes once stored (CreateTaskScope refuses a second one and
// nothing deletes it), so a kept scope cannot go stale; saving the read
// matters because every charge, two per call, needs the scope. A task not
// registered is not kept: it may register later.
func (s *Server) taskScope(ctx context.Context, taskID string) (*policyv1.TaskScope, error) {
	return readThrough(ctx, s.scopes, taskID, s.store.GetTaskScope)
}

// inScope returns nil when the task is registered for requester and target
// is in its scope of the handle's kind; else the refusal. The error never
// names the target.
func (s *Server) inScope(ctx context.Context, taskID, requester string, kind registryv1.HandleKind, target string) error {
	ts, err := s.taskScope(ctx, taskID)
	if errors.Is(err, store.ErrNotFound) {
		return apierror.New(codes.FailedPrecondition, "TASK_NOT_REGISTERED",
			fmt.Sprintf("task %s is not registered with policy; the orchestrator registers a task's scope (RegisterTask) before it asks for handles", taskID),
			map[string]string{"task_id": taskID})
	}
	if err != nil {
		return s.storeError(ctx, err, "read the task scope")
	}
	if ts.GetRequester() != requester {
		return apierror.New(codes.PermissionDenied, "TASK_REQUESTER_MISMATCH",
			fmt.Sprintf("task %s was registered for another requester; a handle is minted only for the task's requester", taskID),
			map[string]string{"task_id": taskID})
	}
	if _, found := slices.BinarySearch(scopeOf(ts, kind), target); !found {
		name := handlekind.Name(kind)
		return apierror.New(codes.PermissionDenied, "HANDLE_TARGET_OUT_OF_SCOPE",
			fmt.Sprintf("the target is not in task %s's %s scope; a %s handle is minted only for a %s the task was started with", taskID, name, name, name),
			map[string]string{"task_id": taskID, "kind": name})
	}
	return nil
}

// taskBudgetDim is one dimension of a registered task budget beside the
// configured ceiling.
type taskBudgetDim struct {
	field          string
	value, ceiling int64
}

// taskBudgetDims lists a task budget's dimensions with their ceilings.
func taskBudgetDims(b *registryv1.TaskBudget, ceiling Limits) []taskBudgetDim {
	return []taskBudgetDim{
		{"max_calls", b.GetMaxCalls(), ceiling.Calls},
		{"max_response_bytes", b.GetMaxResponseBytes(), ceiling.ResponseBytes},
		{"max_cost_micros", b.GetMaxCostMicros(), ceiling.CostMicros},
	}
}

// taskLimits are the limits a task is charged against: its registered
// budget, a dimension left 0 taking the configured task budget, and none
// above it (registration refuses that; the ceiling holds here too should
// the configuration have been lowered since).
func taskLimits(b *registryv1.TaskBudget, ceiling Limits) Limits {
	pick := func(v, c int64) int64 {
		if v <= 0 || v > c {
			return c
		}
		return v
	}
	return Limits{
		Calls:         pick(b.GetMaxCalls(), ceiling.Calls),
		ResponseBytes: pick(b.GetMaxResponseBytes(), ceiling.ResponseBytes),
		CostMicros:    pick(b.GetMaxCostMicros(), ceiling.CostMicros),
	}
}
