package orchestrator

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
)

// With evidence frozen (it accepts calls and never answers), a caller who
// gives up gets its deadline, and the request it submitted still ends in
// a recorded state soon after, not held by the frozen dependency: every
// internal call is bounded, and the work continues detached from the
// caller under the request's lease.
func TestFrozenEvidenceLeavesNoRequestStuckAfterTheCallerGaveUp(t *testing.T) {
	t.Parallel()
	// The bound leaves the task's start (before evidence freezes) room on
	// a loaded machine; the caller gives up well before it.
	h := newHarness(t, func(d *Deps) { d.InternalCallTimeout = time.Second })
	cat := h.start(t, "source_review", false).GetCatalogue()
	handle := handleFor(t, cat, capRetrieveAuthorizedSource, migrationGuide.GetTitle())
	h.evidence.frozen.Store(true)

	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	_, err := h.client.SubmitToolRequest(ctx, &orchestratorv1.SubmitToolRequestRequest{
		TaskId: cat.GetTaskId(), ProviderCallId: "call_1", Capability: capRetrieveAuthorizedSource,
		Arguments: mustStruct(t, map[string]any{"source": handle}),
	})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("submit with evidence frozen = %v, want the caller's deadline", err)
	}
	gaveUp := time.Now()

	var got *orchestratorv1.ToolRequest
	waitFor(t, "the request recorded in an end state", func() bool {
		list, err := h.client.ListRequests(t.Context(), &orchestratorv1.ListRequestsRequest{TaskId: cat.GetTaskId()})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range list.GetRequests() {
			if r.GetProviderCallId() == "call_1" && settled(r) {
				got = r
				return true
			}
		}
		return false
	})
	if took := time.Since(gaveUp); took > 20*time.Second {
		t.Errorf("the request ended %v after the caller gave up", took)
	}
	switch got.GetState() {
	case orchestratorv1.RequestState_REQUEST_STATE_EXECUTED:
	case orchestratorv1.RequestState_REQUEST_STATE_FAILED:
		// The read happened but could not become evidence: said so.
		if code := got.GetAttempts()[0].GetError().GetSafeCode(); code != codeObservationNotRecorded {
			t.Errorf("failed with %q, want %s", code, codeObservationNotRecorded)
		}
	default:
		t.Fatalf("request = %v, want EXECUTED or FAILED", got.GetState())
	}
	if n := h.adapter.calls.Load(); n != 1 {
		t.Errorf("the server was called %d times, want once", n)
	}
	t.Logf("ended %v / %v after the caller gave up", got.GetState(), got.GetOutcome())
}
