package orchestrator

import (
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/testkit"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
)

// killAt is a fail point that stops the server once at one point, as if
// its process died there.
type killAt struct {
	mu    sync.Mutex
	point string
	hits  int
	// passes counts the recovery passes the server completed.
	passes atomic.Int64
}

func (k *killAt) arm(point string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.point = point
}

func (k *killAt) hit(point string) error {
	if point == FailPointRecoveryPassed {
		k.passes.Add(1)
		return nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if point != k.point {
		return nil
	}
	k.point = ""
	k.hits++
	return errors.New("killed by the test")
}

// recoveringHarness is the preview harness (a render that needs an
// approval, settled by receipt or the server's status) with a fail point
// and a fast continuous recovery. On a bbolt file the replica is the
// same after a "restart", so the server's own recovery loop stands in for
// the next process.
func recoveringHarness(t *testing.T) (*previewHarness, *killAt) {
	k := &killAt{}
	h := newPreviewHarness(t, func(d *Deps) {
		d.FailPoint = k.hit
		d.RecoveryInterval = 20 * time.Millisecond
	})
	return h, k
}

func waitRequest(t *testing.T, h *previewHarness, id string, done func(*orchestratorv1.ToolRequest) bool) *orchestratorv1.ToolRequest {
	t.Helper()
	var r *orchestratorv1.ToolRequest
	if !testkit.Within(30*time.Second, func() bool {
		var err error
		if r, err = h.server.st.GetRequest(t.Context(), id); err != nil {
			t.Fatal(err)
		}
		return done(r)
	}) {
		t.Fatalf("request never reached the expected state; it is %v with attempts %v", r.GetState(), r.GetAttempts())
	}
	return r
}

func settled(r *orchestratorv1.ToolRequest) bool { return !unsettled(r) }

func eventTypesOf(t *testing.T, h *previewHarness, taskID, requestID string) []string {
	t.Helper()
	evs, err := h.server.st.ListEvents(t.Context(), taskID, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range evs {
		if e.GetRequestId() == requestID {
			out = append(out, e.GetType())
		}
	}
	return out
}

// Every stop of an approved render is recovered to EXECUTED with exactly
// one render: an approval used but never acted on is executed; an attempt
// persisted but never sent is made; a render that happened but was never
// committed is settled by the server's status without rendering again.
func TestRecoveryOfAnApprovedRenderRendersOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		point    string
		attempts int
	}{
		{FailPointApprovalUsed, 1},
		{FailPointAttemptPrepared, 2},
		{FailPointAttemptExecuted, 1},
	} {
		t.Run(tc.point, func(t *testing.T) {
			t.Parallel()
			h, k := recoveringHarness(t)
			task := h.start(t, "preview", false).GetTask()
			r := h.submitPreview(t, task.GetId(), "call_1")
			k.arm(tc.point)
			_, err := h.approve(t, r.GetId())
			wantErr(t, err, codes.Unavailable, reasonReplicaStopped)

			got := waitRequest(t, h, r.GetId(), settled)
			if got.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED || len(got.GetAttempts()) != tc.attempts ||
				got.GetArtifactDigest() != "sha256:artifact-"+r.GetIntentId() {
				t.Errorf("recovered = %v with attempts %v; want EXECUTED with the artifact after %d attempts", got.GetState(), got.GetAttempts(), tc.attempts)
			}
			if n := h.renders.Load(); n != 1 {
				t.Errorf("rendered %d times, want 1", n)
			}
			// The events are written at the recovery's last checkpoint,
			// just after the state.
			var evs []string
			if !testkit.Within(30*time.Second, func() bool {
				evs = eventTypesOf(t, h, task.GetId(), r.GetId())
				return slices.Contains(evs, "request.recovering") && slices.Contains(evs, "request.executed")
			}) {
				t.Fatalf("events %v; want the recovery and the execution told", evs)
			}
			// The approver's retry (the stopped call's reply was lost)
			// replays the recovered request and renders nothing; anyone
			// else is refused: the approval was used once.
			again, err := h.approve(t, r.GetId())
			if err != nil || again.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
				t.Errorf("the approver's retry = %v, %v; want the executed request replayed", again, err)
			}
			_, err = h.client.Approve(as(t.Context(), "dana", "approvers"), &orchestratorv1.ApproveRequest{RequestId: r.GetId(), DocumentDigest: testDocumentDigest})
			wantErr(t, err, codes.FailedPrecondition, reasonApprovalUsed)
			if n := h.renders.Load(); n != 1 {
				t.Errorf("rendered %d times after the retries, want 1", n)
			}
		})
	}
}

