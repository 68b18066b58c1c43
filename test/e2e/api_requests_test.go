package e2e_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/v0m3/v0m3/demo/scenario"
	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/testkit"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
)

// approvingAuthor is an author who is also an approver: separation of
// duties must keep his own requests out of what he may approve.
var approvingAuthor = scenario.Person{ID: "carol", Groups: []string{"authors", "approvers"}}

func pendingIDs(t *testing.T, c stack, p scenario.Person, req *orchestratorv1.ListPendingApprovalsRequest) []string {
	t.Helper()
	r, err := c.Orchestrator.ListPendingApprovals(testkit.As(c, p), req)
	if err != nil {
		t.Fatalf("pending approvals for %s: %v", p.ID, err)
	}
	var ids []string
	for _, q := range r.GetRequests() {
		if q.GetState() != orchestratorv1.RequestState_REQUEST_STATE_AWAITING_APPROVAL || q.GetApproval().GetSummary() == "" {
			t.Errorf("listed %s in state %v with approval %v", q.GetId(), q.GetState(), q.GetApproval())
		}
		ids = append(ids, q.GetId())
	}
	return ids
}

// recvUntil reads stream until an event of type typ for request, failing
// after a deadline rather than hanging.
func recvUntil(t *testing.T, stream orchestratorv1.OrchestratorService_WatchTaskClient, request, typ string) []string {
	t.Helper()
	var seen []string
	done := make(chan error, 1)
	go func() {
		for {
			ev, err := stream.Recv()
			if err != nil {
				done <- err
				return
			}
			seen = append(seen, ev.GetType())
			if ev.GetRequestId() == request && ev.GetType() == typ {
				done <- nil
				return
			}
		}
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("watch ended before %s of %s: %v (saw %v)", typ, request, err, seen)
		}
		return seen
	case <-time.After(90 * time.Second):
		t.Fatalf("no %s of %s within 90 s", typ, request)
		return nil
	}
}

