package adapter

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/digest"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/stdionoise"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// The robust MCP client (issue 16 item 4), each behaviour against a real
// go-sdk server served in process over streamable HTTP.

// sdkServer is a go-sdk MCP server behind an HTTP front that can play an
// older server (server/discover answered with -32601, as today's
// TypeScript servers do) and records what reached it.
type sdkServer struct {
	*httptest.Server
	legacy bool

	mu        sync.Mutex
	discovers int
	bodies    []string      // every POST body, in order
	resumes   []string      // Last-Event-ID of every GET that carried one
	dropCall  chan struct{} // when set, the first tools/call stream is cut after its first event; closed then
	dropped   bool
	cancelled chan string // receives the requestId of every notifications/cancelled
}

func newSDKServer(t *testing.T, srv *mcp.Server, legacy bool, opts *mcp.StreamableHTTPOptions) *sdkServer {
	t.Helper()
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, opts)
	s := &sdkServer{legacy: legacy, cancelled: make(chan string, 16)}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id := r.Header.Get("Last-Event-ID"); id != "" {
			s.mu.Lock()
			s.resumes = append(s.resumes, id)
			s.mu.Unlock()
		}
		if r.Method != http.MethodPost {
			h.ServeHTTP(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		var msg struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Params struct {
				RequestID json.RawMessage `json:"requestId"`
			} `json:"params"`
		}
		_ = json.Unmarshal(body, &msg)
		s.mu.Lock()
		s.bodies = append(s.bodies, string(body))
		drop := msg.Method == "tools/call" && s.dropCall != nil && !s.dropped
		if drop {
			s.dropped = true
		}
		if msg.Method == "server/discover" {
			s.discovers++
		}
		s.mu.Unlock()
		switch {
		case msg.Method == "server/discover" && s.legacy:
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(msg.ID) + `,"error":{"code":-32601,"message":"Method not found"}}`))
			return
		case msg.Method == "notifications/cancelled":
			s.cancelled <- string(msg.Params.RequestID)
		case drop:
			// The connection breaks after the stream's first event (the
			// priming event that names where to resume).
			h.ServeHTTP(&cutAfterFirstEvent{ResponseWriter: w, cut: s.dropCall}, r)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *sdkServer) discoverCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.discovers
}

// cutAfterFirstEvent passes an event stream through until its first
// event has been flushed to the client, then breaks the connection.
type cutAfterFirstEvent struct {
	http.ResponseWriter
	cut     chan struct{}
	written bool
	done    bool
}

func (c *cutAfterFirstEvent) Write(p []byte) (int, error) {
	if c.done {
		return 0, http.ErrHandlerTimeout
	}
	c.written = true
	return c.ResponseWriter.Write(p)
}

func (c *cutAfterFirstEvent) Flush() {
	if c.done {
		return
	}
	http.NewResponseController(c.ResponseWriter).Flush()
	if c.written {
		c.done = true
		if conn, _, err := http.NewResponseController(c.ResponseWriter).Hijack(); err == nil {
			_ = conn.Close()
		}
		close(c.cut)
	}
}

