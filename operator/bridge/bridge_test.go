package bridge_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/v0m3/v0m3/demo/fixture"
	"github.com/v0m3/v0m3/internal/testkit"
	"github.com/v0m3/v0m3/operator/bridge"
)

// The test binary doubles as the stdio fixture server: the bridge runs it
// as a real child process with V0M3_BRIDGE_TEST_CHILD set. With
// V0M3_BRIDGE_TEST_BANNER set it first prints a banner line on stdout, as
// some community servers do.
func TestMain(m *testing.M) {
	if os.Getenv("V0M3_BRIDGE_TEST_CHILD") == "1" {
		if os.Getenv("V0M3_BRIDGE_TEST_BANNER") == "1" {
			fmt.Println("Time MCP Server running on stdio")
		}
		s, err := fixture.NewServer(fixture.Options{})
		if err != nil {
			os.Exit(3)
		}
		// hold answers only when its call is cancelled, having first
		// created V0M3_BRIDGE_TEST_HOLD (so a test knows the call is in
		// progress); it creates the same name plus ".cancelled" when the
		// cancellation arrives.
		if marker := os.Getenv("V0M3_BRIDGE_TEST_HOLD"); marker != "" {
			mcp.AddTool(s, &mcp.Tool{Name: "hold"}, func(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
				if err := os.WriteFile(marker, nil, 0o600); err != nil {
					return nil, nil, err
				}
				<-ctx.Done()
				_ = os.WriteFile(marker+".cancelled", nil, 0o600)
				return nil, nil, ctx.Err()
			})
		}
		if err := s.Run(context.Background(), &mcp.StdioTransport{}); err != nil {
			os.Exit(4)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// testBridge is a bridge whose children carry a tag in their command
// line, so a test counts exactly its own children among the processes of
// this (parallel) test binary.
type testBridge struct {
	*bridge.Bridge
	srv *httptest.Server
	tag string
}

func newBridge(t *testing.T, opts bridge.Options, env ...string) *testBridge {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	tag := "bridge-test-child-" + strings.ReplaceAll(t.Name(), "/", "-")
	opts.Command = []string{self, tag}
	opts.Env = append([]string{"V0M3_BRIDGE_TEST_CHILD=1"}, env...)
	opts.Stderr = os.Stderr
	b, err := bridge.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(b)
	t.Cleanup(func() {
		srv.Close()
		b.Close()
		if n := children(t, tag); n != 0 {
			t.Errorf("%d child processes left after Close; want 0", n)
		}
	})
	return &testBridge{Bridge: b, srv: srv, tag: tag}
}

// children counts the child processes of this process whose command line
// carries tag, from /proc. (An exited child not yet waited for has an
// empty command line; Close waits for every child, so none outlives it.)
func children(t *testing.T, tag string) int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Skipf("no /proc to count processes: %v", err)
	}
	self := strconv.Itoa(os.Getpid())
	n := 0
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid ...: comm may hold spaces, so split after ')'.
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(fields) < 2 || fields[1] != self {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if bytes.Contains(cmdline, []byte(tag)) {
			n++
		}
	}
	return n
}

// client is a go-sdk client whose network can be cut, as when a laptop
// leaves or a pod dies: after cut, nothing it sends arrives (not even the
// DELETE that Close sends).
type client struct {
	down atomic.Bool
	http *http.Client
}

func newClient() *client {
	c := &client{}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	dial := tr.DialContext
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if c.down.Load() {
			return nil, errors.New("network is down")
		}
		return dial(ctx, network, addr)
	}
	c.http = &http.Client{Transport: tr}
	return c
}

func (c *client) connect(ctx context.Context, url string) (*mcp.ClientSession, error) {
	mc := mcp.NewClient(&mcp.Implementation{Name: "bridge-test", Version: "1"}, nil)
	return mc.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: c.http, MaxRetries: -1}, nil)
}

func connect(t *testing.T, url string) (*mcp.ClientSession, error) {
	t.Helper()
	return newClient().connect(context.Background(), url)
}

