package adapter

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// Discovery of what a reviewer judges beyond tools and resources: resource
// templates, prompts, icons, titles, annotations and tools' execution
// properties.

func TestWireFramers(t *testing.T) {
	t.Parallel()
	page1 := `{"jsonrpc":"2.0","id":3,"result":{"tools":[{"name":"research","inputSchema":{},"execution":{"taskSupport":"required"}},{"name":"echo","inputSchema":{}}],"nextCursor":"2"}}`
	page2 := `{"jsonrpc":"2.0","id":4,"result":{"tools":[{"name":"deep","execution":{"taskSupport":"optional"}},{"name":"nulled","execution":null}]}}`
	notTools := `{"jsonrpc":"2.0","id":5,"result":{"resources":[{"name":"x","execution":{"taskSupport":"required"}}]}}`
	request := `{"jsonrpc":"2.0","id":9,"method":"sampling/createMessage","params":{"tools":[{"name":"evil","execution":{"taskSupport":"forbidden"}}]}}`
	split := strings.Index(page1, `"result"`) // a line break between JSON tokens
	both := map[string]string{"research": `{"taskSupport":"required"}`, "deep": `{"taskSupport":"optional"}`}
	tests := []struct {
		name   string
		framer func(*wireTap) framer
		chunks []string
		want   map[string]string
	}{
		{"stdio lines split anywhere", func(w *wireTap) framer { return &lineFramer{tap: w} },
			[]string{page1[:17], page1[17:] + "\n" + notTools + "\n" + page2[:40], page2[40:] + "\n" + request + "\n"}, both},
		{"stdio last line without newline", func(w *wireTap) framer { return &lineFramer{tap: w} },
			[]string{page1 + "\n", page2}, both},
		{"stdio garbage", func(w *wireTap) framer { return &lineFramer{tap: w} },
			[]string{"not json\n{\"result\":{\"tools\":\"nope\"}}\n" + page1 + "\n"}, map[string]string{"research": `{"taskSupport":"required"}`}},
		{"JSON body at EOF only", func(w *wireTap) framer { return &bodyFramer{tap: w} },
			[]string{page1[:50], page1[50:]}, map[string]string{"research": `{"taskSupport":"required"}`}},
		{"event stream with CRLF, comments and ids", func(w *wireTap) framer { return &sseFramer{tap: w} },
			[]string{": keepalive\r\nevent: message\r\nid: 1\r\ndata: " + page1[:30], page1[30:] + "\r\n\r\nevent: message\ndata: " + page2 + "\n\n"}, both},
		{"event with data over several lines", func(w *wireTap) framer { return &sseFramer{tap: w} },
			[]string{"data:" + page1[:split] + "\ndata:" + page1[split:] + "\n\n"}, map[string]string{"research": `{"taskSupport":"required"}`}},
		{"event stream ending without a blank line", func(w *wireTap) framer { return &sseFramer{tap: w} },
			[]string{"data: " + page2}, map[string]string{"deep": `{"taskSupport":"optional"}`}},
		{"other messages only", func(w *wireTap) framer { return &sseFramer{tap: w} },
			[]string{"data: " + notTools + "\n\ndata: " + request + "\n\n"}, map[string]string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tap := newWireTap()
			f := tt.framer(tap)
			for _, c := range tt.chunks {
				f.feed([]byte(c))
			}
			f.end()
			got := map[string]string{}
			for name, raw := range tap.execution {
				got[name] = string(raw)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("execution = %v, want %v", got, tt.want)
			}
			for name, w := range tt.want {
				if got[name] != w {
					t.Errorf("execution of %s = %s, want %s", name, got[name], w)
				}
			}
		})
	}
}

