package attack_test

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	"github.com/v0m3/v0m3/suite"
)

// Each trace layer has one writer: an adapter that forges a policy
// decision into a task's trace, or an orchestrator that forges what a
// server answered, is refused over mutual TLS, and nothing of the call is
// stored, not even its events of the caller's own layer.
func TestTraceLayerHasOneWriter(t *testing.T) {
	t.Parallel()
	s := startServices(t, suite.Registry, suite.Policy, suite.Evidence)
	adapter, orchestrator := peers(t, s, suite.Adapter), peers(t, s, suite.Orchestrator)
	const task = "task_forged_trace"
	product := &evidencev1.TraceEvent{TaskId: task, Layer: &evidencev1.TraceEvent_Product{Product: &evidencev1.ProductEvent{
		Kind: evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_POLICY_DECISION, PolicyDecision: "allow by forged-policy", Detail: "forged",
	}}}
	protocol := &evidencev1.TraceEvent{TaskId: task, Layer: &evidencev1.TraceEvent_Protocol{Protocol: &evidencev1.ProtocolEvent{
		Method: "tools/call", ResponseDigest: "sha256:forged",
	}}}
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		client suite.Clients
		events []*evidencev1.TraceEvent
	}{
		{"the adapter writes a product event", adapter, []*evidencev1.TraceEvent{product}},
		{"the orchestrator writes a protocol event", orchestrator, []*evidencev1.TraceEvent{protocol}},
		{"the adapter hides a product event behind its own", adapter, []*evidencev1.TraceEvent{protocol, product}},
		{"the orchestrator hides a protocol event behind its own", orchestrator, []*evidencev1.TraceEvent{product, protocol}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if len(tc.events) == 1 {
				_, err = tc.client.Evidence.AppendTrace(ctx, &evidencev1.AppendTraceRequest{Event: tc.events[0]})
			} else {
				_, err = tc.client.Evidence.AppendTraces(ctx, &evidencev1.AppendTracesRequest{Events: tc.events})
			}
			if !apierror.Is(err, codes.PermissionDenied, "TRACE_LAYER_NOT_OWNED") {
				t.Errorf("append = %v, want PERMISSION_DENIED TRACE_LAYER_NOT_OWNED", err)
			}
		})
	}
	trace, err := orchestrator.Evidence.GetTrace(ctx, &evidencev1.GetTraceRequest{TaskId: task})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(trace.GetEvents()); n != 0 {
		t.Errorf("the refused appends left %d events: %v", n, trace.GetEvents())
	}
	// Each writes its own layer.
	if _, err := adapter.Evidence.AppendTrace(ctx, &evidencev1.AppendTraceRequest{Event: protocol}); err != nil {
		t.Errorf("the adapter's protocol event: %v", err)
	}
	if _, err := orchestrator.Evidence.AppendTrace(ctx, &evidencev1.AppendTraceRequest{Event: product}); err != nil {
		t.Errorf("the orchestrator's product event: %v", err)
	}
}
