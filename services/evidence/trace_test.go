package evidence_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/v0m3/v0m3/internal/tracesend"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	"github.com/v0m3/v0m3/services/evidence"
)

func productEvent(task string, kind evidencev1.ProductEventKind, detail string) *evidencev1.TraceEvent {
	return &evidencev1.TraceEvent{TaskId: task, Layer: &evidencev1.TraceEvent_Product{Product: &evidencev1.ProductEvent{
		Kind: kind, Capability: "retrieve_authorized_source", Detail: detail,
	}}}
}

func protocolEvent(task, method string, args map[string]any) *evidencev1.TraceEvent {
	s, err := structpb.NewStruct(args)
	if err != nil {
		panic(err)
	}
	return &evidencev1.TraceEvent{TaskId: task, Layer: &evidencev1.TraceEvent_Protocol{Protocol: &evidencev1.ProtocolEvent{
		ConnectionId: "conn_t", SnapshotId: "snap_t", RequestId: "att_t", Method: method, SafeArguments: s,
		Duration: durationpb.New(30 * time.Millisecond), ResponseDigest: contentDigest("response"), ResponseBytes: 8, Outcome: "ok",
	}}}
}

func withTraceID(ev *evidencev1.TraceEvent, id string) *evidencev1.TraceEvent {
	ev.OtelTraceId = id
	return ev
}

func appendEvent(t *testing.T, e *env, ev *evidencev1.TraceEvent) *evidencev1.TraceEvent {
	t.Helper()
	out, err := e.client.AppendTrace(t.Context(), &evidencev1.AppendTraceRequest{Event: ev})
	if err != nil {
		t.Fatalf("AppendTrace: %v", err)
	}
	return out
}

func TestTraceOrderBothLayers(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	at := timestamppb.New(t0.Add(-time.Minute))
	stamped := protocolEvent("task_a", "tools/call", map[string]any{"query": "migration"})
	stamped.Time = at
	inputs := []*evidencev1.TraceEvent{
		productEvent("task_a", evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_TASK_STARTED, "started"),
		productEvent("task_b", evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_TASK_STARTED, "other task"),
		productEvent("task_a", evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_REQUEST_RECEIVED, "asked"),
		stamped,
		productEvent("task_b", evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_TASK_STATE, "other task"),
		productEvent("task_a", evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_OBSERVATION_RECORDED, "observed"),
	}
	var appended []*evidencev1.TraceEvent
	for _, in := range inputs {
		appended = append(appended, appendEvent(t, e, in))
	}
	wantSeq := []int64{1, 1, 2, 3, 2, 4}
	for i, ev := range appended {
		if ev.GetSequence() != wantSeq[i] || ev.GetId() == "" {
			t.Errorf("event %d: id %q sequence %d, want an id and sequence %d", i, ev.GetId(), ev.GetSequence(), wantSeq[i])
		}
	}
	if !appended[0].GetTime().AsTime().Equal(t0) {
		t.Errorf("default time = %v, want now %v", appended[0].GetTime().AsTime(), t0)
	}
	if !appended[3].GetTime().AsTime().Equal(at.AsTime()) {
		t.Errorf("caller's time not kept: %v", appended[3].GetTime().AsTime())
	}

	trace, err := e.client.GetTrace(t.Context(), &evidencev1.GetTraceRequest{TaskId: "task_a"})
	if err != nil {
		t.Fatalf("GetTrace: %v", err)
	}
	if trace.GetTaskId() != "task_a" {
		t.Errorf("trace task = %q", trace.GetTaskId())
	}
	want := []*evidencev1.TraceEvent{appended[0], appended[2], appended[3], appended[5]}
	if len(trace.GetEvents()) != len(want) {
		t.Fatalf("task_a trace has %d events, want %d: %v", len(trace.GetEvents()), len(want), trace.GetEvents())
	}
	for i := range want {
		if !proto.Equal(trace.GetEvents()[i], want[i]) {
			t.Errorf("event %d = %v, want %v", i, trace.GetEvents()[i], want[i])
		}
	}
	if trace.GetEvents()[2].GetProtocol().GetMethod() != "tools/call" || trace.GetEvents()[3].GetProduct() == nil {
		t.Errorf("layers not kept: %v", trace.GetEvents())
	}

	empty, err := e.client.GetTrace(t.Context(), &evidencev1.GetTraceRequest{TaskId: "task_none"})
	if err != nil || len(empty.GetEvents()) != 0 {
		t.Errorf("trace of a task without events = %v, %v; want empty", empty, err)
	}
}

func TestTraceSequenceUnderConcurrency(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const n = 20
	var wg sync.WaitGroup
	seqs := make([]int64, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			ev, err := e.client.AppendTrace(t.Context(), &evidencev1.AppendTraceRequest{
				Event: productEvent("task_c", evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_EXECUTED, "x"),
			})
			seqs[i], errs[i] = ev.GetSequence(), err
		})
	}
	wg.Wait()
	seen := map[int64]bool{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("AppendTrace: %v", errs[i])
		}
		if seqs[i] < 1 || seqs[i] > n || seen[seqs[i]] {
			t.Errorf("sequence %d duplicated or out of 1..%d: %v", seqs[i], n, seqs)
		}
		seen[seqs[i]] = true
	}
}