// A streamable HTTP client reaches the stdio fixture server through the
// bridge: it initializes, lists the server's tools and calls one, and the
// answers are the server's own.
func TestBridgeRelaysToStdioServer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		env  []string
	}{
		{"plain", nil},
		// A server that prints a banner on stdout before speaking
		// JSON-RPC (e.g. npm time-mcp) still works: the line is dropped.
		{"banner", []string{"V0M3_BRIDGE_TEST_BANNER=1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := newBridge(t, bridge.Options{MaxSessions: 4}, tc.env...)
			ctx := context.Background()
			cs, err := connect(t, b.srv.URL)
			if err != nil {
				t.Fatalf("connect through the bridge: %v", err)
			}
			defer cs.Close()
			if info := cs.InitializeResult().ServerInfo; info == nil || info.Name == "" {
				t.Fatalf("server info = %+v; want the fixture's", info)
			}
			tools, err := cs.ListTools(ctx, nil)
			if err != nil {
				t.Fatalf("ListTools: %v", err)
			}
			found := false
			for _, tool := range tools.Tools {
				found = found || tool.Name == "search"
			}
			if !found {
				t.Fatalf("tools = %v; want the fixture's search tool", tools.Tools)
			}
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "search", Arguments: map[string]any{"query": "rate limit"}})
			if err != nil {
				t.Fatalf("CallTool: %v", err)
			}
			if res.IsError || len(res.Content) == 0 {
				t.Errorf("search result = %+v; want content", res)
			}
		})
	}
}

// Each session gets its own child, and sessions are bounded: at the bound
// a new session is refused with a JSON-RPC error while every session has a
// call in progress, and otherwise takes the place of an idle one (whose
// child stops; its client gets 404 and may initialize again), instead of
// starting unbounded processes or locking new clients out.
func TestBridgeBoundsSessions(t *testing.T) {
	t.Parallel()
	marker := filepath.Join(t.TempDir(), "hold-started")
	b := newBridge(t, bridge.Options{MaxSessions: 1}, "V0M3_BRIDGE_TEST_HOLD="+marker)
	ctx := context.Background()
	first, err := connect(t, b.srv.URL)
	if err != nil {
		t.Fatalf("first session: %v", err)
	}
	defer first.Close()
	callCtx, cancelCall := context.WithCancel(ctx)
	called := make(chan error, 1)
	go func() {
		_, err := first.CallTool(callCtx, &mcp.CallToolParams{Name: "hold", Arguments: map[string]any{}})
		called <- err
	}()
	testkit.EventuallyWithin(t, 2*time.Minute, "the first session's call reaches its server", func() bool {
		_, err := os.Stat(marker)
		return err == nil
	})
	if _, err := connect(t, b.srv.URL); err == nil {
		t.Fatalf("second session connected while the first had a call in progress; want it refused at the bound of 1")
	}
	resp, body := post(t, b.srv.URL, nil, initialize(2))
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("initialize over the bound: HTTP %d; want 503", resp.StatusCode)
	}
	if e := rpcError(t, resp, body); e.ID != "2" || !strings.Contains(e.Message, "too many sessions") {
		t.Errorf("error = %+v; want id 2 and 'too many sessions'", e)
	}
	if n := children(t, b.tag); n != 1 {
		t.Errorf("%d children; want 1", n)
	}
	// Once its call is over the first session is idle (its client still
	// holds its GET stream open), and a new client takes its place: one
	// child still, the new client's.
	// The client gives up on its call (a deadline, a cancellation): the
	// server hears of it through the bridge and stops working on it.
	cancelCall()
	<-called
	testkit.EventuallyWithin(t, 2*time.Minute, "the call's cancellation reaches the server", func() bool {
		_, err := os.Stat(marker + ".cancelled")
		return err == nil
	})
	second, err := connect(t, b.srv.URL)
	if err != nil {
		t.Fatalf("a session at the bound with the other idle: %v", err)
	}
	defer second.Close()
	if _, err := second.ListTools(ctx, nil); err != nil {
		t.Fatalf("ListTools in the new session: %v", err)
	}
	if err := first.Ping(ctx, nil); err == nil {
		t.Errorf("the evicted session still answers; want it gone (404)")
	}
	testkit.EventuallyWithin(t, 2*time.Minute, "the evicted session's child exits", func() bool { return children(t, b.tag) == 1 })
}

