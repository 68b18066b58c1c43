//lint:file-ignore SA1019 sampling and roots are deprecated in 2026-07-28 (SEP-2577), but servers still ask for them: what the adapter does then is what is tested.

package adapter

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// TestSamplingAndRootsEndTheCall: a 2026-07-28 server that asks, inside an
// input_required result, for a model completion (sampling) or for the
// client's roots hears nothing made up: the call ends at once with
// USER_INPUT_REQUIRED and the server's request as untrusted, truncated
// detail, not with the server's error or answer, and the tool is not run
// again.
func TestSamplingAndRootsEndTheCall(t *testing.T) {
	t.Parallel()
	const prompt = "Summarise the ledger for the auditor"
	long := strings.Repeat("x", 4*maxElicitMessageBytes)
	for _, tc := range []struct {
		name       string
		ask        mcp.InputRequest
		wantDetail string
	}{
		{name: "sampling", ask: &mcp.CreateMessageParams{MaxTokens: 64,
			Messages: []*mcp.SamplingMessage{{Role: "user", Content: &mcp.TextContent{Text: prompt}}}}, wantDetail: prompt},
		{name: "sampling with a long prompt", ask: &mcp.CreateMessageParams{MaxTokens: 64,
			Messages: []*mcp.SamplingMessage{{Role: "user", Content: &mcp.TextContent{Text: long}}}}},
		{name: "roots", ask: &mcp.ListRootsParams{}, wantDetail: "roots/list"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var runs, answered atomic.Int32
			srv := mcp.NewServer(&mcp.Implementation{Name: "asks", Version: "1"}, nil)
			mcp.AddTool(srv, &mcp.Tool{Name: "audit"}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
				runs.Add(1)
				if len(req.Params.InputResponses) > 0 {
					answered.Add(1)
					return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "audited with an answer nobody gave"}}}, nil, nil
				}
				return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{"ask": tc.ask}, RequestState: "opaque"}, nil, nil
			})
			s := newSDKServer(t, srv, false, &mcp.StreamableHTTPOptions{Stateless: true})
			e := newEnv(t)
			conn := e.httpConn(s.URL)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			resp, err := e.srv.Execute(ctx, granted(t, call(t, conn, "audit", map[string]any{}, nil)))
			if err != nil {
				t.Fatal(err)
			}
			wantFailure(t, resp, adapterv1.Outcome_OUTCOME_INVALID_REQUEST, CodeUserInputRequired)
			detail := resp.GetError().GetUntrustedDetail()
			if !strings.Contains(detail, tc.wantDetail) || len(detail) > maxElicitMessageBytes {
				t.Errorf("untrusted detail %q: want the server's request (%q), at most %d bytes", detail, tc.wantDetail, maxElicitMessageBytes)
			}
			if runs.Load() != 1 || answered.Load() != 0 {
				t.Errorf("the tool ran %d times, %d with answers; want once, never answered", runs.Load(), answered.Load())
			}
		})
	}
}

// TestInputRoundsExceeded: a server that asks for input on every round,
// even after the adapter answered it (a form accepted with its defaults),
// ends the call as USER_INPUT_REQUIRED after maxInputRounds, with the
// result observed (the server answered every round), not as a broken
// transport; the session keeps serving.
func TestInputRoundsExceeded(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	srv := mcp.NewServer(&mcp.Implementation{Name: "asks forever", Version: "1"}, nil)
	mcp.AddTool(srv, &mcp.Tool{Name: "ask"}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		runs.Add(1)
		return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{"form": &mcp.ElicitParams{Message: "again?",
			RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{"ok": map[string]any{"type": "boolean", "default": true}}}}},
			RequestState: "opaque"}, nil, nil
	})
	mcp.AddTool(srv, &mcp.Tool{Name: "fine"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil, nil
	})
	s := newSDKServer(t, srv, false, &mcp.StreamableHTTPOptions{Stateless: true})
	e := newEnv(t)
	conn := e.httpConn(s.URL)
	limits := &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 10, Elicitation: registryv1.ElicitationPolicy_ELICITATION_POLICY_ACCEPT_DEFAULTS}
	resp := execute(t, e, call(t, conn, "ask", map[string]any{}, limits))
	wantFailure(t, resp, adapterv1.Outcome_OUTCOME_INVALID_REQUEST, CodeUserInputRequired)
	if resp.GetStage() != adapterv1.DeliveryStage_DELIVERY_STAGE_RESULT_OBSERVED {
		t.Errorf("stage %v, want result observed", resp.GetStage())
	}
	if n := runs.Load(); n != maxInputRounds {
		t.Errorf("the tool ran %d times, want %d", n, maxInputRounds)
	}
	if r := execute(t, e, call(t, conn, "fine", map[string]any{}, nil)); r.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
		t.Errorf("the next call: %v %v", r.GetOutcome(), r.GetError())
	}
}
