package evidence_test

import (
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/testkit"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
)

func TestStateSurvivesReopen(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "evidence.db")
	c := testkit.NewClock(t0)
	e := startEnv(t, path, c)
	const conn, uri = "conn_p", "notes://p"

	o1 := record(t, e, observation("task_p", conn, uri, "one"))
	o2 := record(t, e, observation("task_p", conn, uri, "two"))
	link, err := e.client.LinkClaim(t.Context(), &evidencev1.LinkClaimRequest{ClaimId: "claim_p", ObservationId: o1.GetId(), PassageId: "p1"})
	if err != nil {
		t.Fatalf("LinkClaim: %v", err)
	}
	ev1 := appendEvent(t, e, productEvent("task_p", evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_TASK_STARTED, ""))
	ev2 := appendEvent(t, e, protocolEvent("task_p", "resources/read", map[string]any{"uri_handle": "h_1"}))
	rc, err := e.client.RecordReceipt(t.Context(), &evidencev1.RecordReceiptRequest{Receipt: &evidencev1.Receipt{IdempotencyKey: "intent_p", DeliveryId: "d_p"}})
	if err != nil {
		t.Fatalf("RecordReceipt: %v", err)
	}
	revsBefore, err := e.client.ListRevisions(t.Context(), &evidencev1.ListRevisionsRequest{ConnectionId: conn, ResourceUri: uri})
	if err != nil {
		t.Fatalf("ListRevisions: %v", err)
	}
	e.stop()

	e = startEnv(t, path, c)
	got1, err := e.client.GetObservation(t.Context(), &evidencev1.GetObservationRequest{Id: o1.GetId()})
	if err != nil || !proto.Equal(got1, o1) {
		t.Errorf("after reopen GetObservation = %v, %v; want %v", got1, err, o1)
	}
	list, err := e.client.ListObservations(t.Context(), &evidencev1.ListObservationsRequest{TaskId: "task_p"})
	if err != nil || len(list.GetObservations()) != 2 || !proto.Equal(list.GetObservations()[1], o2) {
		t.Errorf("after reopen ListObservations = %v, %v", list, err)
	}
	revs, err := e.client.ListRevisions(t.Context(), &evidencev1.ListRevisionsRequest{ConnectionId: conn, ResourceUri: uri})
	if err != nil || !proto.Equal(revs, revsBefore) {
		t.Errorf("after reopen ListRevisions = %v, %v; want %v", revs, err, revsBefore)
	}
	trace, err := e.client.GetTrace(t.Context(), &evidencev1.GetTraceRequest{TaskId: "task_p"})
	if err != nil || len(trace.GetEvents()) != 2 || !proto.Equal(trace.GetEvents()[0], ev1) || !proto.Equal(trace.GetEvents()[1], ev2) {
		t.Errorf("after reopen GetTrace = %v, %v", trace, err)
	}
	gotRc, err := e.client.GetReceipt(t.Context(), &evidencev1.GetReceiptRequest{IdempotencyKey: "intent_p"})
	if err != nil || !proto.Equal(gotRc, rc) {
		t.Errorf("after reopen GetReceipt = %v, %v; want %v", gotRc, err, rc)
	}

	// Counters continue where they were: no sequence or revision restarts.
	ev3 := appendEvent(t, e, productEvent("task_p", evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_TASK_STATE, ""))
	if ev3.GetSequence() != 3 {
		t.Errorf("after reopen next sequence = %d, want 3", ev3.GetSequence())
	}
	o3 := record(t, e, observation("task_p", conn, uri, "three"))
	if o3.GetRevisionNumber() != 3 {
		t.Errorf("after reopen next revision = %d, want 3", o3.GetRevisionNumber())
	}
	again, err := e.client.RecordReceipt(t.Context(), &evidencev1.RecordReceiptRequest{Receipt: &evidencev1.Receipt{IdempotencyKey: "intent_p", DeliveryId: "d_other"}})
	if err != nil || !proto.Equal(again, rc) {
		t.Errorf("after reopen RecordReceipt same key = %v, %v; want the first %v", again, err, rc)
	}
	// The link made before closing still validates against its observation.
	if _, err := e.client.LinkClaim(t.Context(), &evidencev1.LinkClaimRequest{ClaimId: link.GetClaimId(), ObservationId: link.GetObservationId(), PassageId: link.GetPassageId()}); err != nil {
		t.Errorf("after reopen LinkClaim: %v", err)
	}
}