// Clients that vanish without DELETE leak nothing: their sessions expire
// once idle, their children exit, and the places they held take new
// sessions. Before, 16 such clients left a bridge answering 503 forever.
func TestBridgeReapsAbandonedSessions(t *testing.T) {
	t.Parallel()
	const limit = 16
	b := newBridge(t, bridge.Options{MaxSessions: limit, IdleTimeout: 300 * time.Millisecond})
	ctx := context.Background()
	for round := range 2 {
		// limit clients, each in its own session with its own child, each
		// holding a standalone SSE stream open as the go-sdk client does.
		var clients []*client
		for i := range limit {
			c := newClient()
			cs, err := c.connect(ctx, b.srv.URL)
			if err != nil {
				t.Fatalf("round %d: session %d refused: %v", round, i, err)
			}
			if _, err := cs.ListTools(ctx, nil); err != nil {
				t.Fatalf("round %d: session %d: ListTools: %v", round, i, err)
			}
			clients = append(clients, c)
			t.Cleanup(func() { cs.Close() })
		}
		if n := children(t, b.tag); n != limit {
			t.Fatalf("round %d: %d children; want %d, one per session", round, n, limit)
		}
		// Every client vanishes: its network goes down and its
		// connections drop. None sends DELETE.
		for _, c := range clients {
			c.down.Store(true)
		}
		b.srv.CloseClientConnections()
		testkit.EventuallyWithin(t, 2*time.Minute, "abandoned sessions expire and their children exit", func() bool {
			return b.Sessions() == 0 && children(t, b.tag) == 0
		})
	}
	// 32 sessions were abandoned; the bridge still takes new ones.
	cs, err := connect(t, b.srv.URL)
	if err != nil {
		t.Fatalf("a new session after the abandoned ones expired: %v", err)
	}
	if _, err := cs.ListTools(ctx, nil); err != nil {
		t.Fatalf("ListTools in the new session: %v", err)
	}
	cs.Close()
}

// A request naming another site in Host or Origin (a DNS rebinding page in
// a browser) is refused with 403 and a JSON-RPC error, and starts no
// child; requests naming loopback or a configured host are served.
func TestBridgeRefusesForeignHostAndOrigin(t *testing.T) {
	t.Parallel()
	b := newBridge(t, bridge.Options{AllowedHosts: []string{"search.tools.svc.cluster.local"}})
	port := b.srv.Listener.Addr().(*net.TCPAddr).Port
	for _, tc := range []struct {
		name   string
		header http.Header
		ok     bool
	}{
		{"foreign host", http.Header{"Host": {"evil.example.com"}}, false},
		{"foreign host with the bridge's port", http.Header{"Host": {fmt.Sprintf("evil.example.com:%d", port)}}, false},
		{"foreign origin", http.Header{"Origin": {"http://evil.example.com"}}, false},
		{"foreign origin on the bridge's port", http.Header{"Origin": {fmt.Sprintf("http://evil.example.com:%d", port)}}, false},
		{"opaque origin", http.Header{"Origin": {"null"}}, false},
		{"allowed host, foreign origin", http.Header{"Host": {"search.tools.svc.cluster.local:8080"}, "Origin": {"https://evil.example.com"}}, false},
		{"loopback", nil, true},
		{"localhost with origin", http.Header{"Host": {fmt.Sprintf("localhost:%d", port)}, "Origin": {fmt.Sprintf("http://localhost:%d", port)}}, true},
		{"configured host", http.Header{"Host": {"search.tools.svc.cluster.local:8080"}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Not parallel: each case counts the bridge's children.
			resp, body := post(t, b.srv.URL, tc.header, initialize(1))
			sid := resp.Header.Get("Mcp-Session-Id")
			if !tc.ok {
				if resp.StatusCode != http.StatusForbidden {
					t.Errorf("HTTP %d; want 403", resp.StatusCode)
				}
				if e := rpcError(t, resp, body); !strings.Contains(e.Message, "not allowed") {
					t.Errorf("error = %+v; want 'not allowed'", e)
				}
				if sid != "" || b.Sessions() != 0 || children(t, b.tag) != 0 {
					t.Errorf("session %q, %d sessions, %d children; want none started", sid, b.Sessions(), children(t, b.tag))
				}
				return
			}
			if resp.StatusCode != http.StatusOK || sid == "" {
				t.Fatalf("HTTP %d, session %q: %s; want a session", resp.StatusCode, sid, body)
			}
			del(t, b.srv.URL, sid)
			testkit.EventuallyWithin(t, 2*time.Minute, "the deleted session's child exits", func() bool { return children(t, b.tag) == 0 })
		})
	}
}