// A request whose submission stopped before any decision is decided again
// on the next recovery pass, with the same outcome a live submission gets:
// it waits for its approval (nothing rendered), and is then approved and
// rendered once.
func TestRecoveryDecidesAStuckRequestAgain(t *testing.T) {
	t.Parallel()
	h, k := recoveringHarness(t)
	task := h.start(t, "preview", false).GetTask()
	k.arm(FailPointSubmitReceived)
	_, err := h.client.SubmitToolRequest(t.Context(), &orchestratorv1.SubmitToolRequestRequest{
		TaskId: task.GetId(), ProviderCallId: "call_1", Capability: capRenderPreview,
		Arguments: mustStruct(t, map[string]any{"document_revision": 31, "profile": 4}), DocumentDigest: testDocumentDigest,
	})
	wantErr(t, err, codes.Unavailable, reasonReplicaStopped)
	rs, err := h.server.st.ListRequests(t.Context(), task.GetId())
	if err != nil || len(rs) != 1 {
		t.Fatalf("requests = %v, %v; want the one recorded", rs, err)
	}
	got := waitRequest(t, h, rs[0].GetId(), func(r *orchestratorv1.ToolRequest) bool {
		return r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_REQUESTED
	})
	if got.GetState() != orchestratorv1.RequestState_REQUEST_STATE_AWAITING_APPROVAL || got.GetApproval() == nil || h.renders.Load() != 0 {
		t.Fatalf("recovered = %v (approval %v), %d renders; want AWAITING_APPROVAL with nothing rendered", got.GetState(), got.GetApproval(), h.renders.Load())
	}
	// The same provider call returns the recovered request, not a new one.
	again, err := h.client.SubmitToolRequest(t.Context(), &orchestratorv1.SubmitToolRequestRequest{
		TaskId: task.GetId(), ProviderCallId: "call_1", Capability: capRenderPreview,
		Arguments: mustStruct(t, map[string]any{"document_revision": 31, "profile": 4}), DocumentDigest: testDocumentDigest,
	})
	if err != nil || again.GetId() != got.GetId() {
		t.Fatalf("resubmission = %v, %v; want request %s", again, err, got.GetId())
	}
	done, err := h.approve(t, got.GetId())
	if err != nil || done.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED || h.renders.Load() != 1 {
		t.Fatalf("approve = %v, %v, %d renders; want EXECUTED with one render", done, err, h.renders.Load())
	}
}

// A request whose decision was interrupted and whose budget is spent by
// the time recovery decides it again is refused, BUDGET_EXCEEDED, by one
// recovery pass: a budget refusal is a decision, not an outage to retry
// on every pass. Nothing is sent, and the same provider call replays the
// refusal.
func TestRecoveryRefusesARequestOverBudget(t *testing.T) {
	t.Parallel()
	k := &killAt{}
	h := newHarness(t, func(d *Deps) {
		d.FailPoint = k.hit
		d.RecoveryInterval = 20 * time.Millisecond
	})
	cat := h.start(t, "source_review", false).GetCatalogue()
	h.policy.mu.Lock()
	h.policy.exhausted = true
	h.policy.mu.Unlock()
	k.arm(FailPointSubmitReceived)
	args := map[string]any{"source": handleFor(t, cat, capRetrieveAuthorizedSource, migrationGuide.GetTitle())}
	_, err := h.submit(t, cat.GetTaskId(), "call_1", capRetrieveAuthorizedSource, args)
	wantErr(t, err, codes.Unavailable, reasonReplicaStopped)
	id := requestOfCall(t, h, cat.GetTaskId(), "call_1").GetId()

	var got *orchestratorv1.ToolRequest
	testkit.Eventually(t, "the request decided again", func() bool {
		got, err = h.client.GetRequest(t.Context(), &orchestratorv1.GetRequestRequest{Id: id})
		if err != nil {
			t.Fatal(err)
		}
		return settled(got)
	})
	if got.GetState() != orchestratorv1.RequestState_REQUEST_STATE_REFUSED || got.GetRefusalReason() != "BUDGET_EXCEEDED" ||
		got.GetRefusalCode() != codeName(codes.ResourceExhausted) {
		t.Fatalf("recovered = %v (%s %s); want REFUSED, RESOURCE_EXHAUSTED BUDGET_EXCEEDED", got.GetState(), got.GetRefusalCode(), got.GetRefusalReason())
	}
	h.policy.mu.Lock()
	refusals := h.policy.refusals[got.GetIntentId()]
	h.policy.mu.Unlock()
	if refusals != 1 {
		t.Errorf("the intent's charge was refused %d times; want once: the refusal is the decision", refusals)
	}
	if n := h.adapter.calls.Load(); n != 0 {
		t.Errorf("the server was called %d times, want never", n)
	}
	_, err = h.submit(t, cat.GetTaskId(), "call_1", capRetrieveAuthorizedSource, args)
	wantErr(t, err, codes.ResourceExhausted, "BUDGET_EXCEEDED")
}