func (c *cutAfterFirstEvent) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// TestDroppedStreamResumes: a call's event stream that ends before its
// response (the server closes it asking for a reconnect, or the
// connection breaks) is resumed with Last-Event-ID, and the call gets its
// result from the one execution the server made, instead of becoming an
// unknown outcome. The server speaks 2025-11-25, the last version with
// resumable streams.
func TestDroppedStreamResumes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		drop bool // the connection breaks; else the server closes the stream (SEP-1699)
	}{
		{"server closes the stream", false},
		{"connection breaks", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var runs atomic.Int32
			srv := mcp.NewServer(&mcp.Implementation{Name: "resumable", Version: "1"}, nil)
			var s *sdkServer
			mcp.AddTool(srv, &mcp.Tool{Name: "once"}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
				runs.Add(1)
				if tc.drop {
					select {
					case <-s.dropCall:
					case <-ctx.Done():
						return nil, nil, ctx.Err()
					}
				} else {
					req.Extra.CloseSSEStream(mcp.CloseSSEStreamArgs{RetryAfter: 50 * time.Millisecond})
				}
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done once"}}}, nil, nil
			})
			s = newSDKServer(t, srv, true, &mcp.StreamableHTTPOptions{EventStore: mcp.NewMemoryEventStore(nil)})
			if tc.drop {
				s.dropCall = make(chan struct{})
			}
			e := newEnv(t)
			conn := e.httpConn(s.URL)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			resp, err := e.srv.Execute(ctx, granted(t, call(t, conn, "once", map[string]any{}, nil)))
			if err != nil {
				t.Fatal(err)
			}
			if got := textOf(t, resp); got != "done once" {
				t.Fatalf("text %q; want the one result", got)
			}
			if resp.GetResponseBytes() == 0 {
				t.Errorf("the resumed response was not counted against the call's limit (response_bytes 0)")
			}
			if n := runs.Load(); n != 1 {
				t.Errorf("the tool ran %d times, want exactly 1", n)
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			if len(s.resumes) == 0 {
				t.Errorf("no request carried Last-Event-ID: the stream was not resumed")
			}
			calls := 0
			for _, b := range s.bodies {
				if strings.Contains(b, `"tools/call"`) {
					calls++
				}
			}
			if calls != 1 {
				t.Errorf("%d tools/call requests reached the server, want 1 (a resumption sends nothing again)", calls)
			}
		})
	}
}

// TestDroppedStreamWithoutEventIDsIsUnknown: a server that numbers no
// events cannot be resumed; the call stays an unknown outcome and is not
// sent again.
func TestDroppedStreamWithoutEventIDsIsUnknown(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	srv := mcp.NewServer(&mcp.Implementation{Name: "unnumbered", Version: "1"}, nil)
	var s *sdkServer
	mcp.AddTool(srv, &mcp.Tool{Name: "once"}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		runs.Add(1)
		// A progress notification is the stream's first event.
		_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: req.Params.GetProgressToken(), Progress: 1})
		select {
		case <-s.dropCall:
		case <-ctx.Done():
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "lost"}}}, nil, nil
	})
	s = newSDKServer(t, srv, true, nil) // no event store: no event ids
	s.dropCall = make(chan struct{})
	e := newEnv(t)
	conn := e.httpConn(s.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := e.srv.Execute(ctx, granted(t, call(t, conn, "once", map[string]any{}, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetOutcome() != adapterv1.Outcome_OUTCOME_UNKNOWN {
		t.Fatalf("outcome %v %v, want unknown", resp.GetOutcome(), resp.GetError())
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the tool ran %d times, want 1", n)
	}
}

// TestLegacyServerSkipsDiscover: a server that answered server/discover
// with -32601 is spoken to through initialize at once by the next
// sessions at the same configuration (one round trip less each); a new
// config revision asks again.
func TestLegacyServerSkipsDiscover(t *testing.T) {
	t.Parallel()
	srv := mcp.NewServer(&mcp.Implementation{Name: "legacy", Version: "1"}, nil)
	mcp.AddTool(srv, &mcp.Tool{Name: "ping"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "pong"}}}, nil, nil
	})
	s := newSDKServer(t, srv, true, nil)
	e := newEnv(t)
	conn := e.httpConn(s.URL)
	discover := func() {
		t.Helper()
		if _, err := e.srv.Discover(testkit.AsService(context.Background(), identity.Operator), &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()}); err != nil {
			t.Fatal(err)
		}
	}
	discover()
	if got := s.discoverCount(); got != 1 {
		t.Fatalf("first session: %d server/discover requests, want 1", got)
	}
	discover()
	if r := execute(t, e, call(t, conn, "ping", map[string]any{}, nil)); r.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
		t.Fatalf("call: %v", r.GetError())
	}
	if got := s.discoverCount(); got != 1 {
		t.Errorf("after two more sessions: %d server/discover requests, want still 1", got)
	}
	next := proto.CloneOf(conn)
	next.ConfigRevision++
	e.registry.add(next)
	if _, err := e.srv.Discover(testkit.AsService(context.Background(), identity.Operator), &adapterv1.DiscoverRequest{ConnectionId: next.GetId()}); err != nil {
		t.Fatal(err)
	}
	if got := s.discoverCount(); got != 2 {
		t.Errorf("a new config revision: %d server/discover requests in all, want 2", got)
	}
}