// Whatever the bridge refuses, the client gets a JSON-RPC error object (with
// the request's id when it could be read), not a plain-text body; a
// stateless (2026-07-28) probe is told which versions the bridge serves, and
// none of these starts a child.
func TestBridgeAnswersJSONRPCErrors(t *testing.T) {
	t.Parallel()
	b := newBridge(t, bridge.Options{})
	discover := `{"jsonrpc":"2.0","id":7,"method":"server/discover","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}`
	for _, tc := range []struct {
		name    string
		method  string
		header  http.Header
		body    string
		status  int
		code    int64
		id      string
		message string
	}{
		{"stateless discover", http.MethodPost, http.Header{"Mcp-Protocol-Version": {"2026-07-28"}, "Mcp-Method": {"server/discover"}}, discover, 400, mcp.CodeUnsupportedProtocolVersion, "7", "2026-07-28"},
		{"stateless discover, version only in _meta", http.MethodPost, nil, discover, 400, mcp.CodeUnsupportedProtocolVersion, "7", "2026-07-28"},
		{"request without session", http.MethodPost, nil, `{"jsonrpc":"2.0","id":"a","method":"tools/list"}`, 400, -32600, `"a"`, "initialize"},
		{"not JSON", http.MethodPost, nil, `hello`, 400, -32700, "null", "Parse error"},
		{"unknown session", http.MethodPost, http.Header{"Mcp-Session-Id": {"NOSUCHSESSION"}}, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, 404, -32600, "null", "session not found"},
		{"GET without session", http.MethodGet, nil, "", 400, -32600, "null", "Mcp-Session-Id"},
		{"DELETE of an unknown session", http.MethodDelete, http.Header{"Mcp-Session-Id": {"NOSUCHSESSION"}}, "", 404, -32600, "null", "session not found"},
		{"PUT", http.MethodPut, nil, "{}", 405, -32600, "null", "method not allowed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			resp, body := do(t, tc.method, b.srv.URL, tc.header, tc.body)
			if resp.StatusCode != tc.status {
				t.Errorf("HTTP %d; want %d", resp.StatusCode, tc.status)
			}
			e := rpcError(t, resp, body)
			if e.Code != tc.code || e.ID != tc.id || !strings.Contains(e.Message, tc.message) {
				t.Errorf("error = %+v; want code %d, id %s, message containing %q", e, tc.code, tc.id, tc.message)
			}
			if tc.code == mcp.CodeUnsupportedProtocolVersion {
				var data mcp.UnsupportedProtocolVersionData
				if err := json.Unmarshal(e.Data, &data); err != nil || data.Requested != "2026-07-28" || len(data.Supported) == 0 || data.Supported[0] != "2025-11-25" {
					t.Errorf("data = %s (%v); want the stateful versions the bridge serves", e.Data, err)
				}
			}
		})
	}
	t.Run("transport errors in a session", func(t *testing.T) {
		t.Parallel()
		// The go-sdk transport's own refusals come through as JSON-RPC too.
		resp, body := post(t, b.srv.URL, nil, initialize(1))
		sid := resp.Header.Get("Mcp-Session-Id")
		if sid == "" {
			t.Fatalf("initialize: HTTP %d %s", resp.StatusCode, body)
		}
		defer del(t, b.srv.URL, sid)
		resp, body = do(t, http.MethodPost, b.srv.URL, http.Header{"Mcp-Session-Id": {sid}}, "not json")
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("HTTP %d; want 400", resp.StatusCode)
		}
		if e := rpcError(t, resp, body); e.Code != -32600 || e.Message == "" {
			t.Errorf("error = %+v; want a JSON-RPC error with the transport's reason", e)
		}
	})
	// Only the one session above ever started a child.
	if n := children(t, b.tag); n > 1 {
		t.Errorf("%d children; refused requests must start none", n)
	}
}