// An approval that expires unused ends its request: recovery refuses it,
// recording the expiry, and nothing is rendered.
func TestRecoveryRefusesAnExpiredApproval(t *testing.T) {
	t.Parallel()
	h, k := recoveringHarness(t)
	task := h.start(t, "preview", false).GetTask()
	r := h.submitPreview(t, task.GetId(), "call_1")
	// A pass while the approval is live changes nothing: two passes
	// completed after the request was stored, so one began after it.
	from := k.passes.Load()
	testkit.Eventually(t, "two recovery passes after the request", func() bool { return k.passes.Load() >= from+2 })
	if cur, _ := h.server.st.GetRequest(t.Context(), r.GetId()); cur.GetState() != orchestratorv1.RequestState_REQUEST_STATE_AWAITING_APPROVAL {
		t.Fatalf("a live approval's request became %v", cur.GetState())
	}
	h.clock.Advance(DefaultApprovalTTL)
	got := waitRequest(t, h, r.GetId(), settled)
	if got.GetState() != orchestratorv1.RequestState_REQUEST_STATE_REFUSED || got.GetRefusalReason() != reasonApprovalInvalidated ||
		got.GetApproval().GetInvalidated() != orchestratorv1.ApprovalBinding_APPROVAL_BINDING_EXPIRY {
		t.Errorf("expired = %v (%s, binding %v); want REFUSED by the expiry binding", got.GetState(), got.GetRefusalReason(), got.GetApproval().GetInvalidated())
	}
	if h.renders.Load() != 0 {
		t.Errorf("rendered %d times, want 0", h.renders.Load())
	}
}

// takeOver has another replica take over the one unsettled request of s,
// as after s paused longer than its lease.
func takeOver(t *testing.T, s *Server) {
	t.Helper()
	rs, err := s.st.ListUnsettledRequests(t.Context())
	if err != nil || len(rs) != 1 {
		t.Errorf("unsettled = %v, %v", rs, err)
		return
	}
	id := rs[0].GetId()
	if err := s.st.ReleaseLease(t.Context(), id, s.replica); err != nil {
		t.Error(err)
	}
	if gen, err := s.st.AcquireLease(t.Context(), id, "replica_other", 0, time.Hour); gen == 0 || err != nil {
		t.Errorf("take over = generation %d, %v", gen, err)
	}
}

// A replica that lost its lease while working (another replica took the
// request over) does not call the adapter for it: the attempt stays open
// for the new owner, and the approver is told.
func TestLostLeaseStopsBeforeTheRemoteCall(t *testing.T) {
	t.Parallel()
	var h *previewHarness
	const ttl = 300 * time.Millisecond
	h = newPreviewHarness(t, func(d *Deps) {
		d.LeaseTTL = ttl
		d.RecoveryInterval = time.Hour // no recovery joins in
		d.FailPoint = func(point string) error {
			if point != FailPointAttemptPrepared {
				return nil
			}
			// The renewal finds the lease gone.
			takeOver(t, h.server)
			time.Sleep(2 * ttl)
			return nil
		}
	})
	task := h.start(t, "preview", false).GetTask()
	r := h.submitPreview(t, task.GetId(), "call_1")
	calls := h.adapter.calls.Load()
	_, err := h.approve(t, r.GetId())
	wantErr(t, err, codes.Aborted, "REQUEST_LEASE_LOST")
	if n := h.adapter.calls.Load() - calls; n != 0 || h.renders.Load() != 0 {
		t.Errorf("%d adapter calls, %d renders after the lease was lost; want 0", n, h.renders.Load())
	}
	got, err := h.server.st.GetRequest(t.Context(), r.GetId())
	if err != nil || openAttempt(got) == nil {
		t.Errorf("request = %v, %v; want its attempt left open for the new owner", got, err)
	}
}

