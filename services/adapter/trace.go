package adapter

import (
	"context"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	"github.com/v0m3/v0m3/services/internal/redact"
	"github.com/v0m3/v0m3/services/internal/telemetry"
)

// Redacted replaces the value of a secret-looking argument in traces and
// fixtures.
const Redacted = redact.Placeholder

// trace appends the protocol-layer trace event of one execution, in a
// round trip shared with concurrent executions' events (tracesend). A
// failure to append is logged, not returned: the call already happened.
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
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := s.traces.Send(ctx, []*evidencev1.TraceEvent{{
		TaskId: req.GetTaskId(),
		Time:   timestamppb.Now(),
		Layer:  &evidencev1.TraceEvent_Protocol{Protocol: ev},
		// The call the event tells of: a shared round trip is another's.
		OtelTraceId: telemetry.TraceID(ctx),
	}}); err != nil {
		s.log.Warn("append protocol trace", "task_id", req.GetTaskId(), "attempt_id", req.GetAttemptId(), "error", logText(err))
	}
}
