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
// gives up gets its deadline, and the request it submitted does not hang
// on the frozen dependency: every internal call is bounded and the work
// continues detached from the caller under the request's lease. The read
// happened, but its observation cannot be recorded: the request honestly
// waits (its attempt open at RESULT_OBSERVED, outcome OK,
// OBSERVATION_NOT_RECORDED) for as long as evidence is frozen, and
// recovery records it and commits it once evidence answers again,
// without reading again.
func TestFrozenEvidenceLeavesNoRequestStuckAfterTheCallerGaveUp(t *testing.T) {
	t.Parallel()
	// The bound leaves the task's start (before evidence freezes) room on
	// a loaded machine; the caller gives up well before it.
	h := newHarness(t, func(d *Deps) {
		d.InternalCallTimeout = time.Second
		d.RecoveryInterval = 50 * time.Millisecond
	})
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
	id := requestOfCall(t, h, cat.GetTaskId(), "call_1").GetId()
	wantAwaitingObservation(t, h, id)

	h.evidence.frozen.Store(false)
	wantRecordedOnce(t, h, cat.GetTaskId(), id)
}