// TestElicitationEndsTheCall: a server that asks for user input during a
// call (a server request before 2026-07-28, an input_required result
// from 2026-07-28 on) hears "decline" at once, and the call ends long
// before its deadline with USER_INPUT_REQUIRED and the server's message
// as untrusted detail, not with what the server answered after. A server
// that asks again after the decline ends the call at once too.
func TestElicitationEndsTheCall(t *testing.T) {
	t.Parallel()
	const question = "Please confirm the transfer"
	for _, tc := range []struct {
		name       string
		legacy     bool
		askAgain   bool
		wantAction string
	}{
		{name: "server request", legacy: true, wantAction: "decline"},
		{name: "input_required result", wantAction: "decline"},
		{name: "input_required again after the decline", askAgain: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var (
				mu      sync.Mutex
				actions []string
				runs    atomic.Int32
			)
			srv := mcp.NewServer(&mcp.Implementation{Name: "asks", Version: "1"}, nil)
			mcp.AddTool(srv, &mcp.Tool{Name: "transfer"}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
				runs.Add(1)
				if tc.legacy {
					res, err := req.Session.Elicit(ctx, &mcp.ElicitParams{Message: question, RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{"ok": map[string]any{"type": "boolean"}}}})
					if err != nil {
						return nil, nil, err
					}
					mu.Lock()
					actions = append(actions, res.Action)
					mu.Unlock()
					return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "transferred anyway"}}}, nil, nil
				}
				if r, ok := req.Params.InputResponses["confirm"].(*mcp.ElicitResult); ok {
					mu.Lock()
					actions = append(actions, r.Action)
					mu.Unlock()
					if !tc.askAgain {
						return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "transferred anyway"}}}, nil, nil
					}
				}
				return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{"confirm": &mcp.ElicitParams{Message: question,
					RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{"ok": map[string]any{"type": "boolean"}}}}},
					RequestState: "opaque"}, nil, nil
			})
			// A stateless go-sdk server speaks 2026-07-28: it asks with an
			// input_required result.
			s := newSDKServer(t, srv, tc.legacy, &mcp.StreamableHTTPOptions{Stateless: !tc.legacy})
			e := newEnv(t)
			conn := e.httpConn(s.URL)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			resp, err := e.srv.Execute(ctx, granted(t, call(t, conn, "transfer", map[string]any{}, nil)))
			if err != nil {
				t.Fatal(err)
			}
			// A call that waited for its deadline would end as
			// DEADLINE_EXCEEDED: the outcome tells it ended at once.
			wantFailure(t, resp, adapterv1.Outcome_OUTCOME_INVALID_REQUEST, CodeUserInputRequired)
			if got := resp.GetError().GetUntrustedDetail(); got != question {
				t.Errorf("untrusted detail %q, want the server's question", got)
			}
			if resp.GetError().GetAdapterDetail() == "" || strings.Contains(resp.GetError().GetAdapterDetail(), question) {
				t.Errorf("adapter detail %q: want the adapter's own account, without remote text", resp.GetError().GetAdapterDetail())
			}
			mu.Lock()
			defer mu.Unlock()
			for _, a := range actions {
				if a != "decline" {
					t.Errorf("the server heard %q, want decline", a)
				}
			}
			if tc.wantAction != "" && len(actions) != 1 {
				t.Errorf("the server heard %d answers, want 1", len(actions))
			}
			if tc.askAgain && runs.Load() != 2 {
				t.Errorf("the tool ran %d times, want 2 (asked, declined, asked again: the call ends)", runs.Load())
			}
		})
	}
}

