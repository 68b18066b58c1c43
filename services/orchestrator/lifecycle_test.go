package orchestrator

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
)

// TestEndedRequestRefusesIllegalTransitions checks that a request that
// executed cannot be moved again by any path of the server: a late
// refusal or a late failure (each from a caller that read the request
// before it ended) leave the executed request, its outcome
// and its committed attempt as they are, because every path goes through
// the one lifecycle table.
func TestEndedRequestRefusesIllegalTransitions(t *testing.T) {
	h := newHarness(t)
	cat := h.start(t, "source_review", false).GetCatalogue()
	handle := handleFor(t, cat, capRetrieveAuthorizedSource, migrationGuide.GetTitle())
	r, err := h.submit(t, cat.GetTaskId(), "call_1", capRetrieveAuthorizedSource, map[string]any{"source": handle})
	if err != nil {
		t.Fatalf("submit: %v", err)
	}
	if r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
		t.Fatalf("request = %v; want EXECUTED", r.GetState())
	}
	ctx := context.Background()
	s := h.server
	_, _ = s.refuse(ctx, r, nil, apierror.New(codes.FailedPrecondition, "CAPABILITY_CHANGED", "a refusal decided on a stale read", nil))
	att := &orchestratorv1.Attempt{Id: "att_late", IntentId: r.GetIntentId(), Number: 2, Outcome: adapterv1.Outcome_OUTCOME_UNKNOWN}
	_, _ = s.fail(ctx, r, att)
	got, err := s.st.GetRequest(ctx, r.GetId())
	if err != nil {
		t.Fatalf("get request: %v", err)
	}
	if got.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED || got.GetOutcome() != adapterv1.Outcome_OUTCOME_OK ||
		got.GetRefusalReason() != "" || len(got.GetAttempts()) != 1 ||
		got.GetAttempts()[0].GetStage() != adapterv1.DeliveryStage_DELIVERY_STAGE_COMMITTED {
		t.Errorf("executed request after late transitions = %v; want it unchanged (EXECUTED, OK, one committed attempt)", got)
	}
}
