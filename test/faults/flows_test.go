package faults_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/v0m3/v0m3/demo/fixture"
	"github.com/v0m3/v0m3/demo/fixture/renderer"
	"github.com/v0m3/v0m3/demo/scenario"
	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// approver decides requests that need a person (not alice, whose task it
// is).
var approver = scenario.Person{ID: "approver@platform", Groups: []string{"approvers"}}

const (
	renderPreview  = "render_preview"
	documentDigest = "sha256:document-31"
	callID         = "call-1"
)

// Product trace event kinds of a request's stages.
const (
	received    = evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_REQUEST_RECEIVED
	decided     = evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_POLICY_DECISION
	approval    = evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_APPROVAL
	executed    = evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_EXECUTED
	observed    = evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_OBSERVATION_RECORDED
	consequence = evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_CONSEQUENCE
)

// flow is one product flow through the services, with the fixture that
// counts what it did.
type flow struct {
	name string
	// setup connects the fixture, maps the capability, starts the task.
	setup func(t *testing.T, c *cluster) *run
}

// run is one flow set up on a cluster.
type run struct {
	taskID     string
	capability string
	args       *structpb.Struct
	digest     string
	approval   bool
	// effects counts what the fixture did: renders and artifacts of the
	// renderer, tool calls of the sources server.
	effects func(t *testing.T) (calls, artifacts int)
	// kinds are the product trace events of the request's stages, in
	// order.
	kinds []evidencev1.ProductEventKind
	// events are the task events the request's stages write before its
	// end, in order.
	events []string
}

// previewFlow renders a document preview through the real renderer (a
// stdio child of the adapter process, idempotent by request id, with a
// status tool): submit, approval by a person, execute, receipt, commit.
var previewFlow = flow{name: "preview", setup: func(t *testing.T, c *cluster) *run {
	t.Helper()
	dir := testkit.WritableDir(t)
	workDir, callLog := filepath.Join(dir, "work"), filepath.Join(dir, "calls.jsonl")
	conn, err := c.clients.Registry.CreateConnection(testkit.As(c, scenario.Integrator), &registryv1.CreateConnectionRequest{
		DisplayName: "V0M3 Renderer", Owner: "platform-team",
		Transport: &registryv1.Transport{Kind: &registryv1.Transport_Stdio{Stdio: &registryv1.StdioTransport{
			Command: v0m3Bin, Args: []string{"fixture-renderer", "--transport", "stdio", "--work-dir", workDir, "--call-log", callLog},
		}}},
		CredentialScope: "local renderer; no credential",
	})
	if err != nil {
		t.Fatalf("create connection: %v", err)
	}
	if conn, err = c.clients.Registry.ReviewConnection(testkit.As(c, scenario.Reviewer), &registryv1.ReviewConnectionRequest{
		ConnectionId: conn.GetId(), ConfigRevision: conn.GetConfigRevision(), Approve: true}); err != nil {
		t.Fatalf("review connection: %v", err)
	}
	mapTool(t, c, conn, &registryv1.ProposeMappingRequest{
		Capability: renderPreview, ConnectionId: conn.GetId(),
		Target: &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: renderer.ToolRender},
		ArgumentMap: []*registryv1.ArgumentBinding{
			{RemoteField: "document_revision", ProductField: "document_revision"},
			{RemoteField: "profile", ProductField: "profile"},
		},
		Limits:              &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 4, AllowedMediaTypes: []string{"text/plain"}},
		IdempotencyKeyField: "request_id",
		StatusTool:          renderer.ToolStatus,
	})
	task, err := startTask(c, &orchestratorv1.StartTaskRequest{
		Profile: "preview", Purpose: "preview revision 31 before review",
	})
	if err != nil {
		t.Fatalf("start task: %v", err)
	}
	return &run{
		taskID: task.GetTask().GetId(), capability: renderPreview, digest: documentDigest, approval: true,
		args: scenario.MustStruct(map[string]any{"document_revision": 31, "profile": 4}),
		effects: func(t *testing.T) (int, int) {
			a, err := renderer.Artifacts(workDir)
			if err != nil {
				t.Fatal(err)
			}
			return countLines(t, callLog, func(m map[string]any) bool { return m["Event"] == "rendered" || m["event"] == "rendered" }), len(a)
		},
		kinds:  []evidencev1.ProductEventKind{received, decided, approval, decided, approval, executed, consequence},
		events: []string{"request.received", "request.awaiting_approval", "request.approved"},
	}
}}