func TestAppendTraceValidation(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	tests := []struct {
		name   string
		ev     *evidencev1.TraceEvent
		fields []string
	}{
		{"missing event", nil, []string{"event"}},
		{"no task", productEvent("", evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_TASK_STARTED, ""), []string{"event.task_id"}},
		{"no layer", &evidencev1.TraceEvent{TaskId: "task_v"}, []string{"event.layer"}},
		{"nothing", &evidencev1.TraceEvent{}, []string{"event.task_id", "event.layer"}},
		{"product without kind", productEvent("task_v", evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_UNSPECIFIED, ""), []string{"event.product.kind"}},
		{"malformed trace id", withTraceID(productEvent("task_v", evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_TASK_STARTED, ""), "4BF92F3577B34DA6A3CE929D0E0E4736"), []string{"event.otel_trace_id"}},
		{"zero trace id", withTraceID(productEvent("task_v", evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_TASK_STARTED, ""), strings.Repeat("0", 32)), []string{"event.otel_trace_id"}},
		{"short trace id", withTraceID(productEvent("task_v", evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_TASK_STARTED, ""), "4bf92f3577b34da6"), []string{"event.otel_trace_id"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := e.client.AppendTrace(t.Context(), &evidencev1.AppendTraceRequest{Event: tc.ev})
			wantError(t, err, codes.InvalidArgument, "TRACE_EVENT_INVALID", tc.fields...)
		})
	}
	_, err := e.client.GetTrace(t.Context(), &evidencev1.GetTraceRequest{})
	wantError(t, err, codes.InvalidArgument, "FIELD_INVALID", "task_id")
}

func TestTraceRedactsSecretLookingArguments(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const secret = "s3cr3t-value"
	args := map[string]any{
		"query":         "migration notes",
		"api_key":       secret + "-1",
		"API-Key":       secret + "-2",
		"X-Auth-Token":  secret + "-3",
		"client_secret": secret + "-4",
		"Password":      secret + "-5",
		"credentials":   map[string]any{"user": secret + "-6"},
		"nested": map[string]any{
			"Authorization": "Bearer " + secret + "-7",
			"pages":         []any{map[string]any{"refresh_token": secret + "-8", "page": 2.0}},
			"limit":         10.0,
		},
	}
	appended := appendEvent(t, e, protocolEvent("task_r", "tools/call", args))

	trace, err := e.client.GetTrace(t.Context(), &evidencev1.GetTraceRequest{TaskId: "task_r"})
	if err != nil {
		t.Fatalf("GetTrace: %v", err)
	}
	for name, msg := range map[string]proto.Message{"GetTrace": trace, "AppendTrace": appended} {
		wire, err := proto.Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}
		js, err := protojson.Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}
		for form, b := range map[string][]byte{"wire": wire, "json": js, "text": []byte(prototext.Format(msg))} {
			if strings.Contains(string(b), secret) {
				t.Errorf("%s %s output contains the secret value: %s", name, form, b)
			}
		}
	}

	got := trace.GetEvents()[0].GetProtocol().GetSafeArguments().AsMap()
	for _, k := range []string{"api_key", "API-Key", "X-Auth-Token", "client_secret", "Password", "credentials"} {
		if got[k] != evidence.Redacted {
			t.Errorf("argument %q = %v, want %q", k, got[k], evidence.Redacted)
		}
	}
	nested := got["nested"].(map[string]any)
	if nested["Authorization"] != evidence.Redacted {
		t.Errorf("nested Authorization = %v, want redacted", nested["Authorization"])
	}
	page := nested["pages"].([]any)[0].(map[string]any)
	if page["refresh_token"] != evidence.Redacted || page["page"] != 2.0 {
		t.Errorf("list element = %v, want refresh_token redacted and page kept", page)
	}
	if got["query"] != "migration notes" || nested["limit"] != 10.0 {
		t.Errorf("safe arguments changed: %v", got)
	}
}

