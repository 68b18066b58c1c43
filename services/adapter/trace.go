package adapter

import (
	"context"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/v0m3/v0m3/internal/redact"
	"github.com/v0m3/v0m3/internal/telemetry"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
)

// Redacted replaces the value of a secret-looking argument in traces and
// fixtures.
const Redacted = redact.Placeholder

// trace appends the protocol-layer trace event of one execution, in a
// round trip shared with concurrent executions' events (tracesend). The
// call already happened, so a failure to append does not fail it: an
// event evidence cannot take now waits and is appended once evidence is
// back (retryqueue), under a delivery id of its attempt, so evidence
// stores it once however often it is sent.
func (s *Server) trace(ctx context.Context, req *adapterv1.ExecuteRequest, resp *adapterv1.ExecuteResponse, heard *callEvidence) {
	if s.deps.Evidence == nil || req.GetTaskId() == "" {
		return
	}
	ev := &evidencev1.ProtocolEvent{
		ConnectionId:   req.GetConnectionId(),
		SnapshotId:     req.GetSnapshotId(),
		RequestId:      req.GetAttemptId(),
		Method:         resp.GetMethod(),
		SafeArguments:  redact.Struct(req.GetArguments()),
		ResponseDigest: resp.GetResponseDigest(),
		ResponseBytes:  resp.GetResponseBytes(),
		Outcome:        outcomeName(resp.GetOutcome()),
	}
	if heard != nil {
		ev.ProgressNotifications = heard.progressCount
		for _, p := range heard.progress {
			ev.Progress = append(ev.Progress, &evidencev1.ProtocolProgress{
				Time: timestamppb.New(p.at), Progress: p.progress, Total: p.total, UntrustedMessage: p.message,
			})
		}
		for _, a := range heard.answers {
			ans := &evidencev1.ProtocolElicitationAnswer{Time: timestamppb.New(a.at), UntrustedMessage: a.message}
			for _, f := range a.fields {
				ans.Fields = append(ans.Fields, &evidencev1.ProtocolAnsweredField{Name: f.name, ValueDigest: f.valueDigest})
			}
			ev.ElicitationAnswers = append(ev.ElicitationAnswers, ans)
		}
	}
	if st, ot := resp.GetSendTime(), resp.GetObserveTime(); st != nil && ot != nil {
		ev.Duration = durationpb.New(ot.AsTime().Sub(st.AsTime()))
	}
	if e := resp.GetError(); e != nil {
		ev.Error = &evidencev1.ErrorEvidence{SafeCode: e.GetSafeCode(), UntrustedDetail: e.GetUntrustedDetail(), AdapterDetail: e.GetAdapterDetail()}
	}
	s.traces.Send(ctx, &evidencev1.TraceEvent{
		TaskId: req.GetTaskId(),
		Time:   timestamppb.Now(),
		Layer:  &evidencev1.TraceEvent_Protocol{Protocol: ev},
		// The call the event tells of: a shared round trip is another's.
		OtelTraceId: telemetry.TraceID(ctx),
		DeliveryId:  protocolDeliveryID(req.GetAttemptId()),
	})
}

// protocolDeliveryID is the delivery id of an attempt's protocol event:
// the adapter makes one per attempt (a grant is spent once).
func protocolDeliveryID(attemptID string) string { return "protocol/" + attemptID }
