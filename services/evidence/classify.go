package evidence

import (
	"context"
	"strings"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/authz"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
)

// notRecordedCodes are the consequence reasons that mean "the remote call
// completed but its result did not become a record".
var notRecordedCodes = map[string]bool{
	"OBSERVATION_NOT_RECORDED": true,
	"RECEIPT_NOT_RECORDED":     true,
}

// ClassifyTrace classifies each candidate request of a task by reading both
// trace layers. The layers are linked by attempt id: a product event names
// its request and attempt, a protocol event names the attempt as its
// request id.
func (s *Server) ClassifyTrace(ctx context.Context, req *evidencev1.ClassifyTraceRequest) (*evidencev1.TraceClassification, error) {
	if err := s.requireTask(ctx, authz.TraceRead, req.GetTaskId()); err != nil {
		return nil, err
	}
	if req.GetTaskId() == "" {
		return nil, apierror.InvalidArgument(apierror.ReasonFieldInvalid, "a task id is required", apierror.FieldViolation{Field: "task_id", Description: "required"})
	}
	events, err := s.st.ListTrace(ctx, req.GetTaskId())
	if err != nil {
		return nil, s.storeError(ctx, err, "classify trace", "", "", nil)
	}
	return &evidencev1.TraceClassification{TaskId: req.GetTaskId(), Requests: Classify(events)}, nil
}

// Classify classifies the candidate requests in one task's events (in
// sequence order).
func Classify(events []*evidencev1.TraceEvent) []*evidencev1.RequestClassification {
	type state struct {
		c           *evidencev1.RequestClassification
		refused     bool
		consequence *evidencev1.ProductEvent
		protocol    *evidencev1.ProtocolEvent
	}
	byRequest := map[string]*state{}
	var order []string
	attemptOf := map[string]string{} // attempt id → request id
	get := func(id string) *state {
		st := byRequest[id]
		if st == nil {
			st = &state{c: &evidencev1.RequestClassification{RequestId: id}}
			byRequest[id] = st
			order = append(order, id)
		}
		return st
	}
	for _, ev := range events {
		p := ev.GetProduct()
		if p == nil || p.GetRequestId() == "" {
			continue
		}
		st := get(p.GetRequestId())
		if a := p.GetAttemptId(); a != "" {
			if _, ok := attemptOf[a]; !ok {
				attemptOf[a] = p.GetRequestId()
				st.c.AttemptIds = append(st.c.AttemptIds, a)
			}
		}
	}
	for _, ev := range events {
		switch {
		case ev.GetProduct() != nil:
			p := ev.GetProduct()
			st := byRequest[p.GetRequestId()]
			if st == nil {
				continue
			}
			st.c.Sequences = append(st.c.Sequences, ev.GetSequence())
			if p.GetCapability() != "" {
				st.c.Capability = p.GetCapability()
			}
			switch p.GetKind() {
			case evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_REQUEST_REFUSED:
				st.refused = true
				st.c.ProductReason = p.GetReason()
			case evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_POLICY_DECISION:
				st.c.PolicyDecision = p.GetPolicyDecision()
			case evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_CONSEQUENCE:
				st.consequence = p
			}
		case ev.GetProtocol() != nil:
			pe := ev.GetProtocol()
			st := byRequest[attemptOf[pe.GetRequestId()]]
			if st == nil {
				continue
			}
			st.c.Sequences = append(st.c.Sequences, ev.GetSequence())
			st.protocol = pe
		}
	}
	out := make([]*evidencev1.RequestClassification, 0, len(order))
	for _, id := range order {
		st := byRequest[id]
		c := st.c
		if st.protocol != nil {
			c.ProtocolOutcome = st.protocol.GetOutcome()
			c.ProtocolSafeCode = st.protocol.GetError().GetSafeCode()
		}
		if st.consequence != nil {
			c.ConsequenceOutcome = st.consequence.GetOutcome()
			if st.consequence.GetReason() != "" {
				c.ProductReason = st.consequence.GetReason()
			}
		}
		switch {
		case st.refused && st.protocol == nil:
			c.Class = evidencev1.RequestClass_REQUEST_CLASS_PRODUCT_FORBIDDEN
		case st.consequence == nil:
			c.Class = evidencev1.RequestClass_REQUEST_CLASS_PENDING
		case notRecordedCodes[st.consequence.GetReason()] && c.GetProtocolOutcome() == "ok":
			// The orchestrator keeps the attempt's (remote) outcome on such
			// a consequence, so the reason decides, not the outcome.
			c.Class = evidencev1.RequestClass_REQUEST_CLASS_NOT_RECORDED
		case st.consequence.GetOutcome() == "ok" && st.consequence.GetReason() == "":
			c.Class = evidencev1.RequestClass_REQUEST_CLASS_COMPLETED
		case serverAnswered(c.GetProtocolSafeCode()):
			c.Class = evidencev1.RequestClass_REQUEST_CLASS_SERVER_REJECTED
		default:
			c.Class = evidencev1.RequestClass_REQUEST_CLASS_DELIVERY_FAILED
		}
		out = append(out, c)
	}
	return out
}

// serverAnswered reports whether a protocol safe code is the server's own
// rejection (a tool error or a JSON-RPC error it sent) rather than a
// transport or local limit failure.
func serverAnswered(code string) bool {
	return code == "TOOL_ERROR" || strings.HasPrefix(code, "JSONRPC_")
}