// surfaceServer is a go-sdk server describing everything a reviewer
// judges, paging its lists two items at a time. methods records every
// request it received.
func surfaceServer(t *testing.T, methods *methodLog) *mcp.Server {
	t.Helper()
	yes := true
	s := mcp.NewServer(&mcp.Implementation{Name: "surface", Version: "1"}, &mcp.ServerOptions{PageSize: 2})
	s.AddReceivingMiddleware(methods.middleware)
	mcp.AddTool(s, &mcp.Tool{
		Name: "wipe", Title: "Wipe the workspace", Description: "Deletes everything.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: &yes, Title: "Wipe"},
		Icons:       []mcp.Icon{{Source: "https://icons.example/wipe.png", MIMEType: "image/png", Sizes: []string{"48x48", "96x96"}, Theme: "dark"}},
	}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{}, nil, nil
	})
	s.AddResource(&mcp.Resource{
		URI: "notes://guide", Name: "guide", Title: "Guide", MIMEType: "text/markdown",
		Annotations: &mcp.Annotations{Audience: []mcp.Role{"user"}, Priority: 0.5},
		Icons:       []mcp.Icon{{Source: "data:image/svg+xml;base64,PHN2Zy8+"}},
	}, func(context.Context, *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		return &mcp.ReadResourceResult{}, nil
	})
	read := func(context.Context, *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		return &mcp.ReadResourceResult{}, nil
	}
	for _, rt := range []*mcp.ResourceTemplate{
		{URITemplate: "notes://{slug}", Name: "note", Title: "Note", Description: "A note by slug", MIMEType: "text/markdown",
			Annotations: &mcp.Annotations{Audience: []mcp.Role{"assistant"}}, Icons: []mcp.Icon{{Source: "https://icons.example/note.png"}}},
		{URITemplate: "docs://{+path}", Name: "doc", Description: "A document"},
		{URITemplate: "drafts://{id}", Name: "draft"},
	} {
		s.AddResourceTemplate(rt, read)
	}
	get := func(context.Context, *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
		return &mcp.GetPromptResult{}, nil
	}
	for _, p := range []*mcp.Prompt{
		{Name: "summarize", Title: "Summarize", Description: "Summarize a note", Arguments: []*mcp.PromptArgument{
			{Name: "slug", Title: "Note", Description: "Which note", Required: true}, {Name: "style", Description: "brief or full"},
		}, Icons: []mcp.Icon{{Source: "https://icons.example/sum.png", Theme: "light"}}},
		{Name: "greet", Description: "Say hello"},
		{Name: "translate"},
	} {
		s.AddPrompt(p, get)
	}
	return s
}

// methodLog records the methods a test server received.
type methodLog struct {
	mu      sync.Mutex
	methods []string
}

func (l *methodLog) middleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		l.mu.Lock()
		l.methods = append(l.methods, method)
		l.mu.Unlock()
		return next(ctx, method, req)
	}
}

func (l *methodLog) received(method string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.methods {
		if m == method {
			n++
		}
	}
	return n
}

// serveHTTP serves an MCP server over streamable HTTP on loopback, with
// event-stream or JSON responses.
func serveHTTP(t *testing.T, s *mcp.Server, jsonResponses bool) string {
	t.Helper()
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{JSONResponse: jsonResponses})
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	return ts.URL
}

func discover(t *testing.T, e *env, conn *registryv1.Connection) *registryv1.DiscoverySnapshot {
	t.Helper()
	snap, err := e.srv.Discover(testkit.AsService(context.Background(), identity.Operator), &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()})
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	return snap
}