// AppendTraces stores a call's events together, in order, with the same
// treatment as AppendTrace (ids, sequences, redaction); one invalid event
// refuses the batch and stores nothing.
func TestAppendTraces(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const secret = "s3cr3t-batch"
	resp, err := e.client.AppendTraces(t.Context(), &evidencev1.AppendTracesRequest{Events: []*evidencev1.TraceEvent{
		productEvent("task_b", evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_REQUEST_RECEIVED, "first"),
		protocolEvent("task_b", "tools/call", map[string]any{"api_key": secret, "query": "q"}),
		productEvent("task_b", evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_CONSEQUENCE, "last"),
	}})
	if err != nil {
		t.Fatalf("AppendTraces: %v", err)
	}
	trace, err := e.client.GetTrace(t.Context(), &evidencev1.GetTraceRequest{TaskId: "task_b"})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetEvents()) != 3 || len(trace.GetEvents()) != 3 {
		t.Fatalf("appended %d, stored %d; want 3 and 3", len(resp.GetEvents()), len(trace.GetEvents()))
	}
	for i, ev := range trace.GetEvents() {
		if ev.GetSequence() != int64(i+1) || ev.GetId() == "" || ev.GetId() != resp.GetEvents()[i].GetId() || ev.GetTime() == nil {
			t.Errorf("event %d: sequence %d id %q time %v; returned id %q", i, ev.GetSequence(), ev.GetId(), ev.GetTime(), resp.GetEvents()[i].GetId())
		}
	}
	if d := trace.GetEvents()[2].GetProduct().GetDetail(); d != "last" {
		t.Errorf("third event = %q, want the batch's order", d)
	}
	if strings.Contains(prototext.Format(trace), secret) || strings.Contains(prototext.Format(resp), secret) {
		t.Errorf("a batch stored or returned a secret-looking argument")
	}

	tests := []struct {
		name   string
		events []*evidencev1.TraceEvent
		fields []string
	}{
		{"none", nil, []string{"events"}},
		{"too many", make([]*evidencev1.TraceEvent, 257), []string{"events"}},
		{"one invalid", []*evidencev1.TraceEvent{
			productEvent("task_i", evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_REQUEST_RECEIVED, "fine"),
			productEvent("", evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_UNSPECIFIED, "broken"),
		}, []string{"events[1].task_id", "events[1].product.kind"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.client.AppendTraces(t.Context(), &evidencev1.AppendTracesRequest{Events: tc.events})
			wantError(t, err, codes.InvalidArgument, "TRACE_EVENT_INVALID", tc.fields...)
		})
	}
	if trace, err := e.client.GetTrace(t.Context(), &evidencev1.GetTraceRequest{TaskId: "task_i"}); err != nil || len(trace.GetEvents()) != 0 {
		t.Errorf("a refused batch stored %d events (%v)", len(trace.GetEvents()), err)
	}
}

// TestTraceKeepsEachCallsTraceID: one append may carry the events of
// several calls (see tracesend); each event keeps the trace id of the
// call its writer names, so the link to the distributed trace is each
// call's own.
func TestTraceKeepsEachCallsTraceID(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const a, b = "4bf92f3577b34da6a3ce929d0e0e4736", "0af7651916cd43dd8448eb211c80319c"
	if _, err := e.client.AppendTraces(t.Context(), &evidencev1.AppendTracesRequest{Events: []*evidencev1.TraceEvent{
		withTraceID(productEvent("task_o", evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_REQUEST_RECEIVED, "call a"), a),
		withTraceID(productEvent("task_o", evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_REQUEST_RECEIVED, "call b"), b),
		productEvent("task_o", evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_REQUEST_RECEIVED, "unnamed"),
	}}); err != nil {
		t.Fatalf("AppendTraces: %v", err)
	}
	trace, err := e.client.GetTrace(t.Context(), &evidencev1.GetTraceRequest{TaskId: "task_o"})
	if err != nil {
		t.Fatal(err)
	}
	// This test's calls are not traced: an unnamed event gets none.
	want := map[string]string{"call a": a, "call b": b, "unnamed": ""}
	for _, ev := range trace.GetEvents() {
		if got := ev.GetOtelTraceId(); got != want[ev.GetProduct().GetDetail()] {
			t.Errorf("event %q has trace id %q, want %q", ev.GetProduct().GetDetail(), got, want[ev.GetProduct().GetDetail()])
		}
	}
}

// TestSharedDeliveryRefusesOnlyTheInvalidCaller: concurrent writers'
// events travel together (tracesend); a writer whose event evidence
// refuses gets the refusal, and every other writer's event is stored,
// once, whichever send carried it.
func TestSharedDeliveryRefusesOnlyTheInvalidCaller(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	send := tracesend.New(e.client)
	const writers = 48
	errs := make([]error, writers)
	var wg sync.WaitGroup
	for i := range writers {
		wg.Go(func() {
			ev := productEvent("task_s", evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_REQUEST_RECEIVED, fmt.Sprint(i))
			if i%7 == 3 {
				ev.TaskId = "" // invalid
			}
			errs[i] = send.Send(t.Context(), []*evidencev1.TraceEvent{ev})
		})
	}
	wg.Wait()
	trace, err := e.client.GetTrace(t.Context(), &evidencev1.GetTraceRequest{TaskId: "task_s"})
	if err != nil {
		t.Fatal(err)
	}
	stored := map[string]int{}
	for _, ev := range trace.GetEvents() {
		stored[ev.GetProduct().GetDetail()]++
	}
	for i, err := range errs {
		name := fmt.Sprint(i)
		switch {
		case i%7 == 3:
			if status.Code(err) != codes.InvalidArgument {
				t.Errorf("writer %d sent an invalid event and got %v, want INVALID_ARGUMENT", i, err)
			}
		case err != nil:
			t.Errorf("writer %d sent a valid event and got %v: another writer's invalid event is not its", i, err)
		case stored[name] != 1:
			t.Errorf("writer %d's event stored %d times, want once", i, stored[name])
		}
	}
}
