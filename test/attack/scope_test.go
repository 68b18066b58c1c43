package attack_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/store"
	"github.com/v0m3/v0m3/internal/testkit"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	"github.com/v0m3/v0m3/services/policy"
	"github.com/v0m3/v0m3/suite"
)

const (
	inScope    = "v0m3-sources://notes/api-migration"
	outOfScope = "v0m3-sources://notes/salary-review"
)

// TestHandlesOnlyForTheTaskScope: policy mints a handle only for a target
// in the scope the orchestrator registered when the task started, for the
// task's requester; only the orchestrator may register or mint; a refused
// mint stores nothing.
func TestHandlesOnlyForTheTaskScope(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := suite.Start(context.Background(), suite.Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	orch := peers(t, s, identity.Orchestrator)

	// Starting a task registers its requester and scope with policy.
	started, err := s.Orchestrator.StartTask(testkit.As(s, alice), &orchestratorv1.StartTaskRequest{
		Profile: "source_review", Purpose: "review the migration sources",
		SourceScope: []*orchestratorv1.SourceRef{{Uri: inScope, Title: "API migration guide"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	task := started.GetTask().GetId()
	mint := func(ctx context.Context, c policyv1.PolicyServiceClient, taskID, requester, target string) error {
		_, err := c.MintHandle(ctx, &policyv1.MintHandleRequest{
			TaskId: taskID, Requester: requester, Capability: "retrieve_authorized_source", Target: target,
			Label: "note", MappingId: "map_any", MappingRevision: 1,
		})
		return err
	}

	refusals := []struct {
		name       string
		err        error
		wantCode   codes.Code
		wantReason string
	}{
		{"orchestrator mints outside the scope", mint(context.Background(), orch.Policy, task, alice.ID, outOfScope),
			codes.PermissionDenied, "HANDLE_TARGET_OUT_OF_SCOPE"},
		{"orchestrator mints for another requester", mint(context.Background(), orch.Policy, task, "mallory", inScope),
			codes.PermissionDenied, "TASK_REQUESTER_MISMATCH"},
		{"orchestrator mints for a task never started", mint(context.Background(), orch.Policy, "task_forged", alice.ID, inScope),
			codes.FailedPrecondition, "TASK_NOT_REGISTERED"},
		{"the scope is widened afterwards", func() error {
			_, err := orch.Policy.RegisterTask(context.Background(), &policyv1.RegisterTaskRequest{
				TaskId: task, Requester: alice.ID, SourceScope: []string{inScope, outOfScope}})
			return err
		}(), codes.AlreadyExists, "TASK_ALREADY_REGISTERED"},
		{"a person mints directly", mint(testkit.As(s, alice), s.Policy, task, alice.ID, inScope),
			codes.PermissionDenied, "PEER_NOT_ALLOWED"},
		{"a person registers a task", func() error {
			_, err := s.Policy.RegisterTask(testkit.As(s, alice), &policyv1.RegisterTaskRequest{
				TaskId: "task_mine", Requester: alice.ID, SourceScope: []string{outOfScope}})
			return err
		}(), codes.PermissionDenied, "PEER_NOT_ALLOWED"},
		{"the adapter mints", mint(context.Background(), peers(t, s, identity.Adapter).Policy, task, alice.ID, inScope),
			codes.PermissionDenied, "PEER_NOT_ALLOWED"},
		{"the adapter registers a task", func() error {
			_, err := peers(t, s, identity.Adapter).Policy.RegisterTask(context.Background(), &policyv1.RegisterTaskRequest{
				TaskId: "task_adapter", Requester: alice.ID, SourceScope: []string{outOfScope}})
			return err
		}(), codes.PermissionDenied, "PEER_NOT_ALLOWED"},
	}
	for _, r := range refusals {
		if !apierror.Is(r.err, r.wantCode, r.wantReason) {
			t.Errorf("%s: err = %v (reason %q), want %v %s", r.name, r.err, apierror.Reason(r.err), r.wantCode, r.wantReason)
		}
	}
	// In scope, for the requester, by the orchestrator: minted.
	if err := mint(context.Background(), orch.Policy, task, alice.ID, inScope); err != nil {
		t.Fatalf("in-scope mint: %v", err)
	}

	// What policy stored: the one handle minted in scope, and no scope for
	// the tasks others tried to register.
	s.Close()
	db, err := store.Open(filepath.Join(dir, suite.Policy+".db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	st := policy.NewBoltStore(db)
	if n, err := st.DeleteExpiredHandles(context.Background(), time.Now().AddDate(100, 0, 0)); err != nil || n != 1 {
		t.Errorf("policy stored %d handles (%v), want exactly the one minted in scope", n, err)
	}
	for _, id := range []string{"task_mine", "task_adapter", "task_forged"} {
		if ts, err := st.GetTaskScope(context.Background(), id); err == nil {
			t.Errorf("a refused registration was stored: %v", ts)
		}
	}
	if ts, err := st.GetTaskScope(context.Background(), task); err != nil || len(ts.GetSourceScope()) != 1 || ts.GetSourceScope()[0] != inScope || ts.GetRequester() != alice.ID {
		t.Errorf("task %s scope = %v, %v; want alice with only %s", task, ts, err, inScope)
	}
}