// TestCancellationReachesTheServer: a call given up at its deadline, or
// cancelled by its caller, sends notifications/cancelled for its request
// before its session closes, and the server's handler sees its context
// end.
func TestCancellationReachesTheServer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		code string
		end  func(cancel context.CancelFunc)
	}{
		{"deadline", CodeDeadlineExceeded, nil},
		{"caller cancels", CodeCancelled, func(cancel context.CancelFunc) { time.Sleep(300 * time.Millisecond); cancel() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			started := make(chan struct{}, 1)
			stopped := make(chan struct{}, 1)
			srv := mcp.NewServer(&mcp.Implementation{Name: "slow", Version: "1"}, nil)
			mcp.AddTool(srv, &mcp.Tool{Name: "wait"}, func(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
				started <- struct{}{}
				select {
				case <-ctx.Done():
					stopped <- struct{}{}
					return nil, nil, ctx.Err()
				case <-time.After(time.Minute):
					return &mcp.CallToolResult{}, nil, nil
				}
			})
			s := newSDKServer(t, srv, false, nil)
			e := newEnv(t)
			conn := e.httpConn(s.URL)
			var (
				ctx    context.Context
				cancel context.CancelFunc
			)
			if tc.end == nil {
				ctx, cancel = context.WithTimeout(context.Background(), 500*time.Millisecond)
			} else {
				ctx, cancel = context.WithCancel(context.Background())
				go func() {
					<-started
					tc.end(cancel)
				}()
			}
			defer cancel()
			resp, err := e.srv.Execute(ctx, granted(t, call(t, conn, "wait", map[string]any{}, nil)))
			if err != nil {
				t.Fatal(err)
			}
			wantFailure(t, resp, adapterv1.Outcome_OUTCOME_UNKNOWN, tc.code)
			select {
			case id := <-s.cancelled:
				if id == "" {
					t.Errorf("notifications/cancelled named no request")
				}
			case <-time.After(20 * time.Second):
				t.Fatal("no notifications/cancelled reached the server")
			}
			select {
			case <-stopped:
			case <-time.After(20 * time.Second):
				t.Fatal("the server's handler never saw its call cancelled")
			}
		})
	}
}

// TestProgressIsEvidence: a call carries a progress token; the progress
// notifications the server sends for it are kept in the call's protocol
// trace, the first maxProgressNotes in order with their messages
// truncated, and all of them counted.
func TestProgressIsEvidence(t *testing.T) {
	t.Parallel()
	const sent = maxProgressNotes + 4
	long := strings.Repeat("é", maxProgressMessageBytes)
	var token atomic.Value
	srv := mcp.NewServer(&mcp.Implementation{Name: "progress", Version: "1"}, nil)
	mcp.AddTool(srv, &mcp.Tool{Name: "work"}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		tok := req.Params.GetProgressToken()
		token.Store(tok)
		for i := 1; i <= sent; i++ {
			msg := "step"
			if i == 1 {
				msg = long
			}
			if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: float64(i), Total: sent, Message: msg}); err != nil {
				return nil, nil, err
			}
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "worked"}}}, nil, nil
	})
	s := newSDKServer(t, srv, false, nil)
	e := newEnv(t)
	conn := e.httpConn(s.URL)
	req := call(t, conn, "work", map[string]any{}, nil)
	req.TaskId = "task_progress"
	if r := execute(t, e, req); r.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
		t.Fatalf("call: %v", r.GetError())
	}
	if tok, _ := token.Load().(string); tok == "" {
		t.Fatalf("the call carried no progress token (got %v)", token.Load())
	}
	e.evidence.mu.Lock()
	defer e.evidence.mu.Unlock()
	if len(e.evidence.events) != 1 {
		t.Fatalf("%d trace events, want 1", len(e.evidence.events))
	}
	ev := e.evidence.events[0].GetProtocol()
	if ev.GetProgressNotifications() != sent {
		t.Errorf("progress_notifications %d, want %d", ev.GetProgressNotifications(), sent)
	}
	if len(ev.GetProgress()) != maxProgressNotes {
		t.Fatalf("%d progress notes kept, want %d", len(ev.GetProgress()), maxProgressNotes)
	}
	for i, p := range ev.GetProgress() {
		if p.GetProgress() != float64(i+1) || p.GetTotal() != sent || p.GetTime() == nil {
			t.Errorf("note %d: %v", i, p)
		}
	}
	if m := ev.GetProgress()[0].GetUntrustedMessage(); len(m) > maxProgressMessageBytes || !strings.HasPrefix(long, m) || m == "" {
		t.Errorf("first message: %d bytes, want a prefix of at most %d", len(m), maxProgressMessageBytes)
	}
}

