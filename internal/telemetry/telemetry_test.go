package telemetry

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/v0m3/v0m3/internal/apierror"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
)

const secret = "ghp_UNITsecretVALUE0123456789abcdefABCD"

// TestSetupWithoutEndpoint: without OTEL_EXPORTER_OTLP_ENDPOINT no
// exporter is installed and spans cost nothing (they do not record).
func TestSetupWithoutEndpoint(t *testing.T) {
	t.Setenv(EndpointEnv, "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	shutdown, err := Setup(context.Background(), "test")
	if err != nil {
		t.Fatal(err)
	}
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, span := otel.GetTracerProvider().Tracer("t").Start(context.Background(), "x")
	if span.IsRecording() {
		t.Error("a span records without an exporter configured")
	}
}

// TestInjectMeta: a traced call puts W3C traceparent in _meta; an
// untraced one adds nothing.
func TestInjectMeta(t *testing.T) {
	t.Parallel()
	tp := sdktrace.NewTracerProvider()
	ctx, span := tp.Tracer("t").Start(context.Background(), "call")
	defer span.End()
	meta := map[string]any{"v0m3/attempt": "att_1"}
	InjectMeta(ctx, meta)
	tp1, _ := meta["traceparent"].(string)
	if !strings.HasPrefix(tp1, "00-"+span.SpanContext().TraceID().String()+"-") {
		t.Errorf("traceparent %q does not carry trace %s", tp1, span.SpanContext().TraceID())
	}
	if _, ok := meta["baggage"]; ok {
		t.Error("baggage propagated: only trace context may leave")
	}
	empty := map[string]any{}
	InjectMeta(context.Background(), empty)
	if len(empty) != 0 {
		t.Errorf("an untraced call got _meta %v", empty)
	}
	if TraceID(ctx) != span.SpanContext().TraceID().String() || TraceID(context.Background()) != "" {
		t.Error("TraceID does not read the span's trace id")
	}
}

// TestUnaryServer: the server span gets the governed call's ids, never an
// argument value; refusals are counted with their reason, store failures
// as store errors; a capability no mapping resolved is not a label.
func TestUnaryServer(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	svc := "unit-" + t.Name()
	intercept := UnaryServer(svc)
	call := func(method string, req, resp any, err error) {
		ctx, span := tp.Tracer("t").Start(context.Background(), method, trace.WithSpanKind(trace.SpanKindServer))
		_, _ = intercept(ctx, req, &grpc.UnaryServerInfo{FullMethod: "/v0m3.orchestrator.v1.OrchestratorService/" + method},
			func(context.Context, any) (any, error) { return resp, err })
		span.End()
	}
	args, _ := structpb.NewStruct(map[string]any{"query": secret})
	done := &orchestratorv1.ToolRequest{Id: "req_1", TaskId: "tsk_1", IntentId: "int_1", Capability: "retrieve_authorized_source",
		Arguments: args, MappingId: "map_1", MappingRevision: 3, Outcome: adapterv1.Outcome_OUTCOME_OK,
		State: orchestratorv1.RequestState_REQUEST_STATE_EXECUTED, Attempts: []*orchestratorv1.Attempt{{Id: "att_1"}}}
	call("SubmitToolRequest", &orchestratorv1.SubmitToolRequestRequest{TaskId: "tsk_1", Capability: "retrieve_authorized_source", Arguments: args}, done, nil)
	refused := apierror.InvalidArgument("UNKNOWN_ARGUMENT_FIELD", "no")
	call("SubmitToolRequest", &orchestratorv1.SubmitToolRequestRequest{TaskId: "tsk_1", Capability: secret, Arguments: args}, nil, refused)
	call("GetRequest", &orchestratorv1.GetRequestRequest{}, nil, apierror.New(codes.Internal, apierror.ReasonStoreFailure, "x", nil))
	call("GetRequest", &orchestratorv1.GetRequestRequest{}, nil, errors.New("plain"))

	spans := rec.Ended()
	if len(spans) != 4 {
		t.Fatalf("%d spans", len(spans))
	}
	want := map[string]string{AttrTask: "tsk_1", AttrRequest: "req_1", AttrIntent: "int_1", AttrAttempt: "att_1",
		AttrCapability: "retrieve_authorized_source", AttrMappingRevision: "3", AttrOutcome: "ok"}
	got := map[string]string{}
	for _, kv := range spans[0].Attributes() {
		got[string(kv.Key)] = kv.Value.String()
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("attribute %s = %q, want %q", k, got[k], v)
		}
	}
	for _, sp := range spans {
		for _, kv := range sp.Attributes() {
			if strings.Contains(kv.Value.String(), secret) {
				t.Errorf("span %s attribute %s carries the model's text or an argument value", sp.Name(), kv.Key)
			}
		}
	}
	if v := testutil.ToFloat64(RPCs.WithLabelValues(svc, "SubmitToolRequest", "InvalidArgument", "UNKNOWN_ARGUMENT_FIELD")); v != 1 {
		t.Errorf("refusal counted %v times", v)
	}
	if v := testutil.ToFloat64(StoreErrors.WithLabelValues(svc)); v != 1 {
		t.Errorf("store errors %v, want 1 (a plain error is not one)", v)
	}
	if v := testutil.ToFloat64(GovernedCalls.WithLabelValues("unresolved", "refused", "UNKNOWN_ARGUMENT_FIELD")); v < 1 {
		t.Errorf("refused governed call counted %v times", v)
	}
	if labels := governedLabels(&orchestratorv1.ToolRequest{Capability: secret, State: orchestratorv1.RequestState_REQUEST_STATE_REFUSED}); labels[0] != "unresolved" || labels[1] != "refused" {
		t.Errorf("an unresolved request's labels %v: the model's text became a label", labels)
	}
}

// The waiting gauges count what the source read at scrape time and age the
// oldest of each; a source that cannot read its store reports nothing
// rather than a wrong zero.
func TestWaitingGauges(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	c := &waitingCollector{now: func() time.Time { return now }, source: func(context.Context) (Waiting, error) {
		return Waiting{
			Approvals:   []time.Time{now.Add(-time.Minute), now.Add(-90 * time.Second)},
			Settlements: []time.Time{now.Add(-time.Hour)},
		}, nil
	}}
	want := `
# HELP v0m3_approval_oldest_wait_seconds Age of the oldest tool request awaiting approval (0 when none waits).
# TYPE v0m3_approval_oldest_wait_seconds gauge
v0m3_approval_oldest_wait_seconds 90
# HELP v0m3_approvals_waiting Tool requests awaiting approval, as the orchestrator's store holds them at scrape time.
# TYPE v0m3_approvals_waiting gauge
v0m3_approvals_waiting 2
# HELP v0m3_settlement_oldest_wait_seconds Time since the oldest unknown outcome awaiting settlement became unknown (0 when none waits).
# TYPE v0m3_settlement_oldest_wait_seconds gauge
v0m3_settlement_oldest_wait_seconds 3600
# HELP v0m3_settlements_waiting Tool requests whose outcome is unknown and awaits settlement (FAILED / UNKNOWN), as the orchestrator's store holds them at scrape time.
# TYPE v0m3_settlements_waiting gauge
v0m3_settlements_waiting 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	c.source = func(context.Context) (Waiting, error) { return Waiting{}, errors.New("store down") }
	if n := testutil.CollectAndCount(c); n != 0 {
		t.Errorf("a failed read reported %d metrics, want none", n)
	}
}
