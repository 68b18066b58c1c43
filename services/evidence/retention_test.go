package evidence_test

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
)

// TestPruneKeepsCitedObservations: the Prune RPC reduces old protocol
// events to their summary and never touches an observation, least of all
// one a claim cites.
func TestPruneKeepsCitedObservations(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	obs := record(t, e, observation("task_p", "conn_p", "notes://p", "The limit applies per API key."))
	link, err := e.client.LinkClaim(t.Context(), &evidencev1.LinkClaimRequest{ClaimId: "claim_p", ObservationId: obs.GetId(), PassageId: "p1"})
	if err != nil {
		t.Fatal(err)
	}
	args, _ := structpb.NewStruct(map[string]any{"query": "limits"})
	if _, err := e.client.AppendTrace(t.Context(), &evidencev1.AppendTraceRequest{Event: &evidencev1.TraceEvent{TaskId: "task_p",
		Layer: &evidencev1.TraceEvent_Protocol{Protocol: &evidencev1.ProtocolEvent{RequestId: "att_task_p", Outcome: "invalid_request", SafeArguments: args,
			Error: &evidencev1.ErrorEvidence{SafeCode: "TOOL_ERROR", UntrustedDetail: "remote text"}}}}}); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(48 * time.Hour)
	resp, err := e.client.Prune(t.Context(), &evidencev1.PruneRequest{OlderThan: durationpb.New(24 * time.Hour)})
	if err != nil || resp.GetSummarizedEvents() != 1 {
		t.Fatalf("Prune = %v, %v; want 1 event summarized", resp, err)
	}
	tr, err := e.client.GetTrace(t.Context(), &evidencev1.GetTraceRequest{TaskId: "task_p"})
	if err != nil {
		t.Fatal(err)
	}
	pe := tr.GetEvents()[0].GetProtocol()
	if pe.GetSafeArguments() != nil || pe.GetError().GetUntrustedDetail() != "" || pe.GetError().GetSafeCode() != "TOOL_ERROR" {
		t.Errorf("pruned event = %v", pe)
	}
	kept, err := e.client.GetObservation(t.Context(), &evidencev1.GetObservationRequest{Id: link.GetObservationId()})
	if err != nil || kept.GetPassages()[0].GetText() != "The limit applies per API key." || kept.GetRevisionId() != link.GetRevisionId() {
		t.Errorf("cited observation after prune = %v, %v", kept, err)
	}
	if _, err := e.client.Prune(t.Context(), &evidencev1.PruneRequest{}); err == nil {
		t.Error("Prune without an age succeeded")
	}
}
