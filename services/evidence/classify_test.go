package evidence_test

import (
	"testing"

	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
)

// TestClassifyTrace: the dual trace tells apart a request the product
// forbade (no protocol event), one the server rejected after policy
// allowed it, one that completed remotely but was not recorded, and one
// that completed.
func TestClassifyTrace(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const task = "task_k"
	product := func(kind evidencev1.ProductEventKind, req, att, outcome, reason string) *evidencev1.TraceEvent {
		return &evidencev1.TraceEvent{TaskId: task, Layer: &evidencev1.TraceEvent_Product{Product: &evidencev1.ProductEvent{
			Kind: kind, Capability: "retrieve", RequestId: req, AttemptId: att, Outcome: outcome, Reason: reason, PolicyDecision: map[bool]string{true: "allow by p0"}[kind == evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_POLICY_DECISION],
		}}}
	}
	protocol := func(att, outcome, code string) *evidencev1.TraceEvent {
		pe := &evidencev1.ProtocolEvent{ConnectionId: "conn", RequestId: att, Method: "tools/call", Outcome: outcome}
		if code != "" {
			pe.Error = &evidencev1.ErrorEvidence{SafeCode: code, UntrustedDetail: "no such note"}
		}
		return &evidencev1.TraceEvent{TaskId: task, Layer: &evidencev1.TraceEvent_Protocol{Protocol: pe}}
	}
	const (
		received = evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_REQUEST_RECEIVED
		refused  = evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_REQUEST_REFUSED
		policy   = evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_POLICY_DECISION
		executed = evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_EXECUTED
		conseq   = evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_CONSEQUENCE
	)
	for _, ev := range []*evidencev1.TraceEvent{
		product(received, "req_forbidden", "", "", ""),
		product(refused, "req_forbidden", "", "", "CAPABILITY_NOT_OFFERED"),
		product(received, "req_rejected", "", "", ""),
		product(policy, "req_rejected", "", "", ""),
		protocol("att_rejected", "invalid_request", "TOOL_ERROR"),
		product(executed, "req_rejected", "att_rejected", "invalid_request", ""),
		product(conseq, "req_rejected", "att_rejected", "invalid_request", "TOOL_ERROR"),
		product(received, "req_lost", "", "", ""),
		product(policy, "req_lost", "", "", ""),
		protocol("att_lost", "ok", ""),
		product(executed, "req_lost", "att_lost", "ok", ""),
		product(conseq, "req_lost", "att_lost", "ok", "OBSERVATION_NOT_RECORDED"),
		product(received, "req_ok", "", "", ""),
		product(policy, "req_ok", "", "", ""),
		protocol("att_ok", "ok", ""),
		product(executed, "req_ok", "att_ok", "ok", ""),
		product(conseq, "req_ok", "att_ok", "ok", ""),
		product(received, "req_waiting", "", "", ""),
		protocol("att_transport", "unknown", "TRANSPORT_CLOSED"),
	} {
		if _, err := e.client.AppendTrace(t.Context(), &evidencev1.AppendTraceRequest{Event: ev}); err != nil {
			t.Fatal(err)
		}
	}
	// req_lost's consequence keeps the remote outcome "ok" with the reason
	// OBSERVATION_NOT_RECORDED, as the orchestrator records it.
	got, err := e.client.ClassifyTrace(t.Context(), &evidencev1.ClassifyTraceRequest{TaskId: task})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]evidencev1.RequestClass{
		"req_forbidden": evidencev1.RequestClass_REQUEST_CLASS_PRODUCT_FORBIDDEN,
		"req_rejected":  evidencev1.RequestClass_REQUEST_CLASS_SERVER_REJECTED,
		"req_lost":      evidencev1.RequestClass_REQUEST_CLASS_NOT_RECORDED,
		"req_ok":        evidencev1.RequestClass_REQUEST_CLASS_COMPLETED,
		"req_waiting":   evidencev1.RequestClass_REQUEST_CLASS_PENDING,
	}
	if len(got.GetRequests()) != len(want) {
		t.Fatalf("classified %d requests, want %d: %v", len(got.GetRequests()), len(want), got.GetRequests())
	}
	for _, c := range got.GetRequests() {
		if c.GetClass() != want[c.GetRequestId()] {
			t.Errorf("%s classified %v, want %v", c.GetRequestId(), c.GetClass(), want[c.GetRequestId()])
		}
	}
	byID := map[string]*evidencev1.RequestClassification{}
	for _, c := range got.GetRequests() {
		byID[c.GetRequestId()] = c
	}
	if c := byID["req_forbidden"]; c.GetProductReason() != "CAPABILITY_NOT_OFFERED" || c.GetProtocolOutcome() != "" || len(c.GetAttemptIds()) != 0 {
		t.Errorf("forbidden = %v", c)
	}
	if c := byID["req_rejected"]; c.GetPolicyDecision() != "allow by p0" || c.GetProtocolSafeCode() != "TOOL_ERROR" || c.GetAttemptIds()[0] != "att_rejected" {
		t.Errorf("rejected = %v", c)
	}
}

// TestClassifyNotRecorded: protocol ok, consequence failed with
// OBSERVATION_NOT_RECORDED.
func TestClassifyNotRecorded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, ev := range []*evidencev1.TraceEvent{
		{TaskId: "t", Layer: &evidencev1.TraceEvent_Protocol{Protocol: &evidencev1.ProtocolEvent{RequestId: "att_1", Outcome: "ok"}}},
		{TaskId: "t", Layer: &evidencev1.TraceEvent_Product{Product: &evidencev1.ProductEvent{Kind: evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_EXECUTED, RequestId: "req_1", AttemptId: "att_1", Outcome: "ok"}}},
		{TaskId: "t", Layer: &evidencev1.TraceEvent_Product{Product: &evidencev1.ProductEvent{Kind: evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_CONSEQUENCE, RequestId: "req_1", AttemptId: "att_1", Outcome: "unknown", Reason: "OBSERVATION_NOT_RECORDED"}}},
	} {
		if _, err := e.client.AppendTrace(t.Context(), &evidencev1.AppendTraceRequest{Event: ev}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := e.client.ClassifyTrace(t.Context(), &evidencev1.ClassifyTraceRequest{TaskId: "t"})
	if err != nil || len(got.GetRequests()) != 1 || got.GetRequests()[0].GetClass() != evidencev1.RequestClass_REQUEST_CLASS_NOT_RECORDED ||
		len(got.GetRequests()[0].GetSequences()) != 3 {
		t.Errorf("classification = %v, %v", got, err)
	}
}
