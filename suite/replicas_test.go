package suite_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/v0m3/v0m3/demo/fixture"
	"github.com/v0m3/v0m3/demo/scenario"
	"github.com/v0m3/v0m3/internal/redistest"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/suite"
)

// startFixture serves the fixture MCP server over streamable HTTP in this
// process and returns its URL; every request is logged to callLog.
func startFixture(t *testing.T, callLog string) string {
	t.Helper()
	s, err := fixture.NewServer(fixture.Options{CallLog: callLog})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL + "/mcp"
}

func toolCallCount(t *testing.T, path string) int {
	t.Helper()
	calls, err := fixture.ReadJSONLines[fixture.CallLogEntry](path)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range calls {
		if c.Method == "tools/call" {
			n++
		}
	}
	return n
}

// TestReplicasShareOneRedis runs two complete suites (two replicas of
// every service, each with its own listeners and Redis connections, as two
// processes would be) against one Redis. A connection set up through
// replica A is usable through replica B, and one provider call submitted to
// both orchestrators at the same moment creates one request and reaches
// the remote server once.
func TestReplicasShareOneRedis(t *testing.T) {
	t.Parallel()
	// The fixture starts first so it stops last: its HTTP server waits for
	// the adapters' open MCP streams, which end when the suites close.
	log := filepath.Join(t.TempDir(), "calls.jsonl")
	url := startFixture(t, log)
	addr, _ := redistest.Start(t)
	store := redisURL(addr, "replicas")
	var replicas [2]*suite.Suite
	for i := range replicas {
		s, err := suite.Start(context.Background(), suite.Config{DataDir: t.TempDir(), Store: store})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		replicas[i] = s
	}
	a, b := replicas[0], replicas[1]
	// Each replica here has its own development CA and token issuer; each
	// call carries a token of the replica it goes to, from the person who
	// would make it.

	conn, err := a.Connect(testkit.As(a, scenario.Integrator), &registryv1.CreateConnectionRequest{
		DisplayName: "V0M3 Sources", Owner: "platform-team", Transport: scenario.HTTPFixture(url),
	})
	if err != nil {
		t.Fatal(err)
	}
	// Discovered through B, mapped and reviewed through A.
	snap, err := b.Adapter.Discover(testkit.As(b, scenario.Integrator), &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	m, err := a.Registry.ProposeMapping(testkit.As(a, scenario.Integrator), &registryv1.ProposeMappingRequest{
		Capability: scenario.Retrieve, ConnectionId: conn.GetId(), SnapshotId: snap.GetId(),
		Target: &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: "search"},
		ArgumentMap: []*registryv1.ArgumentBinding{
			{RemoteField: "query", ProductField: "query"},
			{RemoteField: "uri", ProductField: "source", FromHandle: true},
		},
		Limits: &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 5, AllowedMediaTypes: []string{"text/markdown", "text/plain"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Registry.ReviewMapping(testkit.As(b, scenario.Reviewer), &registryv1.ReviewMappingRequest{
		MappingId: m.GetId(), Revision: m.GetRevision(), Approve: true,
	}); err != nil {
		t.Fatal(err)
	}
	task, err := a.Orchestrator.StartTask(testkit.As(a, scenario.Alice), &orchestratorv1.StartTaskRequest{
		Profile:     "source_review",
		Purpose:     "review the sources of the API migration article",
		SourceScope: []*orchestratorv1.SourceRef{{Uri: scenario.MigrationFAQURI, Title: "Migration FAQ"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	handle := scenario.FindHandle(scenario.FindOffered(task.GetCatalogue(), scenario.Retrieve), "Migration FAQ")
	if handle == "" {
		t.Fatalf("no handle offered: %v", task.GetCatalogue())
	}
	before := toolCallCount(t, log)

	var wg sync.WaitGroup
	results := make([]*orchestratorv1.ToolRequest, 2)
	errs := make([]error, 2)
	for i, s := range replicas {
		wg.Go(func() {
			results[i], errs[i] = s.Orchestrator.SubmitToolRequest(testkit.As(s, scenario.Alice), &orchestratorv1.SubmitToolRequestRequest{
				TaskId: task.GetTask().GetId(), ProviderCallId: "call-1", Capability: scenario.Retrieve,
				Arguments: scenario.MustStruct(map[string]any{"source": handle, "query": "migration"}),
			})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("replica %d: %v", i, err)
		}
	}
	if results[0].GetId() != results[1].GetId() || results[0].GetIntentId() != results[1].GetIntentId() {
		t.Errorf("replicas created requests %s/%s and %s/%s; want one request and intent",
			results[0].GetId(), results[0].GetIntentId(), results[1].GetId(), results[1].GetIntentId())
	}
	for i, s := range replicas {
		list, err := s.Orchestrator.ListRequests(testkit.As(s, scenario.Alice), &orchestratorv1.ListRequestsRequest{TaskId: task.GetTask().GetId()})
		if err != nil || len(list.GetRequests()) != 1 {
			t.Errorf("replica %d lists %d requests, %v; want 1", i, len(list.GetRequests()), err)
		}
	}
	if n := toolCallCount(t, log) - before; n != 1 {
		t.Errorf("the remote server received %d tool calls for one provider call, want 1", n)
	}
}