// TestParamHeadersSent: on a 2026-07-28 session, a call to a tool whose
// input schema declares x-mcp-header carries the argument as an
// Mcp-Param header; on an older session nothing is listed for it.
func TestParamHeadersSent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		legacy bool
		want   string
	}{
		{"2026-07-28", false, "eu-west1"},
		{"2025-11-25", true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := mcp.NewServer(&mcp.Implementation{Name: "headers", Version: "1"}, nil)
			srv.AddTool(&mcp.Tool{Name: "route", InputSchema: json.RawMessage(`{"type":"object","properties":{"region":{"type":"string","x-mcp-header":"Region"}}}`)},
				func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
					return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "routed"}}}, nil
				})
			var (
				mu     sync.Mutex
				region []string
				lists  int
			)
			// A stateless go-sdk server speaks 2026-07-28.
			h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{Stateless: !tc.legacy})
			front := newSDKServer(t, srv, tc.legacy, nil)
			front.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				r.Body = io.NopCloser(bytes.NewReader(body))
				mu.Lock()
				if strings.Contains(string(body), `"tools/call"`) {
					region = append(region, r.Header.Get("Mcp-Param-Region"))
				}
				if strings.Contains(string(body), `"tools/list"`) {
					lists++
				}
				mu.Unlock()
				var msg struct {
					ID json.RawMessage `json:"id"`
				}
				if tc.legacy && strings.Contains(string(body), `"server/discover"`) && json.Unmarshal(body, &msg) == nil {
					w.Header().Set("Content-Type", "application/json")
					_, _ = w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(msg.ID) + `,"error":{"code":-32601,"message":"Method not found"}}`))
					return
				}
				h.ServeHTTP(w, r)
			})
			e := newEnv(t)
			conn := e.httpConn(front.URL)
			for range 2 {
				if got := textOf(t, execute(t, e, call(t, conn, "route", map[string]any{"region": "eu-west1"}, nil))); got != "routed" {
					t.Fatalf("text %q", got)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if len(region) != 2 || region[0] != tc.want || region[1] != tc.want {
				t.Errorf("Mcp-Param-Region of the calls: %q, want %q each", region, tc.want)
			}
			if want := map[bool]int{false: 1, true: 0}[tc.legacy]; lists != want {
				t.Errorf("%d tools/list requests for two calls on one session, want %d", lists, want)
			}
		})
	}
}

