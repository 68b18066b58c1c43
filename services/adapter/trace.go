package adapter

import (
	"context"
	"strings"
	"time"

	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Redacted replaces the value of a secret-looking argument in traces.
const Redacted = "[redacted]"

// secretKeyParts mark argument keys whose values never enter a trace.
var secretKeyParts = []string{"token", "secret", "password", "key", "credential", "authorization"}

// trace appends the protocol-layer trace event of one execution. A failure
// to append is logged, not returned: the call already happened.
func (s *Server) trace(ctx context.Context, req *adapterv1.ExecuteRequest, resp *adapterv1.ExecuteResponse) {
	if s.deps.Evidence == nil || req.GetTaskId() == "" {
		return
	}
	ev := &evidencev1.ProtocolEvent{
		ConnectionId:   req.GetConnectionId(),
		SnapshotId:     req.GetSnapshotId(),
		RequestId:      req.GetAttemptId(),
		Method:         resp.GetMethod(),
		SafeArguments:  redact(req.GetArguments()),
		ResponseDigest: resp.GetResponseDigest(),
		ResponseBytes:  resp.GetResponseBytes(),
		Outcome:        outcomeName(resp.GetOutcome()),
	}
	if st, ot := resp.GetSendTime(), resp.GetObserveTime(); st != nil && ot != nil {
		ev.Duration = durationpb.New(ot.AsTime().Sub(st.AsTime()))
	}
	if e := resp.GetError(); e != nil {
		ev.Error = &evidencev1.ErrorEvidence{SafeCode: e.GetSafeCode(), UntrustedDetail: e.GetUntrustedDetail(), AdapterDetail: e.GetAdapterDetail()}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := s.deps.Evidence.AppendTrace(ctx, &evidencev1.AppendTraceRequest{Event: &evidencev1.TraceEvent{
		TaskId: req.GetTaskId(),
		Time:   timestamppb.Now(),
		Layer:  &evidencev1.TraceEvent_Protocol{Protocol: ev},
	}}); err != nil {
		s.log.Warn("append protocol trace", "task_id", req.GetTaskId(), "attempt_id", req.GetAttemptId(), "error", err)
	}
}

// redact returns a copy of args with the value of every secret-looking key,
// at any depth, replaced by Redacted.
func redact(args *structpb.Struct) *structpb.Struct {
	if args == nil {
		return nil
	}
	out := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for k, v := range args.GetFields() {
		if isSecretKey(k) {
			out.Fields[k] = structpb.NewStringValue(Redacted)
			continue
		}
		out.Fields[k] = redactValue(v)
	}
	return out
}

func redactValue(v *structpb.Value) *structpb.Value {
	switch k := v.GetKind().(type) {
	case *structpb.Value_StructValue:
		return structpb.NewStructValue(redact(k.StructValue))
	case *structpb.Value_ListValue:
		l := &structpb.ListValue{}
		for _, e := range k.ListValue.GetValues() {
			l.Values = append(l.Values, redactValue(e))
		}
		return structpb.NewListValue(l)
	default:
		return v
	}
}

func isSecretKey(k string) bool {
	k = strings.ToLower(k)
	for _, p := range secretKeyParts {
		if strings.Contains(k, p) {
			return true
		}
	}
	return false
}