func TestDiscoverSurface(t *testing.T) {
	t.Parallel()
	for _, mode := range []struct {
		name string
		json bool
	}{{"event-stream responses", false}, {"JSON responses", true}} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			var log methodLog
			e := newEnv(t)
			snap := discover(t, e, e.httpConn(serveHTTP(t, surfaceServer(t, &log), mode.json)))

			var templates, prompts []string
			for _, rt := range snap.GetResourceTemplates() {
				templates = append(templates, rt.GetUriTemplate())
			}
			for _, p := range snap.GetPrompts() {
				prompts = append(prompts, p.GetName())
			}
			// Three of each on two pages each: every page was listed.
			if !slices.Equal(templates, []string{"docs://{+path}", "drafts://{id}", "notes://{slug}"}) ||
				!slices.Equal(prompts, []string{"greet", "summarize", "translate"}) {
				t.Fatalf("templates %v, prompts %v", templates, prompts)
			}
			if n := log.received("prompts/list"); n < 2 {
				t.Errorf("prompts/list received %d times, want every page", n)
			}
			note, sum := snap.GetResourceTemplates()[2], snap.GetPrompts()[1]
			wantJSON(t, "template", note, `{"uriTemplate":"notes://{slug}","name":"note","title":"Note","description":"A note by slug","mimeType":"text/markdown",
				"annotations":{"audience":["assistant"]},"icons":[{"src":"https://icons.example/note.png"}]}`)
			wantJSON(t, "prompt", sum, `{"name":"summarize","title":"Summarize","description":"Summarize a note",
				"arguments":[{"name":"slug","title":"Note","description":"Which note","required":true},{"name":"style","description":"brief or full"}],
				"icons":[{"src":"https://icons.example/sum.png","theme":"light"}]}`)
			wipe := snap.GetTools()[0]
			if wipe.GetTitle() != "Wipe the workspace" || !wipe.GetAnnotations().GetFields()["destructiveHint"].GetBoolValue() || wipe.GetExecution() != nil {
				t.Errorf("tool = %v", wipe)
			}
			wantJSON(t, "tool icons", &registryv1.ToolIdentity{Icons: wipe.GetIcons()},
				`{"icons":[{"src":"https://icons.example/wipe.png","mimeType":"image/png","sizes":["48x48","96x96"],"theme":"dark"}]}`)
			guide := snap.GetResources()[0]
			wantJSON(t, "resource", &registryv1.ResourceIdentity{Annotations: guide.GetAnnotations(), Icons: guide.GetIcons()},
				`{"annotations":{"audience":["user"],"priority":0.5},"icons":[{"src":"data:image/svg+xml;base64,PHN2Zy8+"}]}`)
		})
	}
}

// wantJSON compares a message with the protojson of what it should be.
func wantJSON(t *testing.T, what string, got proto.Message, want string) {
	t.Helper()
	g, err := protojson.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	var a, b any
	if err := json.Unmarshal(g, &a); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(want), &b); err != nil {
		t.Fatalf("bad want: %v", err)
	}
	ga, _ := json.Marshal(a)
	wb, _ := json.Marshal(b)
	if string(ga) != string(wb) {
		t.Errorf("%s = %s, want %s", what, ga, wb)
	}
}

// TestDiscoverRespectsCapabilities: what a server does not declare is not
// asked for; a server that declares resources but answers templates/list
// with "method not found" still describes its resources.
func TestDiscoverRespectsCapabilities(t *testing.T) {
	t.Parallel()
	t.Run("tools only", func(t *testing.T) {
		t.Parallel()
		var log methodLog
		s := mcp.NewServer(&mcp.Implementation{Name: "tools-only", Version: "1"}, nil)
		s.AddReceivingMiddleware(log.middleware)
		mcp.AddTool(s, &mcp.Tool{Name: "echo"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{}, nil, nil
		})
		e := newEnv(t)
		snap := discover(t, e, e.httpConn(serveHTTP(t, s, false)))
		if len(snap.GetTools()) != 1 || len(snap.GetResourceTemplates())+len(snap.GetPrompts())+len(snap.GetResources()) != 0 {
			t.Errorf("snapshot = %v", snap)
		}
		for _, m := range []string{"prompts/list", "resources/templates/list", "resources/list"} {
			if n := log.received(m); n != 0 {
				t.Errorf("%s sent %d times to a server that does not declare it", m, n)
			}
		}
	})
	t.Run("templates not implemented", func(t *testing.T) {
		t.Parallel()
		s := mcp.NewServer(&mcp.Implementation{Name: "no-templates", Version: "1"}, nil)
		s.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
			return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
				if method == "resources/templates/list" {
					return nil, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: "method not found"}
				}
				return next(ctx, method, req)
			}
		})
		s.AddResource(&mcp.Resource{URI: "notes://a", Name: "a"}, func(context.Context, *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
			return &mcp.ReadResourceResult{}, nil
		})
		e := newEnv(t)
		snap := discover(t, e, e.httpConn(serveHTTP(t, s, false)))
		if len(snap.GetResources()) != 1 || len(snap.GetResourceTemplates()) != 0 {
			t.Errorf("snapshot = %v", snap)
		}
	})
}