// TestNoisyStdoutTolerated: a local server that prints non-JSON lines on
// stdout before speaking JSON-RPC (a banner, a long log line) is
// discovered and called; the lines are dropped and logged, only the
// first stdionoise.MaxLogged of them and each cut to stdionoise.MaxLogText bytes.
func TestNoisyStdoutTolerated(t *testing.T) {
	t.Parallel()
	var logs testkit.SyncBuffer
	e := newEnvLog(t, slog.New(slog.NewJSONHandler(&logs, nil)))
	conn := e.stdioConn("--banner", "9")
	if _, err := e.srv.Discover(testkit.AsService(context.Background(), identity.Operator), &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()}); err != nil {
		t.Fatalf("discover a noisy server: %v", err)
	}
	if r := execute(t, e, call(t, conn, "search", map[string]any{"query": "migration"}, nil)); r.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
		t.Fatalf("call a noisy server: %v", r.GetError())
	}
	// Two sessions (discovery, then the call's), each logging its first
	// lines and then one notice.
	var dropped, quiet int
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var rec struct {
			Msg  string `json:"msg"`
			Line string `json:"line"`
		}
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		switch {
		case strings.Contains(rec.Msg, "non-JSON line on stdout; dropped"):
			dropped++
			if len(rec.Line) > stdionoise.MaxLogText || !strings.HasPrefix(rec.Line, "fixture banner line") {
				t.Errorf("logged line %q (%d bytes): want the line, cut to %d bytes", rec.Line[:min(len(rec.Line), 60)], len(rec.Line), stdionoise.MaxLogText)
			}
		case strings.Contains(rec.Msg, "keeps printing non-JSON lines"):
			quiet++
		}
	}
	if dropped != 2*stdionoise.MaxLogged || quiet != 2 {
		t.Errorf("%d dropped lines logged and %d notices, want %d and 2", dropped, quiet, 2*stdionoise.MaxLogged)
	}
}

// TestCancellationReachesAStdioServer: over stdio too, a call its caller
// gives up tells the server (notifications/cancelled reaches the
// fixture's call log, after the call) before the session's process is
// stopped: the server's stdout stays open until it has exited, so it is
// not killed answering the cancelled call before it handled the notice.
// The call is cancelled once the server has logged it, not at a deadline
// a loaded machine might pass before the call is even sent.
func TestCancellationReachesAStdioServer(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	conn, log := e.loggedConn(t)
	logged := func(method string) bool {
		b, _ := os.ReadFile(log)
		return strings.Contains(string(b), `"method":"`+method+`"`)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		resp *adapterv1.ExecuteResponse
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := e.srv.Execute(ctx, granted(t, call(t, conn, "slow", map[string]any{"ms": 10 * 60 * 1000}, nil)))
		done <- result{resp, err}
	}()
	testkit.Eventually(t, "the stdio server receives the call", func() bool { return logged("tools/call") })
	cancel()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	wantFailure(t, r.resp, adapterv1.Outcome_OUTCOME_UNKNOWN, CodeCancelled)
	testkit.Eventually(t, "notifications/cancelled reaches the stdio server", func() bool { return logged("notifications/cancelled") })
}

