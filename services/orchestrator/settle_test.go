package orchestrator

import (
	ostore "github.com/v0m3/v0m3/services/orchestrator/store"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/redistest"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
)

// unknownRender approves a render that ends FAILED / UNKNOWN: the render
// call breaks with fault ("crash": rendered; "lost": not rendered) while
// the server's status cannot be read.
func unknownRender(t *testing.T, h *previewHarness, taskID, callID string) *orchestratorv1.ToolRequest {
	t.Helper()
	r := h.submitPreview(t, taskID, callID)
	got, err := h.approve(t, r.GetId())
	if err != nil || got.GetState() != orchestratorv1.RequestState_REQUEST_STATE_FAILED || got.GetOutcome() != adapterv1.Outcome_OUTCOME_UNKNOWN || len(got.GetAttempts()) != 1 {
		t.Fatalf("approve = %v, %v; want FAILED / UNKNOWN after one attempt", got, err)
	}
	return got
}

func settlements(h *previewHarness, taskID, requestID string) []*evidencev1.ProductEvent {
	var out []*evidencev1.ProductEvent
	for _, ev := range h.evidence.product(taskID) {
		if ev.GetRequestId() == requestID && strings.HasPrefix(ev.GetReason(), "SETTLED_BY_") {
			out = append(out, ev)
		}
	}
	return out
}

// An unknown outcome is revisited by the continuous recovery while the
// server's status cannot be read (never attempted again, still unknown),
// and once the status answers it is settled by what the status says: the
// artifact that was rendered (its receipt recorded, EXECUTED), or no
// artifact (FAILED / INTERRUPTED, not rendered). Both are told in the
// task events and the trace.
func TestUnknownOutcomeSettledByTheServersStatusOnceItIsBack(t *testing.T) {
	t.Parallel()
	redisAddr, _ := redistest.Start(t)
	for _, tc := range []struct {
		fault       string
		redis       bool
		wantState   orchestratorv1.RequestState
		wantOutcome adapterv1.Outcome
		renders     int64
	}{
		{"crash", false, orchestratorv1.RequestState_REQUEST_STATE_EXECUTED, adapterv1.Outcome_OUTCOME_OK, 1},
		{"lost", false, orchestratorv1.RequestState_REQUEST_STATE_FAILED, adapterv1.Outcome_OUTCOME_INTERRUPTED, 0},
		{"crash", true, orchestratorv1.RequestState_REQUEST_STATE_EXECUTED, adapterv1.Outcome_OUTCOME_OK, 1},
		{"lost", true, orchestratorv1.RequestState_REQUEST_STATE_FAILED, adapterv1.Outcome_OUTCOME_INTERRUPTED, 0},
	} {
		name := tc.fault + " on a file"
		if tc.redis {
			name = tc.fault + " on redis"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var st ostore.Store
			if tc.redis {
				st = ostore.NewRedisStore(redistest.Client(t, redisAddr), redistest.Prefix(t))
			}
			h := newPreviewHarnessOn(t, st, func(d *Deps) { d.RecoveryInterval = 20 * time.Millisecond })
			h.renderFault = func(int64) string { return tc.fault }
			h.statusDown.Store(true)
			task := h.start(t, "preview", false).GetTask()
			r := unknownRender(t, h, task.GetId(), "call_1")

			// Revisited on a schedule while the status is down: asked
			// again, still unknown, nothing rendered again.
			testkit.Eventually(t, "the status asked again", func() bool { return h.statuses.Load() >= 3 })
			cur, err := h.server.st.GetRequest(t.Context(), r.GetId())
			if err != nil {
				t.Fatal(err)
			}
			if !awaitingSettlement(cur) || len(cur.GetAttempts()) != 1 {
				t.Fatalf("while the status is down: %v / %v with %d attempts; want FAILED / UNKNOWN, one attempt", cur.GetState(), cur.GetOutcome(), len(cur.GetAttempts()))
			}
			if len(settlements(h, task.GetId(), r.GetId())) != 0 {
				t.Fatal("settled without evidence")
			}

			h.statusDown.Store(false)
			got := waitRequest(t, h, r.GetId(), func(r *orchestratorv1.ToolRequest) bool { return !awaitingSettlement(r) })
			if got.GetState() != tc.wantState || got.GetOutcome() != tc.wantOutcome || len(got.GetAttempts()) != 1 {
				t.Fatalf("settled = %v / %v with %d attempts; want %v / %v, one attempt", got.GetState(), got.GetOutcome(), len(got.GetAttempts()), tc.wantState, tc.wantOutcome)
			}
			if n := h.renders.Load(); n != tc.renders {
				t.Errorf("rendered %d times, want %d", n, tc.renders)
			}
			if !strings.Contains(got.GetAttempts()[0].GetResolution(), "settled after the fact by the server's status") {
				t.Errorf("attempt resolution %q does not say what settled it", got.GetAttempts()[0].GetResolution())
			}
			h.evidence.mu.Lock()
			rc := h.evidence.receipts[r.GetIntentId()]
			h.evidence.mu.Unlock()
			if tc.wantState == orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
				if got.GetArtifactDigest() != "sha256:artifact-"+r.GetIntentId() || got.GetReceiptId() == "" || rc.GetId() != got.GetReceiptId() {
					t.Errorf("executed with artifact %q receipt %q (recorded %v)", got.GetArtifactDigest(), got.GetReceiptId(), rc)
				}
			} else if rc != nil || got.GetArtifactDigest() != "" {
				t.Errorf("not executed, yet receipt %v artifact %q", rc, got.GetArtifactDigest())
			}
			testkit.Eventually(t, "the settlement told in events and trace", func() bool {
				return slices.Contains(eventTypesOf(t, h, task.GetId(), r.GetId()), "request.settled") &&
					len(settlements(h, task.GetId(), r.GetId())) == 1
			})
			if ev := settlements(h, task.GetId(), r.GetId())[0]; ev.GetReason() != "SETTLED_BY_EVIDENCE" || ev.GetOutcome() != outcomeName(tc.wantOutcome) {
				t.Errorf("trace = %v", ev)
			}
			// Settled requests leave the recovery index.
			rs, err := h.server.st.ListUnsettledRequests(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if slices.ContainsFunc(rs, func(x *orchestratorv1.ToolRequest) bool { return x.GetId() == r.GetId() }) {
				t.Error("a settled request is still listed for recovery")
			}
		})
	}
}

