package e2e_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/v0m3/v0m3/demo/scenario"
	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/serve"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/suite"
)

// plantedSecret has the shape of a GitHub token: it goes into a tool
// argument and a credential version, and must come out nowhere.
const plantedSecret = "ghp_PLANTEDsecretVALUE0123456789abcdefAB"

// policyAdmin reloads the policy.
var policyAdmin = scenario.Person{ID: "policy-admin@platform", Groups: []string{"policy-admins"}}

// TestObservability runs the first experiment end to end, then the
// remaining privileged actions, and checks what operators see: the
// metrics endpoint's counts, one distributed trace per governed call
// (reaching the MCP server and linked from the evidence trace), an audit
// record per privileged action readable by auditors only, and a planted
// secret in none of them.
//
// Not parallel: the metrics registry is the process's, so the counts
// asserted are exact deltas only while no other test runs.
func TestObservability(t *testing.T) {
	ctx := context.Background()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	s, err := suite.Start(ctx, suite.Config{DataDir: t.TempDir(), TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	mctx, stop := context.WithCancel(ctx)
	t.Cleanup(stop)
	addr, err := serve.Metrics(mctx, "127.0.0.1:0", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	metricsURL := "http://" + addr.String() + "/metrics"
	before := scrape(t, metricsURL)

	logPath := filepath.Join(testkit.WritableDir(t), "calls.jsonl")
	r, err := scenario.Run(ctx, s.Clients, scenario.Config{Transport: scenario.StdioFixture(v0m3Bin, "--call-log", logPath), As: s.As})
	if err != nil {
		t.Fatalf("scenario: %v", err)
	}
	task := r.SourceTask.GetTask().GetId()
	faq := scenario.FindHandle(scenario.FindOffered(r.SourceTask.GetCatalogue(), scenario.Retrieve), "Migration FAQ")
	planted, err := s.Orchestrator.SubmitToolRequest(testkit.As(s, scenario.Alice), &orchestratorv1.SubmitToolRequestRequest{
		TaskId: task, ProviderCallId: "call-planted", Capability: scenario.Retrieve,
		Arguments: scenario.MustStruct(map[string]any{"source": faq, "query": plantedSecret}),
	})
	if err != nil {
		t.Fatalf("retrieval with a planted secret: %v", err)
	}
	mid := scrape(t, metricsURL)

	// The privileged actions the scenario does not take.
	_, denyErr := s.Orchestrator.Deny(testkit.As(s, approver), &orchestratorv1.DenyRequest{RequestId: r.Retrieval.GetId(), Reason: "token " + plantedSecret})
	if denyErr == nil {
		t.Fatal("denying an executed request succeeded")
	}
	if _, err := s.Policy.ReloadPolicy(testkit.As(s, policyAdmin), &policyv1.ReloadPolicyRequest{}); err != nil {
		t.Fatalf("reload policy: %v", err)
	}
	conn := r.Connection
	if c, err := s.Registry.UpdateConnection(testkit.As(s, scenario.Integrator), &registryv1.UpdateConnectionRequest{
		Id: conn.GetId(), ExpectedConfigRevision: conn.GetConfigRevision(), CredentialRef: "sources-token", CredentialVersion: plantedSecret,
	}); err == nil {
		conn = c
	}
	if _, err := s.Orchestrator.CancelTask(testkit.As(s, scenario.Alice), &orchestratorv1.CancelTaskRequest{Id: task}); err != nil {
		t.Fatalf("cancel task: %v", err)
	}
	if _, err := s.Registry.RetireConnection(testkit.As(s, scenario.Integrator), &registryv1.RetireConnectionRequest{Id: conn.GetId(), Reason: "done"}); err != nil {
		t.Fatalf("retire connection: %v", err)
	}
	after := scrape(t, metricsURL)

	t.Run("metrics", func(t *testing.T) {
		okCalls := 0
		for _, req := range []*orchestratorv1.ToolRequest{r.Retrieval, planted} {
			if req.GetOutcome() == adapterv1.Outcome_OUTCOME_OK {
				okCalls++
			}
		}
		if okCalls == 0 {
			t.Fatalf("no governed call succeeded: %v / %v", r.Retrieval.GetOutcome(), planted.GetOutcome())
		}
		exact := []struct {
			name   string
			labels map[string]string
			want   float64
		}{
			{"v0m3_governed_calls_total", map[string]string{"capability": scenario.Retrieve, "outcome": "ok", "reason": ""}, float64(okCalls)},
			{"v0m3_audit_records_total", map[string]string{"action": "connection.create", "outcome": "ok"}, 1},
			{"v0m3_audit_records_total", map[string]string{"action": "mapping.review", "outcome": apierror.Reason(r.SelfReview)}, 1},
			{"v0m3_audit_records_total", map[string]string{"action": "policy.reload", "outcome": "ok"}, 1},
			{"v0m3_registry_events_total", map[string]string{"kind": "connection_created"}, 1},
			{"v0m3_registry_events_total", map[string]string{"kind": "connection_retired"}, 1},
		}
		for _, c := range exact {
			if got := value(after, c.name, c.labels) - value(before, c.name, c.labels); got != c.want {
				t.Errorf("%s%v rose by %v, want %v", c.name, c.labels, got, c.want)
			}
		}
		atLeast := []struct {
			name   string
			labels map[string]string
			min    float64
		}{
			{"v0m3_grpc_server_handled_total", map[string]string{"service": "orchestrator", "method": "SubmitToolRequest", "code": "OK", "reason": ""}, 2},
			{"v0m3_governed_calls_total", map[string]string{"capability": "unresolved", "outcome": "refused", "reason": apierror.Reason(r.UnknownField)}, 1},
			{"v0m3_grpc_server_handled_total", map[string]string{"service": "orchestrator", "method": "SubmitToolRequest", "code": "InvalidArgument", "reason": apierror.Reason(r.UnknownField)}, 1},
			{"v0m3_stage_duration_seconds", map[string]string{"service": "orchestrator", "stage": "adapter"}, float64(okCalls)},
			{"v0m3_stage_duration_seconds", map[string]string{"service": "orchestrator", "stage": "policy"}, 2},
			{"v0m3_stage_duration_seconds", map[string]string{"service": "orchestrator", "stage": "evidence"}, 2},
			{"v0m3_stage_duration_seconds", map[string]string{"service": "adapter", "stage": "remote_call"}, float64(okCalls)},
			{"v0m3_mcp_response_bytes_total", nil, 1},
			{"v0m3_budget_charges_total", map[string]string{"result": "charged"}, float64(okCalls)},
			{"v0m3_budget_consumed_total", map[string]string{"unit": "calls"}, float64(okCalls)},
		}
		for _, c := range atLeast {
			if got := value(after, c.name, c.labels) - value(before, c.name, c.labels); got < c.min {
				t.Errorf("%s%v rose by %v, want at least %v", c.name, c.labels, got, c.min)
			}
		}
		// The stdio server stays pooled after the calls: one open session,
		// one server process; nothing waits for approval.
		if got := value(mid, "v0m3_mcp_sessions_open", map[string]string{"transport": "stdio"}) - value(before, "v0m3_mcp_sessions_open", map[string]string{"transport": "stdio"}); got != 1 {
			t.Errorf("open stdio sessions rose by %v after the calls, want 1", got)
		}
		if _, ok := after["v0m3_approvals_waiting"]; !ok {
			t.Error("v0m3_approvals_waiting is not exported")
		}
		text := scrapeText(t, metricsURL)
		for _, leak := range []string{plantedSecret, task, r.Retrieval.GetId(), conn.GetId()} {
			if strings.Contains(text, leak) {
				t.Errorf("the metrics text contains %q: no secret or id may be a label", leak)
			}
		}
	})

	t.Run("traces", func(t *testing.T) {
		ended := spans.Ended()
		var call sdktrace.ReadOnlySpan
		for _, sp := range ended {
			if sp.SpanKind() == trace.SpanKindServer && sp.Name() == "v0m3.orchestrator.v1.OrchestratorService/SubmitToolRequest" &&
				attr(sp, "v0m3.request_id") == r.Retrieval.GetId() {
				call = sp
			}
		}
		if call == nil {
			t.Fatalf("no orchestrator server span for request %s among %d spans", r.Retrieval.GetId(), len(ended))
		}
		want := map[string]string{
			"v0m3.task_id": task, "v0m3.intent_id": r.Retrieval.GetIntentId(), "v0m3.capability": scenario.Retrieve,
			"v0m3.mapping_revision": fmt.Sprint(r.Retrieval.GetMappingRevision()), "v0m3.outcome": "ok",
			"v0m3.attempt_id": r.Retrieval.GetAttempts()[len(r.Retrieval.GetAttempts())-1].GetId(),
		}
		for k, v := range want {
			if got := attr(call, k); got != v {
				t.Errorf("span attribute %s = %q, want %q", k, got, v)
			}
		}
		id := call.SpanContext().TraceID()
		servers := map[string]bool{}
		for _, sp := range ended {
			if sp.SpanContext().TraceID() == id && sp.SpanKind() == trace.SpanKindServer {
				svc, _, _ := strings.Cut(sp.Name(), "/")
				servers[svc] = true
			}
		}
		for _, svc := range []string{"v0m3.orchestrator.v1.OrchestratorService", "v0m3.policy.v1.PolicyService",
			"v0m3.adapter.v1.AdapterService", "v0m3.evidence.v1.EvidenceService", "v0m3.registry.v1.RegistryService"} {
			if !servers[svc] {
				t.Errorf("the governed call's trace has no %s server span (has %v)", svc, servers)
			}
		}
		// The trace reached the MCP server in the request's _meta.
		reached := false
		for _, e := range callLog(t, logPath) {
			if e["method"] == "tools/call" && strings.Contains(e["traceparent"], id.String()) {
				reached = true
			}
		}
		if !reached {
			t.Errorf("no tools/call at the server carried traceparent with trace %s", id)
		}
		// The evidence trace links to it.
		tr, err := s.Evidence.GetTrace(testkit.As(s, scenario.Auditor), &evidencev1.GetTraceRequest{TaskId: task})
		if err != nil {
			t.Fatal(err)
		}
		linked := 0
		for _, ev := range tr.GetEvents() {
			if ev.GetProduct().GetRequestId() == r.Retrieval.GetId() {
				if ev.GetOtelTraceId() != id.String() {
					t.Errorf("evidence event %s (%v) has trace id %q, want %s", ev.GetId(), ev.GetProduct().GetKind(), ev.GetOtelTraceId(), id)
				}
				linked++
			}
		}
		if linked == 0 {
			t.Error("no evidence event of the request")
		}
		for _, sp := range ended {
			if where := spanMentions(sp, plantedSecret); where != "" {
				t.Errorf("span %s carries the planted secret in %s", sp.Name(), where)
			}
		}
	})

	t.Run("audit", func(t *testing.T) {
		auditor := testkit.As(s, scenario.Auditor)
		all, err := s.Evidence.ListAuditRecords(auditor, &evidencev1.ListAuditRecordsRequest{PageSize: 1000})
		if err != nil {
			t.Fatal(err)
		}
		if all.GetNextPageToken() != "" {
			t.Fatalf("a 1000-record page has a next page with %d records", len(all.GetRecords()))
		}
		// Paging two at a time reads the same records in the same order.
		var paged []*evidencev1.AuditRecord
		req := &evidencev1.ListAuditRecordsRequest{PageSize: 2}
		for range 100 {
			page, err := s.Evidence.ListAuditRecords(auditor, req)
			if err != nil {
				t.Fatal(err)
			}
			paged = append(paged, page.GetRecords()...)
			if req.PageToken = page.GetNextPageToken(); req.PageToken == "" {
				break
			}
		}
		if len(paged) != len(all.GetRecords()) {
			t.Fatalf("paging read %d records, one page %d", len(paged), len(all.GetRecords()))
		}
		for i := range paged {
			if paged[i].GetId() != all.GetRecords()[i].GetId() {
				t.Fatalf("record %d differs between paging and one page", i)
			}
		}
		type key struct{ action, principal string }
		got := map[key][]*evidencev1.AuditRecord{}
		for _, rec := range all.GetRecords() {
			got[key{rec.GetAction(), rec.GetPrincipal()}] = append(got[key{rec.GetAction(), rec.GetPrincipal()}], rec)
			b, _ := protojson.Marshal(rec)
			if strings.Contains(string(b), plantedSecret) {
				t.Errorf("audit record %s carries the planted secret: %s", rec.GetId(), b)
			}
			if rec.GetTime() == nil || rec.GetSequence() == 0 || rec.GetRecordedBy() == "" {
				t.Errorf("audit record without time, order or recorder: %v", rec)
			}
		}
		cases := []struct {
			action, principal, resource, outcome, revision string
		}{
			{"connection.create", scenario.Integrator.ID, "connection:" + r.Connection.GetId(), "ok", "config_revision=1"},
			{"connection.review", scenario.Reviewer.ID, "connection:" + r.Connection.GetId(), "ok", fmt.Sprintf("config_revision=%d", r.Connection.GetConfigRevision())},
			{"mapping.propose", scenario.Integrator.ID, "mapping:" + r.Mapping.GetId(), "ok", ""},
			{"mapping.review", scenario.Integrator.ID, "mapping:" + r.Mapping.GetId(), apierror.Reason(r.SelfReview), ""},
			{"mapping.review", scenario.Reviewer.ID, "mapping:" + r.Mapping.GetId(), "ok", ""},
			{"request.deny", approver.ID, "request:" + r.Retrieval.GetId(), apierror.Reason(denyErr), ""},
			{"policy.reload", policyAdmin.ID, "policy:default", "ok", ""},
			{"credential.rotate", scenario.Integrator.ID, "connection:" + r.Connection.GetId(), "", ""},
			{"task.cancel", scenario.Alice.ID, "task:" + task, "ok", ""},
			{"connection.retire", scenario.Integrator.ID, "connection:" + r.Connection.GetId(), "ok", ""},
		}
		for _, c := range cases {
			recs := got[key{c.action, c.principal}]
			found := false
			for _, rec := range recs {
				if rec.GetResource() == c.resource && (c.outcome == "" || rec.GetOutcome() == c.outcome) &&
					(c.revision == "" || rec.GetRevision() == c.revision) {
					found = true
				}
			}
			if !found {
				t.Errorf("no audit record %s by %s on %s with outcome %q revision %q; have %v", c.action, c.principal, c.resource, c.outcome, c.revision, recs)
			}
		}
		// Filters and the token's binding to them.
		denies, err := s.Evidence.ListAuditRecords(auditor, &evidencev1.ListAuditRecordsRequest{Action: "request.deny"})
		if err != nil || len(denies.GetRecords()) != 1 {
			t.Fatalf("filtered by action: %d records, err %v", len(denies.GetRecords()), err)
		}
		first, err := s.Evidence.ListAuditRecords(auditor, &evidencev1.ListAuditRecordsRequest{PageSize: 1})
		if err != nil {
			t.Fatal(err)
		}
		_, err = s.Evidence.ListAuditRecords(auditor, &evidencev1.ListAuditRecordsRequest{PageSize: 1, PageToken: first.GetNextPageToken(), Action: "task.cancel"})
		if !apierror.Is(err, codes.InvalidArgument, "PAGE_TOKEN_INVALID") {
			t.Errorf("a token used with other filters: %v, want INVALID_ARGUMENT PAGE_TOKEN_INVALID", err)
		}
	})

	t.Run("audit read refused to others", func(t *testing.T) {
		for _, c := range []struct {
			name string
			ctx  context.Context
			code codes.Code
		}{
			{"author", testkit.As(s, scenario.Alice), codes.PermissionDenied},
			{"approver", testkit.As(s, approver), codes.PermissionDenied},
			{"platform", testkit.As(s, scenario.Integrator), codes.PermissionDenied},
			{"anonymous", context.Background(), codes.Unauthenticated},
		} {
			resp, err := s.Evidence.ListAuditRecords(c.ctx, &evidencev1.ListAuditRecordsRequest{})
			if status.Code(err) != c.code || len(resp.GetRecords()) != 0 {
				t.Errorf("%s reading the audit log: %d records, %v; want %v and none", c.name, len(resp.GetRecords()), err, c.code)
			}
			if c.code == codes.PermissionDenied && apierror.Reason(err) == "" {
				t.Errorf("%s's refusal has no ErrorInfo reason: %v", c.name, err)
			}
		}
		// Nobody outside the services appends records: a person may not.
		_, err := s.Evidence.AppendAuditRecord(testkit.As(s, scenario.Auditor), &evidencev1.AppendAuditRecordRequest{Record: &evidencev1.AuditRecord{
			Principal: "someone", Action: "connection.create", Resource: "connection:forged", Outcome: "ok",
		}})
		if status.Code(err) != codes.PermissionDenied && status.Code(err) != codes.Unauthenticated {
			t.Errorf("a person appending an audit record: %v, want refused", err)
		}
		forged, err := s.Evidence.ListAuditRecords(testkit.As(s, scenario.Auditor), &evidencev1.ListAuditRecordsRequest{Resource: "connection:forged"})
		if err != nil || len(forged.GetRecords()) != 0 {
			t.Errorf("the refused append left %d records (err %v)", len(forged.GetRecords()), err)
		}
	})
}

// scrape reads the metrics endpoint into metric families.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(scrapeText(t, url)))
	if err != nil {
		t.Fatalf("parse metrics: %v", err)
	}
	return fams
}

func scrapeText(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape %s: %d %v", url, resp.StatusCode, err)
	}
	return string(b)
}

// value is a counter's or gauge's value, or a histogram's count, for the
// series whose labels include labels (0 when absent).
func value(fams map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	f := fams[name]
	total := 0.0
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range labels {
			if have[k] != v {
				match = false
			}
		}
		if !match {
			continue
		}
		switch {
		case m.GetCounter() != nil:
			total += m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			total += m.GetGauge().GetValue()
		case m.GetHistogram() != nil:
			total += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return total
}

// attr is a span attribute's value as text.
func attr(sp sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range sp.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.String()
		}
	}
	return ""
}