// retrieveFlow reads a source through the fixture MCP server over
// streamable HTTP: submit, execute, observe, commit.
var retrieveFlow = flow{name: "retrieve", setup: func(t *testing.T, c *cluster) *run {
	t.Helper()
	callLog := filepath.Join(t.TempDir(), "calls.jsonl")
	srv, err := fixture.NewServer(fixture.Options{CallLog: callLog})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	hs := httptest.NewServer(mux)
	t.Cleanup(func() {
		// The adapter may hold a session's event stream open.
		hs.CloseClientConnections()
		hs.Close()
	})
	conn, err := c.clients.Registry.CreateConnection(testkit.As(c, scenario.Integrator), &registryv1.CreateConnectionRequest{
		DisplayName: "V0M3 Sources", Owner: "platform-team", Transport: scenario.HTTPFixture(hs.URL + "/mcp"),
	})
	if err != nil {
		t.Fatalf("create connection: %v", err)
	}
	if conn, err = c.clients.Registry.ReviewConnection(testkit.As(c, scenario.Reviewer), &registryv1.ReviewConnectionRequest{
		ConnectionId: conn.GetId(), ConfigRevision: conn.GetConfigRevision(), Approve: true}); err != nil {
		t.Fatalf("review connection: %v", err)
	}
	mapTool(t, c, conn, &registryv1.ProposeMappingRequest{
		Capability: scenario.Retrieve, ConnectionId: conn.GetId(),
		Target: &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: "search"},
		ArgumentMap: []*registryv1.ArgumentBinding{
			{RemoteField: "query", ProductField: "query"},
			{RemoteField: "uri", ProductField: "source", FromHandle: true},
		},
		Limits: &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 5, AllowedMediaTypes: []string{"text/markdown", "text/plain"}},
	})
	task, err := startTask(c, &orchestratorv1.StartTaskRequest{
		Profile:     "source_review",
		Purpose:     "review the sources of the API migration article",
		SourceScope: []*orchestratorv1.SourceRef{{Uri: scenario.MigrationFAQURI, Title: "Migration FAQ"}},
	})
	if err != nil {
		t.Fatalf("start task: %v", err)
	}
	handle := scenario.FindHandle(scenario.FindOffered(task.GetCatalogue(), scenario.Retrieve), "Migration FAQ")
	if handle == "" {
		t.Fatalf("no handle offered: %v", task.GetCatalogue())
	}
	return &run{
		taskID: task.GetTask().GetId(), capability: scenario.Retrieve,
		args: scenario.MustStruct(map[string]any{"source": handle, "query": "migration"}),
		effects: func(t *testing.T) (int, int) {
			return countLines(t, callLog, func(m map[string]any) bool { return m["method"] == "tools/call" }), 0
		},
		kinds:  []evidencev1.ProductEventKind{received, decided, executed, observed, consequence},
		events: []string{"request.received"},
	}
}}

// startTask starts a task as alice. The services started together, so a
// peer connection of the orchestrator may still be in its reconnection
// backoff from a dial made before that peer listened: an UNAVAILABLE is
// tried again.
func startTask(c *cluster, in *orchestratorv1.StartTaskRequest) (*orchestratorv1.StartTaskResponse, error) {
	var out *orchestratorv1.StartTaskResponse
	err := retry(time.Now().Add(time.Minute), func(ctx context.Context) error {
		var err error
		out, err = c.clients.Orchestrator.StartTask(c.As(ctx, scenario.Alice.ID, scenario.Alice.Groups...), in)
		return err
	})
	return out, err
}

// mapTool discovers conn and has the integrator propose, and the reviewer
// review, the mapping m (its snapshot filled in).
func mapTool(t *testing.T, c *cluster, conn *registryv1.Connection, m *registryv1.ProposeMappingRequest) {
	t.Helper()
	snap, err := c.clients.Adapter.Discover(testkit.As(c, scenario.Integrator), &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()})
	if err != nil {
		t.Fatalf("discover: %v", err)
	}
	m.SnapshotId = snap.GetId()
	proposed, err := c.clients.Registry.ProposeMapping(testkit.As(c, scenario.Integrator), m)
	if err != nil {
		t.Fatalf("propose mapping: %v", err)
	}
	if _, err := c.clients.Registry.ReviewMapping(testkit.As(c, scenario.Reviewer), &registryv1.ReviewMappingRequest{
		MappingId: proposed.GetId(), Revision: proposed.GetRevision(), Approve: true,
	}); err != nil {
		t.Fatalf("review mapping: %v", err)
	}
}

// countLines counts the JSON lines of path that match.
func countLines(t *testing.T, path string, match func(map[string]any) bool) int {
	t.Helper()
	lines, err := fixture.ReadJSONLines[map[string]any](path)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range lines {
		if match(m) {
			n++
		}
	}
	return n
}

// retry calls call until it succeeds, fails with an error a retry cannot
// cure, or the deadline passes: what a client does while a service is
// down or restarting.
func retry(deadline time.Time, call func(ctx context.Context) error) error {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := call(ctx)
		cancel()
		switch apierror.Code(err) {
		case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted:
			if time.Now().Before(deadline) {
				time.Sleep(200 * time.Millisecond)
				continue
			}
		}
		return err
	}
}

// settled reports whether r needs nothing more: a terminal state whose
// outcome is known.
func settled(r *orchestratorv1.ToolRequest) bool {
	switch r.GetState() {
	case orchestratorv1.RequestState_REQUEST_STATE_EXECUTED, orchestratorv1.RequestState_REQUEST_STATE_REFUSED,
		orchestratorv1.RequestState_REQUEST_STATE_DENIED:
		return true
	case orchestratorv1.RequestState_REQUEST_STATE_FAILED:
		return r.GetOutcome() != adapterv1.Outcome_OUTCOME_UNKNOWN
	}
	return false
}

// productKinds are the kinds of the product trace events of request id,
// in order.
func productKinds(tr *evidencev1.Trace, id string) []evidencev1.ProductEventKind {
	var out []evidencev1.ProductEventKind
	for _, e := range tr.GetEvents() {
		if p := e.GetProduct(); p != nil && p.GetRequestId() == id {
			out = append(out, p.GetKind())
		}
	}
	return out
}

// isSubsequence reports whether want occurs in got in order (other
// elements, e.g. recovery's, may come between).
func isSubsequence[T comparable](want, got []T) bool {
	i := 0
	for _, g := range got {
		if i < len(want) && g == want[i] {
			i++
		}
	}
	return i == len(want)
}