// TestPendingApprovalsCompleteAndAsync lists what waits for a reviewer
// (only what the caller may approve), approves with return_immediately
// and follows the execution with WatchTask, refuses to complete the task
// while the request is in flight, then completes it: later submissions
// are refused and nothing more is rendered.
func TestPendingApprovalsCompleteAndAsync(t *testing.T) {
	t.Parallel()
	s := startSuite(t, t.TempDir())
	c := stackOf(s)
	env := connectRenderer(t, c, "--delay", "2s")
	aliceTask := startPreviewTask(t, c).GetTask().GetId()
	carolStart, err := c.Orchestrator.StartTask(testkit.As(c, approvingAuthor), &orchestratorv1.StartTaskRequest{Profile: "preview", Purpose: "carol's preview"})
	if err != nil {
		t.Fatal(err)
	}
	carolTask := carolStart.GetTask().GetId()
	aliceReq := submitPreview(t, c, aliceTask, "call-1")
	args, _ := structpb.NewStruct(map[string]any{"document_revision": 31, "profile": 4})
	carolReq, err := c.Orchestrator.SubmitToolRequest(testkit.As(c, approvingAuthor), &orchestratorv1.SubmitToolRequestRequest{
		TaskId: carolTask, ProviderCallId: "c-1", Capability: renderPreview, Arguments: args, DocumentDigest: documentDigest,
	})
	if err != nil || carolReq.GetState() != orchestratorv1.RequestState_REQUEST_STATE_AWAITING_APPROVAL {
		t.Fatalf("carol's preview = %v, %v", carolReq.GetState(), err)
	}

	for _, tc := range []struct {
		name string
		as   scenario.Person
		req  *orchestratorv1.ListPendingApprovalsRequest
		want []string
	}{
		{"an approver sees both", approver, &orchestratorv1.ListPendingApprovalsRequest{}, []string{aliceReq.GetId(), carolReq.GetId()}},
		{"an approver pages", approver, &orchestratorv1.ListPendingApprovalsRequest{PageSize: 1}, []string{aliceReq.GetId()}},
		{"by task", approver, &orchestratorv1.ListPendingApprovalsRequest{TaskId: carolTask}, []string{carolReq.GetId()}},
		{"by capability", approver, &orchestratorv1.ListPendingApprovalsRequest{Capability: scenario.Retrieve}, nil},
		{"an approving author: not his own", approvingAuthor, &orchestratorv1.ListPendingApprovalsRequest{}, []string{aliceReq.GetId()}},
		{"the requester: none of her own", scenario.Alice, &orchestratorv1.ListPendingApprovalsRequest{}, nil},
		{"an author without the role: none", scenario.Bob, &orchestratorv1.ListPendingApprovalsRequest{}, nil},
		{"an auditor reads but does not approve", scenario.Auditor, &orchestratorv1.ListPendingApprovalsRequest{}, nil},
		{"an unknown task", approver, &orchestratorv1.ListPendingApprovalsRequest{TaskId: "task_nope"}, nil},
	} {
		t.Run("pending/"+tc.name, func(t *testing.T) {
			if got := pendingIDs(t, c, tc.as, tc.req); !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
	// Paging on, with the approver's token: the second page.
	first, err := c.Orchestrator.ListPendingApprovals(testkit.As(c, approver), &orchestratorv1.ListPendingApprovalsRequest{PageSize: 1})
	if err != nil || first.GetNextPageToken() == "" {
		t.Fatal(first, err)
	}
	second := pendingIDs(t, c, approver, &orchestratorv1.ListPendingApprovalsRequest{PageSize: 1, PageToken: first.GetNextPageToken()})
	if !slices.Equal(second, []string{carolReq.GetId()}) {
		t.Errorf("second page %v", second)
	}
	// Another caller may not use it.
	if _, err := c.Orchestrator.ListPendingApprovals(testkit.As(c, approvingAuthor), &orchestratorv1.ListPendingApprovalsRequest{PageSize: 1, PageToken: first.GetNextPageToken()}); !apierror.Is(err, codes.InvalidArgument, "PAGE_TOKEN_FILTER_MISMATCH") {
		t.Errorf("another caller's token = %v", err)
	}
	if _, err := c.Orchestrator.ListPendingApprovals(context.Background(), &orchestratorv1.ListPendingApprovalsRequest{}); apierror.Code(err) != codes.Unauthenticated {
		t.Errorf("without a token = %v, want UNAUTHENTICATED", err)
	}

	// Approve alice's request without waiting for the render.
	ctx, cancel := context.WithCancel(testkit.As(c, scenario.Alice))
	defer cancel()
	stream, err := c.Orchestrator.WatchTask(ctx, &orchestratorv1.WatchTaskRequest{TaskId: aliceTask})
	if err != nil {
		t.Fatal(err)
	}
	startApprove := time.Now()
	got, err := c.Orchestrator.Approve(testkit.As(c, approver), &orchestratorv1.ApproveRequest{RequestId: aliceReq.GetId(), DocumentDigest: documentDigest, ReturnImmediately: true})
	if err != nil || got.GetState() != orchestratorv1.RequestState_REQUEST_STATE_APPROVED || got.GetApproval().GetApprover() != approver.ID {
		t.Fatalf("approve, return immediately = %v, %v; want APPROVED", got.GetState(), err)
	}
	if time.Since(startApprove) >= 2*time.Second {
		t.Errorf("approve with return_immediately took %v, longer than the renderer's 2 s reply delay", time.Since(startApprove))
	}
	// In flight: the task cannot be completed; nothing changes.
	_, err = c.Orchestrator.CompleteTask(testkit.As(c, scenario.Alice), &orchestratorv1.CompleteTaskRequest{Id: aliceTask})
	if !apierror.Is(err, codes.FailedPrecondition, "REQUESTS_IN_FLIGHT") || apierror.Info(err).GetMetadata()["request_ids"] != aliceReq.GetId() {
		t.Fatalf("complete while in flight = %v, want FAILED_PRECONDITION REQUESTS_IN_FLIGHT naming %s", err, aliceReq.GetId())
	}
	if tk, err := c.Orchestrator.GetTask(testkit.As(c, scenario.Alice), &orchestratorv1.GetTaskRequest{Id: aliceTask}); err != nil || tk.GetState() != orchestratorv1.TaskState_TASK_STATE_ACTIVE {
		t.Fatalf("after the refused completion the task is %v, %v", tk.GetState(), err)
	}
	seen := recvUntil(t, stream, aliceReq.GetId(), "request.executed")
	if !slices.Contains(seen, "request.approved") || slices.Index(seen, "request.approved") > slices.Index(seen, "request.executed") {
		t.Errorf("watched %v, want request.approved before request.executed", seen)
	}
	done, err := c.Orchestrator.GetRequest(testkit.As(c, scenario.Alice), &orchestratorv1.GetRequestRequest{Id: aliceReq.GetId()})
	if err != nil || done.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED || done.GetArtifactDigest() == "" {
		t.Fatalf("after the watched execution GetRequest = %v, %v", done.GetState(), err)
	}

	// Bob may not complete alice's task.
	if _, err := c.Orchestrator.CompleteTask(testkit.As(c, scenario.Bob), &orchestratorv1.CompleteTaskRequest{Id: aliceTask}); apierror.Code(err) != codes.PermissionDenied {
		t.Errorf("bob completing alice's task = %v, want PERMISSION_DENIED", err)
	}
	// A second request waits for a person when alice completes: refused.
	pending := submitPreview(t, c, aliceTask, "call-2")
	completed, err := c.Orchestrator.CompleteTask(testkit.As(c, scenario.Alice), &orchestratorv1.CompleteTaskRequest{Id: aliceTask, Reason: "document published"})
	if err != nil || completed.GetState() != orchestratorv1.TaskState_TASK_STATE_COMPLETED {
		t.Fatalf("complete = %v, %v", completed.GetState(), err)
	}
	if again, err := c.Orchestrator.CompleteTask(testkit.As(c, scenario.Alice), &orchestratorv1.CompleteTaskRequest{Id: aliceTask}); err != nil || again.GetState() != orchestratorv1.TaskState_TASK_STATE_COMPLETED {
		t.Errorf("completing again = %v, %v; want the completed task", again.GetState(), err)
	}
	if r, err := c.Orchestrator.GetRequest(testkit.As(c, scenario.Alice), &orchestratorv1.GetRequestRequest{Id: pending.GetId()}); err != nil ||
		r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_REFUSED || r.GetRefusalReason() != "TASK_COMPLETED" {
		t.Errorf("the request waiting at completion = %v %q, %v; want REFUSED TASK_COMPLETED", r.GetState(), r.GetRefusalReason(), err)
	}
	if _, err := approve(c, pending.GetId(), documentDigest); !apierror.Is(err, codes.FailedPrecondition, "REQUEST_NOT_AWAITING_APPROVAL") {
		t.Errorf("approving after completion = %v", err)
	}
	// New submissions are refused with a clear reason; nothing renders.
	_, err = c.Orchestrator.SubmitToolRequest(testkit.As(c, scenario.Alice), &orchestratorv1.SubmitToolRequestRequest{
		TaskId: aliceTask, ProviderCallId: "call-3", Capability: renderPreview, Arguments: args, DocumentDigest: documentDigest,
	})
	if !apierror.Is(err, codes.FailedPrecondition, "TASK_NOT_ACTIVE") || apierror.Info(err).GetMetadata()["state"] != "completed" {
		t.Errorf("submit after completion = %v, want FAILED_PRECONDITION TASK_NOT_ACTIVE state=completed", err)
	}
	if n := env.renders(t); n != 1 {
		t.Errorf("%d renders, want 1 (only the approved request)", n)
	}
	// A completed task cannot be cancelled; a cancelled one not completed.
	if _, err := c.Orchestrator.CancelTask(testkit.As(c, scenario.Alice), &orchestratorv1.CancelTaskRequest{Id: aliceTask}); !apierror.Is(err, codes.FailedPrecondition, "TASK_NOT_ACTIVE") {
		t.Errorf("cancel after completion = %v", err)
	}
	if _, err := c.Orchestrator.CancelTask(testkit.As(c, approvingAuthor), &orchestratorv1.CancelTaskRequest{Id: carolTask}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Orchestrator.CompleteTask(testkit.As(c, approvingAuthor), &orchestratorv1.CompleteTaskRequest{Id: carolTask}); !apierror.Is(err, codes.FailedPrecondition, "TASK_NOT_ACTIVE") {
		t.Errorf("complete after cancel = %v", err)
	}
	// Listed by state.
	r, err := c.Orchestrator.ListTasks(testkit.As(c, scenario.Alice), &orchestratorv1.ListTasksRequest{State: orchestratorv1.TaskState_TASK_STATE_COMPLETED})
	if err != nil || len(r.GetTasks()) != 1 || r.GetTasks()[0].GetId() != aliceTask {
		t.Errorf("completed tasks = %v, %v", r.GetTasks(), err)
	}
}

// TestErrorModel submits requests that end in each way and checks that
// the call's status and the recorded request agree: a refusal is an
// error whose ErrorInfo names the request and whose reason is the
// recorded refusal reason; an accepted request is the resource itself.
func TestErrorModel(t *testing.T) {
	t.Parallel()
	s := startSuite(t, t.TempDir())
	w := &world{t: t, s: s}
	w.connect(scenario.StdioFixture(v0m3Bin))
	task := w.startTask()
	other := w.startAs(scenario.Bob, "bob's review")
	id := task.GetTask().GetId()
	handle := scenario.FindHandle(scenario.FindOffered(task.GetCatalogue(), scenario.Retrieve), "Migration FAQ")
	foreign := scenario.FindHandle(scenario.FindOffered(other.GetCatalogue(), scenario.Retrieve), "Migration FAQ")
	wctx, cancel := context.WithCancel(testkit.As(w.s, scenario.Alice))
	defer cancel()
	stream, err := s.Orchestrator.WatchTask(wctx, &orchestratorv1.WatchTaskRequest{TaskId: id})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name       string
		capability string
		args       map[string]any
		async      bool
		code       codes.Code
		reason     string
		state      orchestratorv1.RequestState
	}{
		{"executed", scenario.Retrieve, map[string]any{"source": handle, "query": "migration"}, false,
			codes.OK, "", orchestratorv1.RequestState_REQUEST_STATE_EXECUTED},
		{"accepted, executing", scenario.Retrieve, map[string]any{"source": handle, "query": "migration"}, true,
			codes.OK, "", orchestratorv1.RequestState_REQUEST_STATE_REQUESTED},
		{"not offered", scenario.Deliver, map[string]any{}, false,
			codes.PermissionDenied, "CAPABILITY_NOT_OFFERED", orchestratorv1.RequestState_REQUEST_STATE_REFUSED},
		{"not offered, async", scenario.Deliver, map[string]any{}, true,
			codes.PermissionDenied, "CAPABILITY_NOT_OFFERED", orchestratorv1.RequestState_REQUEST_STATE_REFUSED},
		{"unknown argument", scenario.Retrieve, map[string]any{"source": handle, "query": "q", "path": "/etc/passwd"}, false,
			codes.InvalidArgument, "", orchestratorv1.RequestState_REQUEST_STATE_REFUSED},
		{"another task's handle", scenario.Retrieve, map[string]any{"source": foreign, "query": "q"}, false,
			codes.PermissionDenied, "", orchestratorv1.RequestState_REQUEST_STATE_REFUSED},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := s.Orchestrator.SubmitToolRequest(testkit.As(w.s, scenario.Alice), &orchestratorv1.SubmitToolRequestRequest{
				TaskId: id, ProviderCallId: "call/" + tc.name, Capability: tc.capability,
				Arguments: scenario.MustStruct(tc.args), ReturnImmediately: tc.async,
			})
			if apierror.Code(err) != tc.code || (tc.reason != "" && apierror.Reason(err) != tc.reason) {
				t.Fatalf("submit = %v, want %v %s", err, tc.code, tc.reason)
			}
			requestID := got.GetId()
			if err != nil {
				requestID = apierror.Info(err).GetMetadata()["request_id"]
				if requestID == "" {
					t.Fatalf("the refusal %v does not name the request", err)
				}
			} else if got.GetState() != tc.state {
				t.Errorf("returned state %v, want %v", got.GetState(), tc.state)
			}
			rec, gerr := s.Orchestrator.GetRequest(testkit.As(w.s, scenario.Alice), &orchestratorv1.GetRequestRequest{Id: requestID})
			if gerr != nil {
				t.Fatalf("GetRequest(%s): %v", requestID, gerr)
			}
			if rec.GetProviderCallId() != "call/"+tc.name || rec.GetTaskId() != id {
				t.Errorf("the named request is %s of %s", rec.GetProviderCallId(), rec.GetTaskId())
			}
			if err != nil {
				if rec.GetState() != orchestratorv1.RequestState_REQUEST_STATE_REFUSED || rec.GetRefusalReason() != apierror.Reason(err) ||
					rec.GetRefusalCode() != strings.ToUpper(strcase(apierror.Code(err).String())) {
					t.Errorf("recorded %v %q %q, the error says %v %s", rec.GetState(), rec.GetRefusalCode(), rec.GetRefusalReason(), apierror.Code(err), apierror.Reason(err))
				}
				// Submitting the same call again: the same error, the same
				// request.
				_, again := s.Orchestrator.SubmitToolRequest(testkit.As(w.s, scenario.Alice), &orchestratorv1.SubmitToolRequestRequest{
					TaskId: id, ProviderCallId: "call/" + tc.name, Capability: tc.capability,
					Arguments: scenario.MustStruct(tc.args), ReturnImmediately: tc.async,
				})
				if apierror.Code(again) != apierror.Code(err) || apierror.Reason(again) != apierror.Reason(err) ||
					apierror.Info(again).GetMetadata()["request_id"] != requestID {
					t.Errorf("resubmitted: %v, want %v naming %s", again, err, requestID)
				}
				return
			}
			if tc.async {
				// Followed to its end with WatchTask, then read.
				recvUntil(t, stream, requestID, "request.executed")
				if rec, gerr = s.Orchestrator.GetRequest(testkit.As(w.s, scenario.Alice), &orchestratorv1.GetRequestRequest{Id: requestID}); gerr != nil {
					t.Fatal(gerr)
				}
				if rec.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED || len(rec.GetExcerpts()) == 0 {
					t.Errorf("the background execution ended %v with %d excerpts", rec.GetState(), len(rec.GetExcerpts()))
				}
				return
			}
			if rec.GetState() != tc.state {
				t.Errorf("recorded %v, returned %v", rec.GetState(), got.GetState())
			}
		})
	}
	// Not recorded: a caller without authority gets no request id and
	// leaves no request behind.
	_, err = s.Orchestrator.SubmitToolRequest(testkit.As(w.s, scenario.Bob), &orchestratorv1.SubmitToolRequestRequest{
		TaskId: id, ProviderCallId: "bob", Capability: scenario.Retrieve, Arguments: scenario.MustStruct(map[string]any{"source": handle, "query": "q"}),
	})
	if apierror.Code(err) != codes.PermissionDenied || apierror.Info(err).GetMetadata()["request_id"] != "" {
		t.Errorf("bob submitting to alice's task = %v, want PERMISSION_DENIED without a request", err)
	}
	all, err := s.Orchestrator.ListRequests(testkit.As(w.s, scenario.Alice), &orchestratorv1.ListRequestsRequest{TaskId: id})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range all.GetRequests() {
		if r.GetProviderCallId() == "bob" {
			t.Error("bob's refused call left a request")
		}
	}
}

// strcase turns a code's Go name ("PermissionDenied") into snake case
// ("Permission_Denied").
func strcase(s string) string {
	var b strings.Builder
	for i, r := range s {
		if i > 0 && unicode.IsUpper(r) {
			b.WriteByte('_')
		}
		b.WriteRune(r)
	}
	return b.String()
}