// spanMentions says where in sp the text appears, or "".
func spanMentions(sp sdktrace.ReadOnlySpan, text string) string {
	if strings.Contains(sp.Name(), text) {
		return "its name"
	}
	if strings.Contains(sp.Status().Description, text) {
		return "its status"
	}
	for _, kv := range sp.Attributes() {
		if strings.Contains(kv.Value.String(), text) {
			return "attribute " + string(kv.Key)
		}
	}
	for _, ev := range sp.Events() {
		for _, kv := range ev.Attributes {
			if strings.Contains(kv.Value.String(), text) {
				return "event " + ev.Name
			}
		}
	}
	return ""
}

// TestDevServesMetrics: `v0m3 dev --metrics-addr` serves Prometheus
// metrics on their own port and prints where; the gRPC ports do not.
func TestDevServesMetrics(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, v0m3Bin, "dev", "--port-base", "0", "--data-dir", t.TempDir(), "--metrics-addr", "127.0.0.1:0")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	re := regexp.MustCompile(`^\s+(\w+)\s+(\S+)$`)
	addrs := map[string]string{}
	sc := bufio.NewScanner(stdout)
	for sc.Scan() && !strings.HasPrefix(sc.Text(), "serving until") {
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			addrs[m[1]] = m[2]
		}
	}
	url := addrs["metrics"]
	if !strings.HasPrefix(url, "http://127.0.0.1:") || !strings.HasSuffix(url, "/metrics") {
		t.Fatalf("v0m3 dev printed metrics at %q (addresses %v)", url, addrs)
	}
	fams := scrape(t, url)
	for _, name := range []string{"v0m3_approvals_waiting", "go_goroutines", "process_cpu_seconds_total"} {
		if _, ok := fams[name]; !ok {
			t.Errorf("%s missing from %s", name, url)
		}
	}
	for _, name := range suite.Names {
		if strings.Contains(url, addrs[name]) {
			t.Errorf("metrics share the %s gRPC address %s", name, addrs[name])
		}
		resp, err := http.Get("http://" + addrs[name] + "/metrics")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Errorf("the %s gRPC port answered /metrics", name)
			}
		}
	}
}