// taskServer is a hand-written streamable HTTP MCP server of the
// 2025-11-25 specification, which the go-sdk's server cannot yet speak:
// its tools declare execution.taskSupport, over two pages of tools/list.
// It answers with JSON or an event stream.
func taskServer(t *testing.T, eventStream bool) string {
	t.Helper()
	pages := map[string]any{
		"": map[string]any{"tools": []any{
			map[string]any{"name": "research", "inputSchema": map[string]any{"type": "object"}, "execution": map[string]any{"taskSupport": "required"}},
			map[string]any{"name": "echo", "inputSchema": map[string]any{"type": "object"}},
		}, "nextCursor": "2"},
		"2": map[string]any{"tools": []any{
			map[string]any{"name": "deep", "inputSchema": map[string]any{"type": "object"}, "execution": map[string]any{"taskSupport": "optional"}},
		}},
	}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "POST only", http.StatusMethodNotAllowed)
			return
		}
		body, _ := io.ReadAll(r.Body)
		var req struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Params struct {
				Cursor string `json:"cursor"`
			} `json:"params"`
		}
		if err := json.Unmarshal(body, &req); err != nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		if len(req.ID) == 0 {
			w.WriteHeader(http.StatusAccepted)
			return
		}
		resp := map[string]any{"jsonrpc": "2.0", "id": req.ID}
		switch req.Method {
		case "initialize":
			resp["result"] = map[string]any{"protocolVersion": "2025-11-25", "capabilities": map[string]any{"tools": map[string]any{}},
				"serverInfo": map[string]any{"name": "tasks", "version": "1"}}
		case "tools/list":
			resp["result"] = pages[req.Params.Cursor]
		default:
			resp["error"] = map[string]any{"code": jsonrpc.CodeMethodNotFound, "message": "method not found"}
		}
		out, _ := json.Marshal(resp)
		if eventStream {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, ": hello\r\nevent: message\r\nid: 1\r\ndata: "+string(out)+"\r\n\r\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(out)
	}))
	t.Cleanup(ts.Close)
	return ts.URL
}

func TestDiscoverToolExecution(t *testing.T) {
	t.Parallel()
	for _, mode := range []struct {
		name        string
		eventStream bool
	}{{"event-stream responses", true}, {"JSON responses", false}} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			snap := discover(t, e, e.httpConn(taskServer(t, mode.eventStream)))
			got := map[string]string{}
			for _, tool := range snap.GetTools() {
				got[tool.GetName()] = tool.GetExecution().GetFields()["taskSupport"].GetStringValue()
			}
			want := map[string]string{"deep": "optional", "echo": "", "research": "required"}
			if len(got) != len(want) {
				t.Fatalf("tools %v, want %v", got, want)
			}
			for name, w := range want {
				if got[name] != w {
					t.Errorf("%s taskSupport %q, want %q", name, got[name], w)
				}
			}
		})
	}
}

// TestDiscoverExecutionIsScrubbed: a server echoing the connection's
// credential in a tool's execution properties does not get it into the
// snapshot.
func TestDiscoverExecutionIsScrubbed(t *testing.T) {
	t.Parallel()
	tap := newWireTap()
	tap.message([]byte(`{"jsonrpc":"2.0","id":2,"result":{"tools":[{"name":"leak","execution":{"taskSupport":"required","note":"token hunter2-secret"}}]}}`))
	creds := &credentials{}
	creds.add("hunter2-secret")
	ss := &session{m: newMeter(discoveryMessageLimit), creds: creds}
	ss.m.tap.Store(tap)
	exec, err := ss.toolExecution("leak")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(exec)
	if strings.Contains(string(b), "hunter2") || exec["taskSupport"] != "required" {
		t.Errorf("execution = %s", b)
	}
}
