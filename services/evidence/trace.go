package evidence

import (
	"context"
	"fmt"
	"strings"

	oteltrace "go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/authz"
	"github.com/v0m3/v0m3/internal/failpoint"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/ids"
	"github.com/v0m3/v0m3/internal/redact"
	"github.com/v0m3/v0m3/internal/telemetry"
	"github.com/v0m3/v0m3/internal/tracesend"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
)

// Redacted replaces the value of any field whose name looks secret.
const Redacted = redact.Placeholder

// maxAppendTraces bounds the events of one AppendTraces call; the
// writers' sender (tracesend) splits its sends by the same bound.
const maxAppendTraces = tracesend.MaxEvents

// AppendTrace appends one event, of either layer, to a task's trace. The
// event gets an id and the task's next sequence number; its time defaults
// to now. Protocol arguments whose names look secret are stored as
// "[redacted]" whatever the caller sent.
func (s *Server) AppendTrace(ctx context.Context, req *evidencev1.AppendTraceRequest) (*evidencev1.TraceEvent, error) {
	if vs := validateTraceEvent(req.GetEvent()); len(vs) > 0 {
		return nil, apierror.InvalidArgument("TRACE_EVENT_INVALID", "the trace event is incomplete or malformed; see the field violations", vs...)
	}
	out, err := s.appendTraces(ctx, []*evidencev1.TraceEvent{req.GetEvent()})
	if err != nil {
		return nil, err
	}
	return out[0], nil
}

// AppendTraces appends several events as AppendTrace does each, in one
// step and in order: a call's events written together. One invalid event
// refuses them all, and nothing is stored.
func (s *Server) AppendTraces(ctx context.Context, req *evidencev1.AppendTracesRequest) (*evidencev1.AppendTracesResponse, error) {
	evs := req.GetEvents()
	if len(evs) == 0 || len(evs) > maxAppendTraces {
		return nil, apierror.InvalidArgument("TRACE_EVENT_INVALID", fmt.Sprintf("between 1 and %d events are required, not %d", maxAppendTraces, len(evs)),
			apierror.FieldViolation{Field: "events", Description: fmt.Sprintf("1 to %d events", maxAppendTraces)})
	}
	var vs []apierror.FieldViolation
	for i, ev := range evs {
		for _, v := range validateTraceEvent(ev) {
			v.Field = fmt.Sprintf("events[%d]%s", i, strings.TrimPrefix(v.Field, "event"))
			vs = append(vs, v)
		}
	}
	if len(vs) > 0 {
		return nil, apierror.InvalidArgument("TRACE_EVENT_INVALID", "a trace event is incomplete or malformed; see the field violations; nothing was stored", vs...)
	}
	out, err := s.appendTraces(ctx, evs)
	if err != nil {
		return nil, err
	}
	return &evidencev1.AppendTracesResponse{Events: out}, nil
}

// layerWriters names the one peer service that writes each trace layer:
// the orchestrator tells what the product decided and did, the adapter
// what crossed the wire. Neither may write the other's layer, so an
// adapter cannot put a policy decision, an approval or a consequence into
// a task's trace, nor the orchestrator a server's answer.
var layerWriters = map[string]string{"product": identity.Orchestrator, "protocol": identity.Adapter}

// checkLayers refuses events of a layer the calling peer does not write
// (TRACE_LAYER_NOT_OWNED), before anything is stored. A call without a
// peer identity comes from within the process (the access table admits
// only the two peers to AppendTrace and AppendTraces).
func checkLayers(ctx context.Context, evs []*evidencev1.TraceEvent) error {
	peer := identity.PeerFrom(ctx)
	if peer == "" {
		return nil
	}
	for i, ev := range evs {
		layer := layerName(ev)
		if w := layerWriters[layer]; w != peer {
			return apierror.New(codes.PermissionDenied, "TRACE_LAYER_NOT_OWNED",
				fmt.Sprintf("event %d is a %s event, which only the %s service writes; nothing was stored", i, layer, w),
				map[string]string{"layer": layer, "writer": w, "peer": peer})
		}
	}
	return nil
}

