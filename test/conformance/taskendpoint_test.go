package conformance_test

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"testing"

	"github.com/v0m3/v0m3/demo/scenario"
	"github.com/v0m3/v0m3/internal/testkit"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	"github.com/v0m3/v0m3/suite"
)

// startTaskEndpoint runs the five services with the task MCP endpoint, a
// source-review task with MCP access over the fixture server (stdio, the
// v0m3 binary), and returns a loopback URL for the conformance runner.
// The runner cannot send a bearer token or trust the development CA, so
// it reaches the endpoint through a reverse proxy that does both: the
// proxy is the runner's client configuration, and everything behind it is
// the real endpoint. Scenarios that need tools of their own naming (the
// fixture's "test_*" tools) fail here by design: a task offers only its
// catalogue.
func startTaskEndpoint(t *testing.T, v0m3 string) string {
	t.Helper()
	// The fixture is the v0m3 binary this test built, copied where the
	// adapter starts executables from: a directory every uid reaches (a
	// root adapter runs it under a uid of its own) and only this one writes.
	dir := testkit.ReachableDir(t)
	exe, err := os.ReadFile(v0m3)
	if err != nil {
		t.Fatal(err)
	}
	v0m3 = filepath.Join(dir, "v0m3")
	if err := os.WriteFile(v0m3, exe, 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := suite.Start(context.Background(), suite.Config{DataDir: t.TempDir(), MCP: &suite.MCP{},
		Reach: &suite.Reach{StdioRoots: []string{dir}, AllowLoopback: true}})
	if err != nil {
		t.Fatalf("start suite: %v", err)
	}
	t.Cleanup(s.Close)
	if _, err := scenario.Run(t.Context(), s.Clients, scenario.Config{Transport: scenario.StdioFixture(v0m3), As: s.As}); err != nil {
		t.Fatalf("scenario: %v", err)
	}
	resp, err := s.Orchestrator.StartTask(s.As(t.Context(), scenario.Alice.ID, scenario.Alice.Groups...), &orchestratorv1.StartTaskRequest{
		Profile: "source_review", Purpose: "conformance", McpAccess: true,
		SourceScope: []*orchestratorv1.SourceRef{{Uri: scenario.MigrationFAQURI, Title: "Migration FAQ"}},
	})
	if err != nil {
		t.Fatalf("start task: %v", err)
	}
	ep := resp.GetMcpEndpoint()
	target, err := url.Parse(ep.GetUrl())
	if err != nil {
		t.Fatal(err)
	}
	creds, err := s.Credentials(suite.Orchestrator)
	if err != nil {
		t.Fatal(err)
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(&url.URL{Scheme: target.Scheme, Host: target.Host})
			r.Out.URL.Path = target.Path
			r.Out.Header.Set("Authorization", "Bearer "+ep.GetToken())
		},
		Transport:     &http.Transport{TLSClientConfig: &tls.Config{RootCAs: creds.Roots(), MinVersion: tls.VersionTLS13}},
		FlushInterval: -1, // event streams pass through as they come
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: proxy}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + l.Addr().String() + "/mcp"
}
