package attack_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	"github.com/v0m3/v0m3/suite"
)

// TestNobodyActsAsSomeoneElse plays mallory, who used to claim any
// requester, group or approver in a request body. Now who she is comes
// from her token: she cannot start a task as alice, read alice's task or
// trace, or decide alice's requests; alice reads her own; every refusal
// of an action on alice's task is in its trace.
func TestNobodyActsAsSomeoneElse(t *testing.T) {
	t.Parallel()
	s, err := suite.Start(context.Background(), suite.Config{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	ctx := context.Background()
	alice := s.As(ctx, "alice", "authors")
	mallory := s.As(ctx, "mallory", "authors")
	auditor := s.As(ctx, "auditor", "auditors")

	// Starting a task "for alice" needs the delegation role.
	_, err = s.Orchestrator.StartTask(mallory, &orchestratorv1.StartTaskRequest{
		Profile: "source_review", OnBehalfOf: &policyv1.Principal{Id: "alice", Groups: []string{"authors", "publishers"}}})
	if !apierror.Is(err, codes.PermissionDenied, "ROLE_NOT_GRANTED") {
		t.Fatalf("mallory starting a task for alice: %v", err)
	}

	task, err := s.Orchestrator.StartTask(alice, &orchestratorv1.StartTaskRequest{Profile: "source_review", Purpose: "review"})
	if err != nil {
		t.Fatal(err)
	}
	id := task.GetTask().GetId()
	if got := task.GetTask().GetRequester(); got.GetId() != "alice" || strings.Join(got.GetGroups(), ",") != "authors" {
		t.Fatalf("requester = %v, want alice of authors as her token says", got)
	}
	// A request alice's task refuses (nothing is offered), to decide on.
	req, err := s.Orchestrator.SubmitToolRequest(alice, &orchestratorv1.SubmitToolRequestRequest{TaskId: id, ProviderCallId: "c1", Capability: "deliver_approved_artifact"})
	if err == nil {
		t.Fatalf("a capability not offered was accepted: %v", req)
	}
	list, err := s.Orchestrator.ListRequests(alice, &orchestratorv1.ListRequestsRequest{TaskId: id})
	if err != nil || len(list.GetRequests()) != 1 {
		t.Fatalf("alice's requests: %v, %v", list, err)
	}
	reqID := list.GetRequests()[0].GetId()

	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"read alice's task", func() error {
			_, err := s.Orchestrator.GetTask(mallory, &orchestratorv1.GetTaskRequest{Id: id})
			return err
		}},
		{"submit to alice's task", func() error {
			_, err := s.Orchestrator.SubmitToolRequest(mallory, &orchestratorv1.SubmitToolRequestRequest{TaskId: id, ProviderCallId: "m1", Capability: "retrieve_authorized_source"})
			return err
		}},
		{"cancel alice's task", func() error {
			_, err := s.Orchestrator.CancelTask(mallory, &orchestratorv1.CancelTaskRequest{Id: id})
			return err
		}},
		{"deny alice's request", func() error {
			_, err := s.Orchestrator.Deny(mallory, &orchestratorv1.DenyRequest{RequestId: reqID})
			return err
		}},
		{"read alice's trace", func() error {
			_, err := s.Evidence.GetTrace(mallory, &evidencev1.GetTraceRequest{TaskId: id})
			return err
		}},
	} {
		if err := tc.call(); apierror.Code(err) != codes.PermissionDenied {
			t.Errorf("mallory may %s: %v", tc.name, err)
		}
	}

	// Alice's task is as she left it, and she reads her own trace.
	got, err := s.Orchestrator.GetTask(alice, &orchestratorv1.GetTaskRequest{Id: id})
	if err != nil || got.GetState() != orchestratorv1.TaskState_TASK_STATE_ACTIVE {
		t.Fatalf("alice's task after the attempts: %v, %v", got, err)
	}
	list, err = s.Orchestrator.ListRequests(alice, &orchestratorv1.ListRequestsRequest{TaskId: id})
	if err != nil || len(list.GetRequests()) != 1 || list.GetRequests()[0].GetState() != orchestratorv1.RequestState_REQUEST_STATE_REFUSED {
		t.Fatalf("alice's requests after the attempts: %v, %v", list, err)
	}
	trace, err := s.Evidence.GetTrace(alice, &evidencev1.GetTraceRequest{TaskId: id})
	if err != nil {
		t.Fatalf("alice reading her own trace: %v", err)
	}
	if _, err := s.Evidence.GetTrace(auditor, &evidencev1.GetTraceRequest{TaskId: id}); err != nil {
		t.Fatalf("an auditor reading the trace: %v", err)
	}
	refusals := 0
	for _, ev := range trace.GetEvents() {
		if p := ev.GetProduct(); p.GetKind() == evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_POLICY_DECISION && p.GetReason() == "ROLE_NOT_GRANTED" && strings.Contains(p.GetDetail(), "mallory") {
			refusals++
		}
	}
	if refusals != 4 {
		t.Errorf("the trace records %d of mallory's 4 refused actions on the task", refusals)
	}
}