// appendTraces stores valid events: ids assigned, times defaulted, secret
// protocol arguments redacted.
func (s *Server) appendTraces(ctx context.Context, in []*evidencev1.TraceEvent) ([]*evidencev1.TraceEvent, error) {
	if err := checkLayers(ctx, in); err != nil {
		return nil, err
	}
	evs := make([]*evidencev1.TraceEvent, len(in))
	traceID := telemetry.TraceID(ctx)
	for i, e := range in {
		ev := proto.CloneOf(e)
		ev.Id, ev.Sequence = ids.New("evt"), 0
		// The distributed trace of the call the event tells of, as its
		// writer names it (an append may carry several calls' events),
		// else of the call that appended it: the link between the two
		// views.
		if ev.GetOtelTraceId() == "" {
			ev.OtelTraceId = traceID
		}
		if ev.Time == nil {
			ev.Time = s.timestamp()
		}
		if p := ev.GetProtocol(); p != nil {
			p.SafeArguments = redact.Struct(p.GetSafeArguments())
		}
		evs[i] = ev
	}
	failpoint.Hit(FailPointTraceBefore)
	out, err := s.st.AppendTraces(ctx, evs)
	if err != nil {
		return nil, s.storeError(ctx, err, "append trace", "", "", nil)
	}
	failpoint.Hit(FailPointTraceAfter)
	for _, ev := range out {
		s.log.DebugContext(ctx, "trace appended", "task_id", ev.GetTaskId(), "event_id", ev.GetId(),
			"sequence", ev.GetSequence(), "layer", layerName(ev))
	}
	return out, nil
}

func validateTraceEvent(ev *evidencev1.TraceEvent) []apierror.FieldViolation {
	if ev == nil {
		return []apierror.FieldViolation{{Field: "event", Description: "required"}}
	}
	vs := required(nil, [2]string{"event.task_id", ev.GetTaskId()})
	// A oneof holds at most one layer; a set-but-nil layer (possible for
	// in-process callers) counts as none.
	switch {
	case ev.GetProtocol() == nil && ev.GetProduct() == nil:
		vs = append(vs, apierror.FieldViolation{Field: "event.layer", Description: "exactly one of protocol or product is required"})
	case ev.GetProduct() != nil && ev.GetProduct().GetKind() == evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_UNSPECIFIED:
		vs = append(vs, apierror.FieldViolation{Field: "event.product.kind", Description: "required"})
	}
	if t := ev.GetTime(); t != nil && t.CheckValid() != nil {
		vs = append(vs, apierror.FieldViolation{Field: "event.time", Description: "not a valid timestamp"})
	}
	// The W3C form: 32 lowercase hex digits, not all zero.
	if id := ev.GetOtelTraceId(); id != "" {
		if _, err := oteltrace.TraceIDFromHex(id); err != nil {
			vs = append(vs, apierror.FieldViolation{Field: "event.otel_trace_id", Description: "an OpenTelemetry trace id: 32 lowercase hex digits, not all zero"})
		}
	}
	return vs
}

func layerName(ev *evidencev1.TraceEvent) string {
	if ev.GetProtocol() != nil {
		return "protocol"
	}
	return "product"
}

// GetTrace returns a task's trace, both layers, in sequence order. A task
// with no events gets an empty trace.
func (s *Server) GetTrace(ctx context.Context, req *evidencev1.GetTraceRequest) (*evidencev1.Trace, error) {
	if err := s.requireTask(ctx, authz.TraceRead, req.GetTaskId()); err != nil {
		return nil, err
	}
	if req.GetTaskId() == "" {
		return nil, apierror.InvalidArgument(apierror.ReasonFieldInvalid, "a task id is required", apierror.FieldViolation{Field: "task_id", Description: "required"})
	}
	events, err := s.st.ListTrace(ctx, req.GetTaskId())
	if err != nil {
		return nil, s.storeError(ctx, err, "get trace", "", "", nil)
	}
	return &evidencev1.Trace{TaskId: req.GetTaskId(), Events: events}, nil
}