// A client that starts a POST and never finishes its body is cut off
// (after BodyTimeout) with a JSON-RPC error, and starts no child.
func TestBridgeCutsOffSlowBodies(t *testing.T) {
	t.Parallel()
	b := newBridge(t, bridge.Options{BodyTimeout: 100 * time.Millisecond})
	conn, err := net.Dial("tcp", b.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := initialize(1)
	// The headers promise the whole body; only its first half is sent.
	fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: %d\r\n\r\n%s",
		b.srv.Listener.Addr(), len(body), body[:len(body)/2])
	// Reading ends when the bridge answers and closes: no timed assertion,
	// the test's own deadline bounds it.
	answer, err := io.ReadAll(conn)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if !bytes.HasPrefix(answer, []byte("HTTP/1.1 408")) || !bytes.Contains(answer, []byte(`"error"`)) {
		t.Errorf("answer %q; want 408 with a JSON-RPC error", answer)
	}
	if n, sessions := children(t, b.tag), b.Sessions(); n != 0 || sessions != 0 {
		t.Errorf("%d children, %d sessions; want none", n, sessions)
	}
}

func initialize(id int) string {
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`, id)
}

func post(t *testing.T, url string, h http.Header, body string) (*http.Response, []byte) {
	t.Helper()
	return do(t, http.MethodPost, url, h, body)
}

func del(t *testing.T, url, sid string) {
	t.Helper()
	resp, body := do(t, http.MethodDelete, url, http.Header{"Mcp-Session-Id": {sid}}, "")
	if resp.StatusCode != http.StatusNoContent {
		t.Errorf("DELETE: HTTP %d %s; want 204", resp.StatusCode, body)
	}
}

// do sends one raw HTTP request, as a browser or a hand-written client
// would, and reads the answer (for an SSE answer, up to its first event).
func do(t *testing.T, method, url string, h http.Header, body string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range h {
		if k == "Host" {
			req.Host = v[0]
			continue
		}
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	defer resp.Body.Close()
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		data, err := readEvent(resp.Body)
		if err != nil {
			t.Fatalf("read SSE answer: %v", err)
		}
		return resp, data
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		t.Fatal(err)
	}
	return resp, data
}

// readEvent reads the data of the first SSE event.
func readEvent(r io.Reader) ([]byte, error) {
	var data []byte
	buf := make([]byte, 4096)
	var all []byte
	for {
		n, err := r.Read(buf)
		all = append(all, buf[:n]...)
		for _, line := range strings.Split(string(all), "\n") {
			if d, ok := strings.CutPrefix(line, "data: "); ok {
				data = []byte(d)
			}
		}
		if data != nil && bytes.Contains(all, []byte("\n\n")) {
			return data, nil
		}
		if err != nil {
			return data, err
		}
	}
}

type wireError struct {
	ID      string
	Code    int64
	Message string
	Data    json.RawMessage
}

// rpcError checks that an answer is a JSON-RPC 2.0 error object served as
// JSON, and returns it.
func rpcError(t *testing.T, resp *http.Response, body []byte) wireError {
	t.Helper()
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q; want application/json (body %q)", ct, body)
	}
	var msg struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   *struct {
			Code    int64           `json:"code"`
			Message string          `json:"message"`
			Data    json.RawMessage `json:"data"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &msg); err != nil || msg.JSONRPC != "2.0" || msg.Error == nil {
		t.Fatalf("body %q is not a JSON-RPC error (%v)", body, err)
	}
	return wireError{ID: string(msg.ID), Code: msg.Error.Code, Message: msg.Error.Message, Data: msg.Error.Data}
}

// Install copies the running binary into a directory, executable.
func TestInstall(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	dst, err := bridge.Install(dir)
	if err != nil {
		t.Fatalf("Install: %v", err)
	}
	if dst != filepath.Join(dir, "v0m3") {
		t.Errorf("installed at %s", dst)
	}
	st, err := os.Stat(dst)
	if err != nil || st.Mode().Perm()&0o111 == 0 || st.Size() == 0 {
		t.Errorf("installed file %v, %v; want a non-empty executable", st, err)
	}
}