// A person settles an unknown outcome by hand only with the role
// (settler or admins), with evidence, at the attempt examined, and only
// while it is unknown; every refusal changes nothing, and a settlement is
// recorded with who made it.
func TestSettleRequestByHand(t *testing.T) {
	t.Parallel()
	// Recovery runs rarely here: this test alone settles.
	h := newPreviewHarness(t, func(d *Deps) { d.RecoveryInterval = time.Hour })
	h.renderFault = func(int64) string { return "crash" }
	h.statusDown.Store(true)
	task := h.start(t, "preview", false).GetTask()
	r := unknownRender(t, h, task.GetId(), "call_1")
	att := r.GetAttempts()[0].GetId()
	digest := "sha256:" + strings.Repeat("ab", 32)
	ok := func(in *orchestratorv1.SettleRequestRequest) *orchestratorv1.SettleRequestRequest {
		out := &orchestratorv1.SettleRequestRequest{RequestId: r.GetId(), AttemptId: att, Settlement: orchestratorv1.Settlement_SETTLEMENT_EXECUTED,
			ArtifactDigest: digest, Note: "the artifact is in the renderer's bucket"}
		proto.Merge(out, in)
		return out
	}
	settler := as(t.Context(), "carol", "settler")
	for _, tc := range []struct {
		name   string
		caller []string
		in     *orchestratorv1.SettleRequestRequest
		code   codes.Code
		reason string
	}{
		{"the requester", nil, ok(nil), codes.PermissionDenied, "ROLE_NOT_GRANTED"},
		{"an approver", []string{"bob", "approvers"}, ok(nil), codes.PermissionDenied, "ROLE_NOT_GRANTED"},
		{"an auditor", []string{"erin", "auditors"}, ok(nil), codes.PermissionDenied, "ROLE_NOT_GRANTED"},
		{"no note", []string{"carol", "settler"}, &orchestratorv1.SettleRequestRequest{RequestId: r.GetId(), AttemptId: att,
			Settlement: orchestratorv1.Settlement_SETTLEMENT_EXECUTED, ArtifactDigest: digest}, codes.InvalidArgument, "FIELD_REQUIRED"},
		{"no settlement", []string{"carol", "settler"}, &orchestratorv1.SettleRequestRequest{RequestId: r.GetId(), AttemptId: att, Note: "n"},
			codes.InvalidArgument, "FIELD_REQUIRED"},
		{"executed without evidence", []string{"carol", "settler"}, &orchestratorv1.SettleRequestRequest{RequestId: r.GetId(), AttemptId: att,
			Settlement: orchestratorv1.Settlement_SETTLEMENT_EXECUTED, Note: "trust me"}, codes.InvalidArgument, reasonEvidenceRequired},
		{"not executed with evidence", []string{"carol", "settler"}, ok(&orchestratorv1.SettleRequestRequest{Settlement: orchestratorv1.Settlement_SETTLEMENT_NOT_EXECUTED}),
			codes.InvalidArgument, "SETTLEMENT_EVIDENCE_UNEXPECTED"},
		{"a malformed digest", []string{"carol", "settler"}, ok(&orchestratorv1.SettleRequestRequest{ArtifactDigest: "sha256:nope"}), codes.InvalidArgument, "ARTIFACT_DIGEST_INVALID"},
		{"a huge note", []string{"carol", "settler"}, ok(&orchestratorv1.SettleRequestRequest{Note: strings.Repeat("x", 1<<20)}), codes.InvalidArgument, "FIELD_TOO_LONG"},
		{"another attempt", []string{"carol", "settler"}, ok(&orchestratorv1.SettleRequestRequest{AttemptId: "att_other"}), codes.FailedPrecondition, reasonRequestChanged},
		{"a receipt of nothing", []string{"carol", "settler"}, ok(&orchestratorv1.SettleRequestRequest{ReceiptId: "rcpt_forged"}), codes.FailedPrecondition, reasonReceiptMismatch},
		{"an unknown request", []string{"carol", "settler"}, ok(&orchestratorv1.SettleRequestRequest{RequestId: "req_missing"}), codes.NotFound, ""},
	} {
		ctx := t.Context()
		if tc.caller != nil {
			ctx = as(ctx, tc.caller[0], tc.caller[1:]...)
		}
		_, err := h.client.SettleRequest(ctx, tc.in)
		if tc.reason == "" {
			if got := status.Code(err); got != tc.code {
				t.Errorf("%s: error = %v, want %s", tc.name, err, tc.code)
			}
			continue
		}
		if !apierror.Is(err, tc.code, tc.reason) {
			t.Errorf("%s: error = %v, want %s %s", tc.name, err, tc.code, tc.reason)
		}
	}
	// Nothing changed: the request, its events, the trace, the renderer.
	cur, err := h.server.st.GetRequest(t.Context(), r.GetId())
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(cur, r) {
		t.Errorf("a refused settlement changed the request:\n%v\nwas\n%v", cur, r)
	}
	if slices.Contains(eventTypesOf(t, h, task.GetId(), r.GetId()), "request.settled") || len(settlements(h, task.GetId(), r.GetId())) != 0 {
		t.Error("a refused settlement was recorded")
	}

	got, err := h.client.SettleRequest(settler, ok(nil))
	if err != nil {
		t.Fatal(err)
	}
	if got.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED || got.GetOutcome() != adapterv1.Outcome_OUTCOME_OK ||
		got.GetArtifactDigest() != digest || len(got.GetAttempts()) != 1 || !strings.Contains(got.GetAttempts()[0].GetResolution(), "settled by hand by carol") {
		t.Fatalf("settled = %v", got)
	}
	testkit.Eventually(t, "the settlement told in events and trace", func() bool {
		return slices.Contains(eventTypesOf(t, h, task.GetId(), r.GetId()), "request.settled") && len(settlements(h, task.GetId(), r.GetId())) == 1
	})
	if ev := settlements(h, task.GetId(), r.GetId())[0]; ev.GetReason() != "SETTLED_BY_HAND" || !strings.Contains(ev.GetDetail(), "carol") || !strings.Contains(ev.GetDetail(), digest) {
		t.Errorf("trace = %v", ev)
	}
	// Settled once: the outcome is no longer unknown, so never rewritten.
	_, err = h.client.SettleRequest(settler, ok(&orchestratorv1.SettleRequestRequest{Settlement: orchestratorv1.Settlement_SETTLEMENT_NOT_EXECUTED, ArtifactDigest: "-"}))
	wantErr(t, err, codes.InvalidArgument, "ARTIFACT_DIGEST_INVALID")
	_, err = h.client.SettleRequest(as(t.Context(), "dana", "admins"), &orchestratorv1.SettleRequestRequest{RequestId: r.GetId(), AttemptId: att,
		Settlement: orchestratorv1.Settlement_SETTLEMENT_NOT_EXECUTED, Note: "second opinion"})
	wantErr(t, err, codes.FailedPrecondition, reasonOutcomeNotUnknown)

	// An admin settles another as not executed.
	r2 := unknownRender(t, h, task.GetId(), "call_2")
	got, err = h.client.SettleRequest(as(t.Context(), "dana", "admins"), &orchestratorv1.SettleRequestRequest{RequestId: r2.GetId(), AttemptId: r2.GetAttempts()[0].GetId(),
		Settlement: orchestratorv1.Settlement_SETTLEMENT_NOT_EXECUTED, Note: "the renderer's log shows the call never arrived"})
	if err != nil || got.GetState() != orchestratorv1.RequestState_REQUEST_STATE_FAILED || got.GetOutcome() != adapterv1.Outcome_OUTCOME_INTERRUPTED || got.GetArtifactDigest() != "" {
		t.Fatalf("settled = %v, %v; want FAILED / INTERRUPTED", got, err)
	}
	// A request that did not end unknown cannot be settled.
	h.renderFault = nil
	h.statusDown.Store(false)
	r3 := h.submitPreview(t, task.GetId(), "call_3")
	if done, err := h.approve(t, r3.GetId()); err != nil || done.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
		t.Fatalf("approve = %v, %v", done, err)
	}
	_, err = h.client.SettleRequest(settler, &orchestratorv1.SettleRequestRequest{RequestId: r3.GetId(), AttemptId: "att_x",
		Settlement: orchestratorv1.Settlement_SETTLEMENT_NOT_EXECUTED, Note: "undo it"})
	wantErr(t, err, codes.FailedPrecondition, reasonOutcomeNotUnknown)
}