// TestElicitationAcceptDefaults: under a mapping with
// ELICITATION_POLICY_ACCEPT_DEFAULTS, a server's form elicitation whose
// every required field has a default is accepted with exactly the
// schema's defaults, and the protocol trace records the fields answered
// with digests, not values. A required field without a default, or a
// mapping without the policy, still ends the call as USER_INPUT_REQUIRED
// with "decline" sent.
func TestElicitationAcceptDefaults(t *testing.T) {
	t.Parallel()
	const secret = "s3cr3t-default-token"
	withDefaults := map[string]any{"type": "object", "properties": map[string]any{
		"name":  map[string]any{"type": "string", "default": "John Doe"},
		"age":   map[string]any{"type": "integer", "default": 30},
		"token": map[string]any{"type": "string", "default": secret},
		"note":  map[string]any{"type": "string"},
	}, "required": []any{"name", "age"}}
	missing := map[string]any{"type": "object", "properties": map[string]any{
		"name":    map[string]any{"type": "string", "default": "John Doe"},
		"account": map[string]any{"type": "string"},
	}, "required": []any{"name", "account"}}
	accept := registryv1.ElicitationPolicy_ELICITATION_POLICY_ACCEPT_DEFAULTS
	for _, tc := range []struct {
		name       string
		policy     registryv1.ElicitationPolicy
		schema     map[string]any
		wantAction string
	}{
		{name: "defaults accepted", policy: accept, schema: withDefaults, wantAction: "accept"},
		{name: "required field without default", policy: accept, schema: missing, wantAction: "decline"},
		{name: "policy not set", schema: withDefaults, wantAction: "decline"},
		{name: "decline policy", policy: registryv1.ElicitationPolicy_ELICITATION_POLICY_DECLINE, schema: withDefaults, wantAction: "decline"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var (
				mu    sync.Mutex
				heard []*mcp.ElicitResult
			)
			srv := mcp.NewServer(&mcp.Implementation{Name: "asks", Version: "1"}, nil)
			mcp.AddTool(srv, &mcp.Tool{Name: "register"}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
				res, err := req.Session.Elicit(ctx, &mcp.ElicitParams{Message: "Confirm the registration", RequestedSchema: tc.schema})
				if err != nil {
					return nil, nil, err
				}
				mu.Lock()
				heard = append(heard, res)
				mu.Unlock()
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "registered: " + res.Action}}}, nil, nil
			})
			s := newSDKServer(t, srv, true, nil)
			e := newEnv(t)
			conn := e.httpConn(s.URL)
			req := call(t, conn, "register", map[string]any{}, &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 10, Elicitation: tc.policy})
			req.TaskId = "task_elicit"
			resp := execute(t, e, req)
			mu.Lock()
			defer mu.Unlock()
			if len(heard) != 1 || heard[0].Action != tc.wantAction {
				t.Fatalf("the server heard %+v, want one %q", heard, tc.wantAction)
			}
			e.evidence.mu.Lock()
			defer e.evidence.mu.Unlock()
			if len(e.evidence.events) != 1 {
				t.Fatalf("%d trace events, want 1", len(e.evidence.events))
			}
			answers := e.evidence.events[0].GetProtocol().GetElicitationAnswers()
			if tc.wantAction != "accept" {
				wantFailure(t, resp, adapterv1.Outcome_OUTCOME_INVALID_REQUEST, CodeUserInputRequired)
				if len(answers) != 0 || heard[0].Content != nil {
					t.Errorf("declined, yet answered %v (trace %v)", heard[0].Content, answers)
				}
				return
			}
			if resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
				t.Fatalf("outcome %v %v, want OK", resp.GetOutcome(), resp.GetError())
			}
			want := map[string]any{"name": "John Doe", "age": float64(30), "token": secret}
			if got := heard[0].Content; len(got) != len(want) || got["name"] != want["name"] || got["age"] != want["age"] || got["token"] != want["token"] {
				t.Errorf("answered %v, want exactly the defaults %v", got, want)
			}
			if len(answers) != 1 || len(answers[0].GetFields()) != 3 {
				t.Fatalf("trace answers %v, want one with 3 fields", answers)
			}
			for i, name := range []string{"age", "name", "token"} {
				f := answers[0].GetFields()[i]
				d, _ := digest.JSON(want[name])
				if f.GetName() != name || f.GetValueDigest() != d {
					t.Errorf("trace field %d = %v, want %s with the digest of its value", i, f, name)
				}
			}
			if b, _ := protojson.Marshal(e.evidence.events[0]); strings.Contains(string(b), secret) {
				t.Errorf("the trace holds an answered value: %s", b)
			}
		})
	}
}

// TestDefaultsAnswerRefuses: no answer is made up for a request that is
// not a form with defaults for every required field.
func TestDefaultsAnswerRefuses(t *testing.T) {
	t.Parallel()
	named := map[string]any{"type": "object", "properties": map[string]any{"name": map[string]any{"type": "string", "default": "x"}}}
	for name, p := range map[string]*mcp.ElicitParams{
		"url mode":        {Mode: "url", URL: "https://example.com/consent", RequestedSchema: named},
		"no defaults":     {RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{"name": map[string]any{"type": "string"}}}},
		"no schema":       {},
		"required absent": {RequestedSchema: map[string]any{"type": "object", "properties": named["properties"], "required": []any{"name", "other"}}},
	} {
		if content, _, ok := defaultsAnswer(p, strings.Clone); ok {
			t.Errorf("%s: answered %v", name, content)
		}
	}
	if content, _, ok := defaultsAnswer(&mcp.ElicitParams{Mode: "form", RequestedSchema: named}, strings.Clone); !ok || content["name"] != "x" {
		t.Errorf("a form with a default: %v, %v", content, ok)
	}
}
