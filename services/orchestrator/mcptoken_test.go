package orchestrator

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	"github.com/v0m3/v0m3/services/orchestrator/taskmcp"
)

// mcpPost sends a tools/list to the task endpoint with token and returns
// the status and the challenge header.
func mcpPost(t *testing.T, h http.Handler, taskID, token string) (int, string) {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, "http://127.0.0.1"+MCPPath(taskID), strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2025-06-18")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Header().Get("WWW-Authenticate")
}

// TestMCPTokenLifetime: a token opens its task until it expires (by the
// orchestrator's clock), and only the digest is stored.
func TestMCPTokenLifetime(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(d *Deps) { d.MCPBaseURL = "https://v0m3.test"; d.MCPTokenTTL = 10 * time.Minute })
	resp, err := h.client.StartTask(t.Context(), &orchestratorv1.StartTaskRequest{
		Profile: "source_review", SourceScope: []*orchestratorv1.SourceRef{migrationGuide}, McpAccess: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	task, ep := resp.GetTask().GetId(), resp.GetMcpEndpoint()
	if ep.GetUrl() != "https://v0m3.test/tasks/"+task+"/mcp" {
		t.Errorf("url = %q", ep.GetUrl())
	}
	recs, err := h.server.st.ListAccessTokens(t.Context(), task)
	if err != nil || len(recs) != 1 || recs[0].GetTokenDigest() != tokenDigest(ep.GetToken()) || strings.Contains(recs[0].String(), ep.GetToken()) {
		t.Fatalf("stored tokens = %v, %v; want the digest only", recs, err)
	}
	handler := taskmcp.Handler(h.server.MCPBackend(), taskmcp.Options{Credentials: h.server.deps.Credentials, ApprovalURL: h.server.deps.ApprovalURL, Log: h.server.log})
	if code, _ := mcpPost(t, handler, task, ep.GetToken()); code != http.StatusOK {
		t.Fatalf("valid token: status %d", code)
	}
	h.clock.Advance(10 * time.Minute)
	code, challenge := mcpPost(t, handler, task, ep.GetToken())
	if code != http.StatusUnauthorized || !strings.Contains(challenge, `error="invalid_token"`) {
		t.Errorf("expired token: status %d, challenge %q; want 401 invalid_token", code, challenge)
	}
	// A fresh one works again.
	fresh, err := h.client.MintMcpToken(t.Context(), &orchestratorv1.MintMcpTokenRequest{TaskId: task})
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := mcpPost(t, handler, task, fresh.GetToken()); code != http.StatusOK {
		t.Errorf("fresh token: status %d", code)
	}
	if reqs, _ := h.server.st.ListRequests(t.Context(), task); len(reqs) != 0 {
		t.Errorf("tools/list and refusals created requests: %v", reqs)
	}
}

// TestMCPDisabled: without an endpoint, asking for MCP access is refused
// and starts no task.
func TestMCPDisabled(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	_, err := h.client.StartTask(t.Context(), &orchestratorv1.StartTaskRequest{Profile: "source_review", McpAccess: true})
	if !apierror.Is(err, codes.FailedPrecondition, "MCP_ENDPOINT_DISABLED") {
		t.Fatalf("StartTask with MCP access = %v; want MCP_ENDPOINT_DISABLED", err)
	}
	if tasks, _ := h.server.st.ListTasks(t.Context(), orchestratorv1.TaskState_TASK_STATE_UNSPECIFIED); len(tasks) != 0 {
		t.Errorf("a refused start left tasks: %v", tasks)
	}
}

// TestMCPTokenVerification covers the token rules one by one.
func TestMCPTokenVerification(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(d *Deps) { d.MCPBaseURL = "https://v0m3.test" })
	start := func() *orchestratorv1.StartTaskResponse {
		resp, err := h.client.StartTask(t.Context(), &orchestratorv1.StartTaskRequest{
			Profile: "source_review", SourceScope: []*orchestratorv1.SourceRef{migrationGuide}, McpAccess: true,
		})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	a, b := start(), start()
	for _, tc := range []struct {
		name, task, token string
		ok                bool
	}{
		{"own token", a.GetTask().GetId(), a.GetMcpEndpoint().GetToken(), true},
		{"other task's token", a.GetTask().GetId(), b.GetMcpEndpoint().GetToken(), false},
		{"unknown task", "task_nope", a.GetMcpEndpoint().GetToken(), false},
		{"no prefix", a.GetTask().GetId(), strings.TrimPrefix(a.GetMcpEndpoint().GetToken(), mcpTokenPrefix), false},
		{"truncated", a.GetTask().GetId(), a.GetMcpEndpoint().GetToken()[:20], false},
		{"oversized", a.GetTask().GetId(), mcpTokenPrefix + strings.Repeat("x", 1000), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := h.server.verifyMCPToken(t.Context(), tc.task, tc.token)
			if tc.ok != (err == nil) || (err != nil && !isTokenRefused(err)) {
				t.Errorf("verify = %v; want ok=%v (a refusal otherwise)", err, tc.ok)
			}
		})
	}
	if _, err := h.client.CancelTask(t.Context(), &orchestratorv1.CancelTaskRequest{Id: a.GetTask().GetId()}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.server.verifyMCPToken(t.Context(), a.GetTask().GetId(), a.GetMcpEndpoint().GetToken()); !isTokenRefused(err) {
		t.Errorf("token of a cancelled task: %v; want refused", err)
	}
	if _, err := h.client.MintMcpToken(t.Context(), &orchestratorv1.MintMcpTokenRequest{TaskId: a.GetTask().GetId()}); !apierror.Is(err, codes.FailedPrecondition, "TASK_NOT_ACTIVE") {
		t.Errorf("minting for a cancelled task = %v; want TASK_NOT_ACTIVE", err)
	}
	if _, err := h.client.MintMcpToken(as(t.Context(), "mallory", "authors"), &orchestratorv1.MintMcpTokenRequest{TaskId: b.GetTask().GetId()}); err == nil {
		t.Error("another user minted a token for alice's task")
	}
}
