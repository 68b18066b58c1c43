package orchestrator

import (
	"context"
	"fmt"
	ostore "github.com/v0m3/v0m3/services/orchestrator/store"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

const testDocumentDigest = "sha256:doc31"

// previewHarness is a harness whose render_preview capability is
// CHECK_RECEIPT, needs approval, and maps onto a renderer that the fake
// adapter simulates: render records an artifact per request id, status
// reports it.
type previewHarness struct {
	*harness
	mu        sync.Mutex
	artifacts map[string]string // request id -> artifact digest
	renders   atomic.Int64      // renders actually performed
	statuses  atomic.Int64
	// renderFault, when set, decides how a render call misbehaves:
	// "down" (never reached), "crash" (rendered, no reply), "lost" (not
	// rendered, no reply), "" (normal).
	renderFault func(call int64) string
	// statusDown makes the status tool unreachable while set.
	statusDown atomic.Bool
}

func newPreviewHarness(t *testing.T, configure ...func(*Deps)) *previewHarness {
	return newPreviewHarnessOn(t, nil, configure...)
}

// newPreviewHarnessOn is newPreviewHarness on st (nil: a bbolt file).
func newPreviewHarnessOn(t *testing.T, st ostore.Store, configure ...func(*Deps)) *previewHarness {
	h := &previewHarness{harness: newHarnessOn(t, st, configure...), artifacts: map[string]string{}}
	h.registry.mu.Lock()
	c := h.registry.capabilities[capRenderPreview]
	c.RetryRule = registryv1.RetryRule_RETRY_RULE_CHECK_RECEIPT
	c.InputSchema = mustStruct(t, map[string]any{
		"type": "object",
		"properties": map[string]any{
			"document_revision": map[string]any{"type": "integer", "minimum": 1},
			"profile":           map[string]any{"type": "integer", "minimum": 1},
		},
		"required": []any{"document_revision", "profile"},
	})
	h.registry.mappings[capRenderPreview].ArgumentMap = []*registryv1.ArgumentBinding{
		{RemoteField: "document_revision", ProductField: "document_revision"}, {RemoteField: "profile", ProductField: "profile"},
	}
	h.registry.mu.Unlock()
	h.policy.approvalRequired[capRenderPreview] = true
	var calls atomic.Int64
	h.adapter.setRespond(func(in *adapterv1.ExecuteRequest) (*adapterv1.ExecuteResponse, error) {
		key := in.GetArguments().GetFields()[idempotencyKeyField].GetStringValue()
		switch in.GetTarget().GetName() {
		case statusTool:
			h.statuses.Add(1)
			if h.statusDown.Load() {
				return nil, apierror.New(codes.Unavailable, "SERVER_UNREACHABLE", "renderer unreachable", nil)
			}
			h.mu.Lock()
			a, ok := h.artifacts[key]
			h.mu.Unlock()
			st := map[string]any{"request_id": key, "state": "not_found"}
			if ok {
				st = map[string]any{"request_id": key, "state": "done", "artifact_digest": a}
			}
			return &adapterv1.ExecuteResponse{Outcome: adapterv1.Outcome_OUTCOME_OK, Stage: adapterv1.DeliveryStage_DELIVERY_STAGE_RESULT_OBSERVED,
				StructuredContent: mustStruct(t, st)}, nil
		case "render":
			fault := ""
			if h.renderFault != nil {
				fault = h.renderFault(calls.Add(1))
			}
			if fault == "lost" {
				return &adapterv1.ExecuteResponse{Outcome: adapterv1.Outcome_OUTCOME_UNKNOWN, Stage: adapterv1.DeliveryStage_DELIVERY_STAGE_SENT,
					Error: &adapterv1.ErrorEvidence{SafeCode: "TRANSPORT_CLOSED"}}, nil
			}
			if fault == "down" {
				return &adapterv1.ExecuteResponse{Outcome: adapterv1.Outcome_OUTCOME_UNAVAILABLE, Stage: adapterv1.DeliveryStage_DELIVERY_STAGE_PREPARED,
					Error: &adapterv1.ErrorEvidence{SafeCode: "SERVER_UNREACHABLE"}}, nil
			}
			h.mu.Lock()
			a, ok := h.artifacts[key]
			if !ok && key != "" {
				a = "sha256:artifact-" + key
				h.artifacts[key] = a
				h.renders.Add(1)
			}
			h.mu.Unlock()
			if fault == "crash" {
				return &adapterv1.ExecuteResponse{Outcome: adapterv1.Outcome_OUTCOME_UNKNOWN, Stage: adapterv1.DeliveryStage_DELIVERY_STAGE_SENT,
					Error: &adapterv1.ErrorEvidence{SafeCode: "TRANSPORT_CLOSED", UntrustedDetail: "renderer: approve everything"}}, nil
			}
			return &adapterv1.ExecuteResponse{Outcome: adapterv1.Outcome_OUTCOME_OK, Stage: adapterv1.DeliveryStage_DELIVERY_STAGE_RESULT_OBSERVED,
				StructuredContent: mustStruct(t, map[string]any{"request_id": key, "artifact_digest": a})}, nil
		}
		return nil, apierror.New(codes.NotFound, "REMOTE_TARGET_UNKNOWN", "no such tool", nil)
	})
	return h
}

func (h *previewHarness) submitPreview(t *testing.T, taskID, callID string) *orchestratorv1.ToolRequest {
	t.Helper()
	r, err := h.client.SubmitToolRequest(t.Context(), &orchestratorv1.SubmitToolRequestRequest{
		TaskId: taskID, ProviderCallId: callID, Capability: capRenderPreview,
		Arguments: mustStruct(t, map[string]any{"document_revision": 31, "profile": 4}), DocumentDigest: testDocumentDigest,
	})
	if err != nil || r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_AWAITING_APPROVAL {
		t.Fatalf("submit preview = %v, %v; want AWAITING_APPROVAL", r, err)
	}
	return r
}

func (h *previewHarness) approve(t *testing.T, id string) (*orchestratorv1.ToolRequest, error) {
	t.Helper()
	return h.client.Approve(as(t.Context(), "bob", "approvers"), &orchestratorv1.ApproveRequest{RequestId: id, DocumentDigest: testDocumentDigest})
}

func TestPreviewApprovalReadsInProductTermsAndRendersOnce(t *testing.T) {
	t.Parallel()
	h := newPreviewHarness(t)
	task := h.start(t, "preview", false).GetTask()
	r := h.submitPreview(t, task.GetId(), "call_1")
	const want = "Render preview of document revision 31 using profile 4"
	if r.GetSummary() != want {
		t.Errorf("summary = %q, want %q", r.GetSummary(), want)
	}
	ap, err := h.client.GetApproval(t.Context(), &orchestratorv1.GetApprovalRequest{RequestId: r.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	if ap.GetSummary() != want || ap.GetArgumentsDigest() != r.GetArgumentsDigest() || ap.GetDocumentDigest() != testDocumentDigest ||
		ap.GetMappingId() != "map_preview" || ap.GetMappingRevision() != 1 || ap.GetPolicyRevision() != testPolicyRevision ||
		ap.GetConnectionId() != "conn_renderer" || ap.GetConfigRevision() != 3 || ap.GetUseTime() != nil ||
		ap.GetExpireTime().AsTime().Sub(ap.GetCreateTime().AsTime()) != DefaultApprovalTTL {
		t.Errorf("approval = %v", ap)
	}
	if strings.Contains(ap.GetSummary(), "{") || strings.Contains(ap.GetSummary(), "render\"") {
		t.Errorf("review surface shows a payload: %q", ap.GetSummary())
	}
	if n := h.adapter.calls.Load(); n != 0 {
		t.Fatalf("adapter called %d times before approval", n)
	}

	done, err := h.approve(t, r.GetId())
	if err != nil || done.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
		t.Fatalf("approve = %v, %v", done, err)
	}
	if done.GetArtifactDigest() != "sha256:artifact-"+r.GetIntentId() || done.GetReceiptId() == "" ||
		done.GetApproval().GetApprover() != "bob" || done.GetApproval().GetUseTime() == nil {
		t.Errorf("executed = %v", done)
	}
	// The renderer got the intent id as its idempotency key, next to the
	// mapped product fields.
	args := h.adapter.lastRequest().GetArguments().AsMap()
	if args[idempotencyKeyField] != r.GetIntentId() || args["document_revision"] != float64(31) || args["profile"] != float64(4) || len(args) != 3 {
		t.Errorf("remote arguments = %v", args)
	}
	if h.evidence.receipts[r.GetIntentId()].GetArtifactDigest() != done.GetArtifactDigest() {
		t.Errorf("receipt = %v", h.evidence.receipts[r.GetIntentId()])
	}
	// The same approver's retry (its reply lost) replays what was
	// recorded; anyone else learns the approval was used. Neither renders.
	again, err := h.approve(t, r.GetId())
	if err != nil || again.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED || again.GetReceiptId() != done.GetReceiptId() {
		t.Errorf("the approver's retry = %v, %v; want the executed request replayed", again, err)
	}
	_, err = h.client.Approve(as(t.Context(), "dana", "approvers"), &orchestratorv1.ApproveRequest{RequestId: r.GetId(), DocumentDigest: testDocumentDigest})
	wantErr(t, err, codes.FailedPrecondition, "APPROVAL_ALREADY_USED")
	if n := h.renders.Load(); n != 1 {
		t.Errorf("rendered %d times, want 1", n)
	}
}

func TestApprovalUsedOnceUnderConcurrency(t *testing.T) {
	t.Parallel()
	h := newPreviewHarness(t)
	task := h.start(t, "preview", false).GetTask()
	r := h.submitPreview(t, task.GetId(), "call_1")
	var (
		wg       sync.WaitGroup
		executed atomic.Int64
	)
	// Six approvers race: one approval is used, and renders once.
	for i := range 6 {
		wg.Go(func() {
			got, err := h.client.Approve(as(t.Context(), fmt.Sprintf("approver%d", i), "approvers"), &orchestratorv1.ApproveRequest{RequestId: r.GetId(), DocumentDigest: testDocumentDigest})
			switch {
			case err == nil && got.GetState() == orchestratorv1.RequestState_REQUEST_STATE_EXECUTED:
				executed.Add(1)
			case apierror.Is(err, codes.FailedPrecondition, "APPROVAL_ALREADY_USED"), apierror.Is(err, codes.FailedPrecondition, "REQUEST_NOT_AWAITING_APPROVAL"):
			default:
				t.Errorf("approve = %v, %v", got, err)
			}
		})
	}
	wg.Wait()
	if executed.Load() != 1 || h.renders.Load() != 1 {
		t.Errorf("%d approvals executed, %d renders; want exactly 1 each", executed.Load(), h.renders.Load())
	}
}

func TestEachApprovalBindingInvalidatesInTurn(t *testing.T) {
	t.Parallel()
	tests := []struct {
		binding  string
		change   func(t *testing.T, h *previewHarness, r *orchestratorv1.ToolRequest)
		document string
	}{
		{"arguments", func(t *testing.T, h *previewHarness, r *orchestratorv1.ToolRequest) {
			// Storage tampered with after review: the arguments executed
			// would not be the ones approved.
			if _, err := h.server.st.UpdateRequest(t.Context(), r.GetId(), func(x *orchestratorv1.ToolRequest) error {
				x.Arguments = mustStruct(t, map[string]any{"document_revision": 32, "profile": 4})
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		}, testDocumentDigest},
		{"document", func(*testing.T, *previewHarness, *orchestratorv1.ToolRequest) {}, "sha256:doc31-edited"},
		{"mapping", func(_ *testing.T, h *previewHarness, _ *orchestratorv1.ToolRequest) {
			h.registry.bumpMapping(capRenderPreview)
		}, testDocumentDigest},
		{"policy", func(_ *testing.T, h *previewHarness, _ *orchestratorv1.ToolRequest) {
			h.policy.setRevision("sha256:policy2")
		}, testDocumentDigest},
		{"credentials", func(_ *testing.T, h *previewHarness, _ *orchestratorv1.ToolRequest) { h.registry.rotate() }, testDocumentDigest},
		{"expired", func(_ *testing.T, h *previewHarness, _ *orchestratorv1.ToolRequest) {
			h.clock.Advance(DefaultApprovalTTL)
		}, testDocumentDigest},
	}
	for _, tc := range tests {
		t.Run(tc.binding, func(t *testing.T) {
			t.Parallel()
			h := newPreviewHarness(t)
			task := h.start(t, "preview", false).GetTask()
			r := h.submitPreview(t, task.GetId(), "call_1")
			tc.change(t, h, r)
			_, err := h.client.Approve(as(t.Context(), "bob", "approvers"), &orchestratorv1.ApproveRequest{RequestId: r.GetId(), DocumentDigest: tc.document})
			wantErr(t, err, codes.FailedPrecondition, "APPROVAL_INVALIDATED")
			if got := apierror.Info(err).GetMetadata()["binding"]; got != tc.binding {
				t.Errorf("binding = %q, want %q (%v)", got, tc.binding, err)
			}
			got, _ := h.client.GetRequest(t.Context(), &orchestratorv1.GetRequestRequest{Id: r.GetId()})
			if got.GetState() != orchestratorv1.RequestState_REQUEST_STATE_REFUSED || got.GetRefusalReason() != "APPROVAL_INVALIDATED" ||
				bindingName(got.GetApproval().GetInvalidated()) != tc.binding || got.GetApproval().GetUseTime() != nil {
				t.Errorf("request = %v", got)
			}
			if n := h.adapter.calls.Load(); n != 0 {
				t.Errorf("adapter called %d times after an invalidated approval", n)
			}
		})
	}
}

func TestCheckReceiptRetryRule(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		fault    func(call int64) string
		wantCall int64 // render calls
		statuses int64
		attempts int
	}{
		{"never reached the server: one more attempt", func(c int64) string { return map[int64]string{1: "down"}[c] }, 2, 0, 2},
		{"died after rendering: settled by status, no second render", func(int64) string { return "crash" }, 1, 1, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newPreviewHarness(t)
			h.renderFault = tc.fault
			task := h.start(t, "preview", false).GetTask()
			r := h.submitPreview(t, task.GetId(), "call_1")
			done, err := h.approve(t, r.GetId())
			if err != nil || done.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED || done.GetArtifactDigest() == "" {
				t.Fatalf("approve = %v, %v", done, err)
			}
			renderCalls := h.adapter.calls.Load() - h.statuses.Load()
			if renderCalls != tc.wantCall || h.statuses.Load() != tc.statuses || len(done.GetAttempts()) != tc.attempts || h.renders.Load() != 1 {
				t.Errorf("render calls %d (want %d), status %d (want %d), attempts %d (want %d), renders %d (want 1)",
					renderCalls, tc.wantCall, h.statuses.Load(), tc.statuses, len(done.GetAttempts()), tc.attempts, h.renders.Load())
			}
			last := done.GetAttempts()[len(done.GetAttempts())-1]
			if last.GetStage() != adapterv1.DeliveryStage_DELIVERY_STAGE_COMMITTED || last.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
				t.Errorf("last attempt = %v", last)
			}
		})
	}
}

func TestUnknownExternalEffectIsNeverRetriedBlindly(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.policy.approvalRequired[capDeliverApprovedArtifact] = true
	h.adapter.setRespond(func(*adapterv1.ExecuteRequest) (*adapterv1.ExecuteResponse, error) {
		return &adapterv1.ExecuteResponse{Outcome: adapterv1.Outcome_OUTCOME_UNKNOWN, Stage: adapterv1.DeliveryStage_DELIVERY_STAGE_SENT,
			Error: &adapterv1.ErrorEvidence{SafeCode: "TRANSPORT_CLOSED", UntrustedDetail: "delivered? retry please"}}, nil
	})
	task := h.start(t, "export", false).GetTask()
	r, _ := h.submit(t, task.GetId(), "call_1", capDeliverApprovedArtifact, map[string]any{"artifact": "art_1", "destination": "dest_1"})
	got, err := h.client.Approve(as(t.Context(), "bob", "approvers"), &orchestratorv1.ApproveRequest{RequestId: r.GetId()})
	if err != nil || got.GetState() != orchestratorv1.RequestState_REQUEST_STATE_FAILED || got.GetOutcome() != adapterv1.Outcome_OUTCOME_UNKNOWN {
		t.Fatalf("approve = %v, %v", got, err)
	}
	if n := h.adapter.calls.Load(); n != 1 || len(got.GetAttempts()) != 1 || got.GetAttempts()[0].GetError().GetSafeCode() != "TRANSPORT_CLOSED" {
		t.Errorf("adapter called %d times; attempts %v", n, got.GetAttempts())
	}
}

// TestResumeSettlesAnOpenAttemptWithoutRenderingAgain leaves an attempt
// open in the store, as a killed process would, and starts a new server on
// the same store: recovery finds the artifact through the server's status
// and commits without another render.
func TestResumeSettlesAnOpenAttemptWithoutRenderingAgain(t *testing.T) {
	t.Parallel()
	h := newPreviewHarness(t)
	h.renderFault = func(int64) string { return "crash" }
	task := h.start(t, "preview", false).GetTask()
	r := h.submitPreview(t, task.GetId(), "call_1")
	// Render happened remotely; the process died before hearing back.
	h.mu.Lock()
	h.artifacts[r.GetIntentId()] = "sha256:artifact-" + r.GetIntentId()
	h.mu.Unlock()
	h.renders.Add(1)
	if _, err := h.server.st.UseApproval(t.Context(), r.GetId(), "bob", timestamppb.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := h.server.st.UpdateRequest(t.Context(), r.GetId(), func(x *orchestratorv1.ToolRequest) error {
		mergeAttempt(x, &orchestratorv1.Attempt{Id: "att_open", IntentId: x.GetIntentId(), Number: 1,
			Stage: adapterv1.DeliveryStage_DELIVERY_STAGE_PREPARED, StartTime: timestamppb.Now()})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	open, err := h.server.st.ListOpenRequests(t.Context())
	if err != nil || len(open) != 1 {
		t.Fatalf("open requests = %v, %v", open, err)
	}

	restarted := NewServer(h.server.st, h.server.deps, nil)
	defer restarted.Close()
	var got *orchestratorv1.ToolRequest
	testkit.Eventually(t, "the restarted replica recovers the request", func() bool {
		got, err = restarted.GetRequest(testkit.AsUser(t.Context(), "alice"), &orchestratorv1.GetRequestRequest{Id: r.GetId()})
		if err != nil {
			t.Fatal(err)
		}
		if got.GetState() == orchestratorv1.RequestState_REQUEST_STATE_FAILED {
			t.Fatalf("recovered request failed: %v", got)
		}
		return got.GetState() == orchestratorv1.RequestState_REQUEST_STATE_EXECUTED
	})
	a := got.GetAttempts()[0]
	if len(got.GetAttempts()) != 1 || a.GetStage() != adapterv1.DeliveryStage_DELIVERY_STAGE_COMMITTED || !strings.Contains(a.GetResolution(), "server's status") ||
		got.GetArtifactDigest() != "sha256:artifact-"+r.GetIntentId() {
		t.Errorf("recovered = %v", got)
	}
	if n := h.adapter.calls.Load() - h.statuses.Load(); n != 0 || h.renders.Load() != 1 {
		t.Errorf("%d render calls after restart, %d renders; want 0 and 1", n, h.renders.Load())
	}
	if open, _ := h.server.st.ListOpenRequests(context.Background()); len(open) != 0 {
		t.Errorf("still open: %v", open)
	}
}

func TestOpenRequestIndex(t *testing.T) {
	t.Parallel()
	st := newBoltStore(t)
	r, _, err := st.CreateRequest(t.Context(), &orchestratorv1.ToolRequest{Id: "req_1", TaskId: "task_1", ProviderCallId: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	if open, _ := st.ListOpenRequests(t.Context()); len(open) != 0 {
		t.Fatalf("open = %v", open)
	}
	a := &orchestratorv1.Attempt{Id: "att_1", Stage: adapterv1.DeliveryStage_DELIVERY_STAGE_PREPARED}
	if _, err := st.SaveAttempt(t.Context(), r.GetId(), a); err != nil {
		t.Fatal(err)
	}
	if open, _ := st.ListOpenRequests(t.Context()); len(open) != 1 {
		t.Fatalf("open = %v", open)
	}
	a.EndTime = timestamppb.Now()
	a.Stage = adapterv1.DeliveryStage_DELIVERY_STAGE_SENT
	if _, err := st.SaveAttempt(t.Context(), r.GetId(), a); err != nil {
		t.Fatal(err)
	}
	if open, _ := st.ListOpenRequests(t.Context()); len(open) != 0 {
		t.Fatalf("open = %v", open)
	}
	_, err = st.UseApproval(t.Context(), r.GetId(), "bob", timestamppb.Now())
	if err != ostore.ErrNotAwaiting {
		t.Errorf("UseApproval without approval = %v", err)
	}
}

// A render that happened is committed with its artifact even when policy
// cannot charge its response (unavailable): the effect is not recorded as
// failed for an outage (issue 15: every request ends in a true state).
func TestRenderCommittedWhenPolicyCannotChargeItsResponse(t *testing.T) {
	t.Parallel()
	h := newPreviewHarness(t)
	h.adapter.mu.Lock()
	render := h.adapter.respond
	h.adapter.mu.Unlock()
	h.adapter.setRespond(func(in *adapterv1.ExecuteRequest) (*adapterv1.ExecuteResponse, error) {
		resp, err := render(in)
		if resp != nil {
			resp.ResponseBytes = 128
		}
		return resp, err
	})
	h.policy.mu.Lock()
	h.policy.responsesDown = true
	h.policy.mu.Unlock()
	task := h.start(t, "preview", false).GetTask()
	r := h.submitPreview(t, task.GetId(), "call_1")
	got, err := h.approve(t, r.GetId())
	if err != nil {
		t.Fatalf("approve: %v", err)
	}
	if got.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED || got.GetOutcome() != adapterv1.Outcome_OUTCOME_OK ||
		got.GetArtifactDigest() != "sha256:artifact-"+r.GetIntentId() || h.renders.Load() != 1 {
		t.Fatalf("request = %v after %d renders; want EXECUTED / OK with its artifact, rendered once", got, h.renders.Load())
	}
}

// A request awaiting approval whose submission's trace events still wait
// in the outbox (the replica that submitted it stopped before delivering
// them) is approved or denied elsewhere: the decision's events reach
// evidence after them, in the order they happened, not before.
func TestDecisionTraceWaitsBehindTheOutbox(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		decide func(h *previewHarness, id string) error
	}{
		{"approve", func(h *previewHarness, id string) error { _, err := h.approve(t, id); return err }},
		{"deny", func(h *previewHarness, id string) error {
			_, err := h.client.Deny(as(t.Context(), "bob", "approvers"), &orchestratorv1.DenyRequest{RequestId: id, Reason: "not now"})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newPreviewHarness(t, func(d *Deps) { d.RecoveryInterval = time.Hour })
			task := h.start(t, "preview", false).GetTask()
			r := h.submitPreview(t, task.GetId(), "call_1")
			details := func() []string {
				var out []string
				for _, ev := range h.evidence.product(task.GetId()) {
					if ev.GetRequestId() == r.GetId() {
						out = append(out, ev.GetDetail())
					}
				}
				return out
			}
			submitted := len(details())
			const left = "left by the stopped replica"
			if err := h.server.st.PutTraceOutbox(t.Context(), []*evidencev1.TraceEvent{{TaskId: task.GetId(), Layer: &evidencev1.TraceEvent_Product{Product: &evidencev1.ProductEvent{
				Kind: evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_APPROVAL, RequestId: r.GetId(), Detail: left,
			}}}}); err != nil {
				t.Fatal(err)
			}
			if err := tc.decide(h, r.GetId()); err != nil {
				t.Fatal(err)
			}
			h.server.deliverOutbox(t.Context()) // the next recovery pass
			got := details()
			if len(got) <= submitted+1 || got[submitted] != left {
				t.Fatalf("the request's product events after its submission = %q; want the stopped replica's event first, then the decision's", got[submitted:])
			}
		})
	}
}
