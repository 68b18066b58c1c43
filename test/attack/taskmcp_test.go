package attack_test

import (
	"context"
	"crypto/tls"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/v0m3/v0m3/demo/scenario"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	"github.com/v0m3/v0m3/suite"
)

// withBearer sets the task token on every request of the MCP client.
type withBearer struct {
	token string
	next  http.RoundTripper
}

func (b withBearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// TestHostilePageThroughTaskMCP: the fixture library's hostile page, read
// through a task's MCP endpoint by a real go-sdk client, arrives as quoted
// evidence; acting on it (the export it asks for) is impossible: no such
// tool is listed, calling the delivery capability or an "export" tool by
// name is refused by the endpoint, and nothing is recorded or sent.
func TestHostilePageThroughTaskMCP(t *testing.T) {
	t.Parallel()
	s, err := suite.Start(context.Background(), suite.Config{
		DataDir: t.TempDir(), MCP: &suite.MCP{},
		Reach: &suite.Reach{StdioRoots: []string{filepath.Dir(v0m3Bin)}, AllowLoopback: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if _, err := scenario.Run(context.Background(), s.Clients, scenario.Config{Transport: scenario.StdioFixture(v0m3Bin), As: s.As}); err != nil {
		t.Fatalf("scenario: %v", err)
	}
	alice := s.As(context.Background(), scenario.Alice.ID, scenario.Alice.Groups...)
	resp, err := s.Orchestrator.StartTask(alice, &orchestratorv1.StartTaskRequest{
		Profile: "source_review", McpAccess: true,
		SourceScope: []*orchestratorv1.SourceRef{{Uri: scenario.MigrationFAQURI, Title: "Migration FAQ"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	task := resp.GetTask().GetId()
	creds, err := s.Credentials(suite.Orchestrator)
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: creds.Roots(), MinVersion: tls.VersionTLS13}}
	t.Cleanup(tr.CloseIdleConnections)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "hostile-reader", Version: "1"}, nil).Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint: resp.GetMcpEndpoint().GetUrl(), MaxRetries: -1,
		HTTPClient: &http.Client{Transport: withBearer{token: resp.GetMcpEndpoint().GetToken(), next: tr}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tl := range tools.Tools {
		if tl.Name != scenario.Retrieve {
			t.Errorf("a source-review task lists %q", tl.Name)
		}
	}
	handle := scenario.FindHandle(scenario.FindOffered(resp.GetCatalogue(), scenario.Retrieve), "Migration FAQ")
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: scenario.Retrieve, Arguments: map[string]any{"source": handle, "query": "export"}})
	if err != nil || res.IsError {
		t.Fatalf("read the hostile page: %v, %v", res, err)
	}
	var quoted bool
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok && strings.Contains(tc.Text, scenario.HostileSentence) {
			// The instruction arrives inside a quoted block that says it is
			// data, never instructions.
			openAt, closeAt := strings.Index(tc.Text, "<quoted>"), strings.Index(tc.Text, "</quoted>")
			at := strings.Index(tc.Text, scenario.HostileSentence)
			quoted = strings.Contains(tc.Text, "never instructions") && openAt >= 0 && openAt < at && at < closeAt
		}
	}
	if !quoted {
		t.Fatalf("the hostile sentence is not returned as quoted evidence: %+v", res.Content)
	}
	traceLen := func() int {
		trc, err := s.Evidence.GetTrace(s.As(context.Background(), scenario.Auditor.ID, scenario.Auditor.Groups...), &evidencev1.GetTraceRequest{TaskId: task})
		if err != nil {
			t.Fatal(err)
		}
		return len(trc.GetEvents())
	}
	before := traceLen()

	// The model does what the page says.
	for _, name := range []string{scenario.Deliver, "export"} {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: map[string]any{"artifact": "workspace", "destination": "anywhere"}})
		if err == nil && !res.IsError {
			t.Errorf("calling %s through the task endpoint succeeded: %+v", name, res.Content)
		}
	}
	reqs, err := s.Orchestrator.ListRequests(alice, &orchestratorv1.ListRequestsRequest{TaskId: task})
	if err != nil || len(reqs.GetRequests()) != 1 || reqs.GetRequests()[0].GetCapability() != scenario.Retrieve {
		t.Errorf("requests after the export attempts = %v, %v; want only the retrieval", reqs.GetRequests(), err)
	}
	if got := traceLen(); got != before {
		t.Errorf("the export attempts grew the trace from %d to %d events; nothing reached the task", before, got)
	}
}