// An approved request whose replica stopped before the first attempt, in a
// task cancelled meanwhile, is not left APPROVED: the next process's
// recovery refuses it, and nothing is rendered.
func TestRecoveryEndsAnApprovedRequestOfACancelledTask(t *testing.T) {
	t.Parallel()
	k := &killAt{}
	h := newPreviewHarness(t, func(d *Deps) {
		d.FailPoint = k.hit
		d.RecoveryInterval = time.Hour // only the restarted server recovers
		// The restarted server shares the store object (and so the stopped
		// one's lease, as Redis would): it takes over once the lease expired.
		d.LeaseTTL = 300 * time.Millisecond
	})
	task := h.start(t, "preview", false).GetTask()
	r := h.submitPreview(t, task.GetId(), "call_1")
	k.arm(FailPointApprovalUsed)
	_, err := h.approve(t, r.GetId())
	wantErr(t, err, codes.Unavailable, reasonReplicaStopped)
	if _, err := h.client.CancelTask(t.Context(), &orchestratorv1.CancelTaskRequest{Id: task.GetId(), Reason: "author left"}); err != nil {
		t.Fatal(err)
	}
	if cur, _ := h.server.st.GetRequest(t.Context(), r.GetId()); cur.GetState() != orchestratorv1.RequestState_REQUEST_STATE_APPROVED {
		t.Fatalf("before recovery the request is %v, want APPROVED", cur.GetState())
	}

	deps := h.server.deps
	deps.RecoveryInterval = 20 * time.Millisecond
	restarted := NewServer(h.server.st, deps, nil)
	t.Cleanup(restarted.Close)
	got := waitRequest(t, h, r.GetId(), settled)
	if got.GetState() != orchestratorv1.RequestState_REQUEST_STATE_REFUSED || got.GetRefusalReason() != "NOT_ATTEMPTED" {
		t.Errorf("recovered = %v (%s: %s); want REFUSED, not attempted", got.GetState(), got.GetRefusalReason(), got.GetRefusalDetail())
	}
	if h.renders.Load() != 0 || len(got.GetAttempts()) != 0 {
		t.Errorf("%d renders, attempts %v; want none", h.renders.Load(), got.GetAttempts())
	}
}

// A policy outage when an approved request is charged is no verdict: the
// approver gets UNAVAILABLE, the request stays APPROVED (not refused for
// good), and recovery charges it under its intent and renders it once
// policy is back.
func TestApprovedRequestChargedDuringAPolicyOutageIsRecovered(t *testing.T) {
	t.Parallel()
	h := newPreviewHarness(t, func(d *Deps) { d.RecoveryInterval = 20 * time.Millisecond })
	task := h.start(t, "preview", false).GetTask()
	r := h.submitPreview(t, task.GetId(), "call_1")
	h.policy.mu.Lock()
	h.policy.callsDown = true
	h.policy.mu.Unlock()
	_, err := h.approve(t, r.GetId())
	wantErr(t, err, codes.Unavailable, "STORE_UNAVAILABLE") // policy's, passed on
	if cur, err := h.server.st.GetRequest(t.Context(), r.GetId()); err != nil || cur.GetState() != orchestratorv1.RequestState_REQUEST_STATE_APPROVED {
		t.Fatalf("request during the outage = %v, %v; want APPROVED", cur.GetState(), err)
	}
	h.policy.mu.Lock()
	h.policy.callsDown = false
	h.policy.mu.Unlock()
	got := waitRequest(t, h, r.GetId(), settled)
	if got.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED || h.renders.Load() != 1 {
		t.Errorf("recovered = %v after %d renders; want EXECUTED, rendered once", got.GetState(), h.renders.Load())
	}
}
