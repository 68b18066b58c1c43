package bridge_test

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/v0m3/v0m3/operator/bridge"
	"github.com/v0m3/v0m3/services/fixture"
)

// The test binary doubles as the stdio fixture server: the bridge runs it
// as a real child process with V0M3_BRIDGE_TEST_CHILD set.
func TestMain(m *testing.M) {
	if os.Getenv("V0M3_BRIDGE_TEST_CHILD") == "1" {
		s, err := fixture.NewServer(fixture.Options{})
		if err != nil {
			os.Exit(3)
		}
		if err := s.Run(context.Background(), &mcp.StdioTransport{}); err != nil {
			os.Exit(4)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func newBridge(t *testing.T, maxSessions int) *httptest.Server {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := bridge.New(bridge.Options{
		Command:     []string{self},
		Env:         []string{"V0M3_BRIDGE_TEST_CHILD=1"},
		MaxSessions: maxSessions,
		Stderr:      os.Stderr,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(b)
	t.Cleanup(func() { srv.Close(); b.Close() })
	return srv
}

func connect(t *testing.T, url string) (*mcp.ClientSession, error) {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "bridge-test", Version: "1"}, nil)
	return c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url}, nil)
}

// A streamable HTTP client reaches the stdio fixture server through the
// bridge: it initializes, lists the server's tools and calls one, and the
// answers are the server's own.
func TestBridgeRelaysToStdioServer(t *testing.T) {
	t.Parallel()
	srv := newBridge(t, 4)
	ctx := context.Background()
	cs, err := connect(t, srv.URL)
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
}

// Each session gets its own child, and the bridge refuses sessions beyond
// its bound instead of starting unbounded processes.
func TestBridgeBoundsSessions(t *testing.T) {
	t.Parallel()
	srv := newBridge(t, 1)
	first, err := connect(t, srv.URL)
	if err != nil {
		t.Fatalf("first session: %v", err)
	}
	if _, err := connect(t, srv.URL); err == nil {
		t.Fatalf("second session connected; want it refused at the bound of 1")
	}
	first.Close()
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
