package attack_test

import (
	"context"
	"crypto/tls"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/demo/scenario"
	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/identity"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	"github.com/v0m3/v0m3/suite"
)

// TestFloodingCallerIsRefusedAndLeavesNothing: an authenticated author
// starting tasks as fast as they can gets their burst and is then refused,
// before anything is stored, with a retry delay; the orchestrator's task
// MCP endpoint refuses their tasks' requests too (one bucket per person);
// everyone else keeps working.
func TestFloodingCallerIsRefusedAndLeavesNothing(t *testing.T) {
	t.Parallel()
	const burst = 40
	s, err := suite.Start(context.Background(), suite.Config{
		DataDir: t.TempDir(), MCP: &suite.MCP{},
		Reach: &suite.Reach{StdioRoots: []string{filepath.Dir(v0m3Bin)}, AllowLoopback: true},
		// Nothing refills during the test.
		CallerRateLimits: identity.RateLimits{Default: identity.RateLimit{PerSecond: 1.0 / 3600, Burst: burst}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	ctx := context.Background()
	if _, err := scenario.Run(ctx, s.Clients, scenario.Config{Transport: scenario.StdioFixture(v0m3Bin), As: s.As}); err != nil {
		t.Fatalf("scenario (each of its people within their own burst): %v", err)
	}
	startTask := func(ctx context.Context) (*orchestratorv1.StartTaskResponse, error) {
		return s.Orchestrator.StartTask(ctx, &orchestratorv1.StartTaskRequest{
			Profile: "source_review", McpAccess: true,
			SourceScope: []*orchestratorv1.SourceRef{{Uri: scenario.MigrationFAQURI, Title: "Migration FAQ"}},
		})
	}

	mallory := s.As(ctx, "mallory", "authors")
	var (
		first             *orchestratorv1.StartTaskResponse
		admitted, refused int
	)
	for range 3 * burst {
		resp, err := startTask(mallory)
		switch {
		case err == nil:
			admitted++
			if first == nil {
				first = resp
			}
		case apierror.Is(err, codes.ResourceExhausted, identity.ReasonCallerRateLimited):
			refused++
			if d := apierror.RetryDelay(err); d <= 0 {
				t.Fatalf("refusal without a retry delay: %v", err)
			}
		default:
			t.Fatalf("mallory's StartTask: %v", err)
		}
	}
	if admitted != burst || refused != 2*burst {
		t.Errorf("mallory: %d tasks started, %d refused; want %d and %d", admitted, refused, burst, 2*burst)
	}
	// Nothing of the refused ones was stored.
	auditor := s.As(ctx, scenario.Auditor.ID, scenario.Auditor.Groups...)
	tasks, err := s.Orchestrator.ListTasks(auditor, &orchestratorv1.ListTasksRequest{Requester: "mallory", PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if got := len(tasks.GetTasks()); got != burst {
		t.Errorf("mallory has %d tasks stored, want the %d admitted", got, burst)
	}

	// The task MCP endpoint counts mallory in the same bucket: 429.
	creds, err := s.Credentials(suite.Orchestrator)
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: creds.Roots(), MinVersion: tls.VersionTLS13}}}
	t.Cleanup(client.CloseIdleConnections)
	initialize := func(ep *orchestratorv1.McpEndpoint) *http.Response {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, ep.GetUrl(), strings.NewReader(
			`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"flood","version":"1"}}}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+ep.GetToken())
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp
	}
	resp := initialize(first.GetMcpEndpoint())
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("mallory's task MCP endpoint answered %d, want 429", resp.StatusCode)
	}
	if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || secs < 1 {
		t.Errorf("Retry-After %q, want whole seconds", resp.Header.Get("Retry-After"))
	}

	// Everyone else is unaffected.
	alice := s.As(ctx, scenario.Alice.ID, scenario.Alice.Groups...)
	theirs, err := startTask(alice)
	if err != nil {
		t.Fatalf("alice's StartTask while mallory is refused: %v", err)
	}
	if resp := initialize(theirs.GetMcpEndpoint()); resp.StatusCode != http.StatusOK {
		t.Errorf("alice's task MCP endpoint answered %d, want 200", resp.StatusCode)
	}
}