// A settlement's trace waits behind what a replica that stopped left in
// the outbox, as an approval's does (TestDecisionTraceWaitsBehindTheOutbox).
func TestSettlementTraceWaitsBehindTheOutbox(t *testing.T) {
	t.Parallel()
	h := newPreviewHarness(t, func(d *Deps) { d.RecoveryInterval = time.Hour })
	h.renderFault = func(int64) string { return "crash" }
	h.statusDown.Store(true)
	task := h.start(t, "preview", false).GetTask()
	r := unknownRender(t, h, task.GetId(), "call_1")
	details := func() []string {
		var out []string
		for _, ev := range h.evidence.product(task.GetId()) {
			if ev.GetRequestId() == r.GetId() {
				out = append(out, ev.GetDetail())
			}
		}
		return out
	}
	before := len(details())
	const left = "left by the stopped replica"
	if err := h.server.st.PutTraceOutbox(t.Context(), []*evidencev1.TraceEvent{{TaskId: task.GetId(), Layer: &evidencev1.TraceEvent_Product{Product: &evidencev1.ProductEvent{
		Kind: evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_EXECUTED, RequestId: r.GetId(), Detail: left,
	}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.client.SettleRequest(as(t.Context(), "carol", "settler"), &orchestratorv1.SettleRequestRequest{
		RequestId: r.GetId(), AttemptId: r.GetAttempts()[0].GetId(), Settlement: orchestratorv1.Settlement_SETTLEMENT_EXECUTED,
		ArtifactDigest: "sha256:" + strings.Repeat("ab", 32), Note: "the artifact is in the renderer's bucket",
	}); err != nil {
		t.Fatal(err)
	}
	h.server.deliverOutbox(t.Context()) // the next recovery pass
	got := details()
	if len(got) <= before+1 || got[before] != left {
		t.Fatalf("the request's product events after it became unknown = %q; want the stopped replica's event first, then the settlement's", got[before:])
	}
}

// The metrics count the requests waiting on a person as the store holds
// them: those awaiting approval (since their last change) and those whose
// unknown outcome awaits settlement (since their attempt ended). A request
// not yet decided, executed, or failed with a known outcome waits on
// nobody.
func TestWaitingRequestsAsTheStoreHoldsThem(t *testing.T) {
	t.Parallel()
	redisAddr, _ := redistest.Start(t)
	for name, open := range map[string]func(*testing.T) ostore.Store{
		"file": newBoltStore,
		"redis": func(t *testing.T) ostore.Store {
			return ostore.NewRedisStore(redistest.Client(t, redisAddr), redistest.Prefix(t))
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			st := open(t)
			ctx := t.Context()
			waitsSince := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
			endedAt := waitsSince.Add(time.Hour)
			ended := func(id string) []*orchestratorv1.Attempt {
				return []*orchestratorv1.Attempt{{Id: id, Stage: adapterv1.DeliveryStage_DELIVERY_STAGE_SENT,
					StartTime: timestamppb.New(endedAt.Add(-time.Minute)), EndTime: timestamppb.New(endedAt)}}
			}
			for id, change := range map[string]func(*orchestratorv1.ToolRequest){
				"req_requested": func(*orchestratorv1.ToolRequest) {},
				"req_awaiting_approval": func(r *orchestratorv1.ToolRequest) {
					r.State, r.UpdateTime = orchestratorv1.RequestState_REQUEST_STATE_AWAITING_APPROVAL, timestamppb.New(waitsSince)
				},
				"req_unknown": func(r *orchestratorv1.ToolRequest) {
					r.State, r.Outcome, r.Attempts = orchestratorv1.RequestState_REQUEST_STATE_FAILED, adapterv1.Outcome_OUTCOME_UNKNOWN, ended("att_u")
					r.UpdateTime = timestamppb.New(endedAt.Add(time.Hour)) // a later change does not restart the wait
				},
				"req_interrupted": func(r *orchestratorv1.ToolRequest) {
					r.State, r.Outcome, r.Attempts = orchestratorv1.RequestState_REQUEST_STATE_FAILED, adapterv1.Outcome_OUTCOME_INTERRUPTED, ended("att_i")
				},
				"req_executed": func(r *orchestratorv1.ToolRequest) {
					r.State, r.Outcome, r.Attempts = orchestratorv1.RequestState_REQUEST_STATE_EXECUTED, adapterv1.Outcome_OUTCOME_OK, ended("att_e")
				},
			} {
				r := &orchestratorv1.ToolRequest{Id: id, TaskId: "task_1", ProviderCallId: "call_" + id, IntentId: "int_" + id,
					Capability: "notes.get", State: orchestratorv1.RequestState_REQUEST_STATE_REQUESTED, UpdateTime: timestamppb.Now()}
				if _, _, err := st.CreateRequest(ctx, r); err != nil {
					t.Fatal(err)
				}
				if _, err := st.UpdateRequest(ctx, id, func(r *orchestratorv1.ToolRequest) error { change(r); return nil }); err != nil {
					t.Fatal(err)
				}
			}
			w, err := WaitingRequests(st)(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.EqualFunc(w.Approvals, []time.Time{waitsSince}, time.Time.Equal) {
				t.Errorf("awaiting approval since %v, want %v", w.Approvals, waitsSince)
			}
			if !slices.EqualFunc(w.Settlements, []time.Time{endedAt}, time.Time.Equal) {
				t.Errorf("awaiting settlement since %v, want %v", w.Settlements, endedAt)
			}
		})
	}
}
