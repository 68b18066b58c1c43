package adapter

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/v0m3/v0m3/demo/fixture"
	"github.com/v0m3/v0m3/internal/telemetry"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
)

// TestTraceContextReachesTheServer: a governed call's trace continues at
// the MCP server: W3C traceparent in the HTTP request of the tools/call
// (and in its _meta, which the end-to-end test checks over stdio). An
// untraced call sends none.
func TestTraceContextReachesTheServer(t *testing.T) {
	t.Parallel()
	s, err := fixture.NewServer(fixture.Options{Hostile: true})
	if err != nil {
		t.Fatal(err)
	}
	mcpHandler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("traceparent"))
		mu.Unlock()
		mcpHandler.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	e := newEnv(t)
	conn := e.httpConn(srv.URL)

	tp := sdktrace.NewTracerProvider()
	ctx, span := tp.Tracer("test").Start(context.Background(), "governed call")
	defer span.End()
	resp, err := e.srv.Execute(ctx, granted(t, call(t, conn, "search", map[string]any{"query": "migration"}, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
		t.Fatalf("outcome %v %v", resp.GetOutcome(), resp.GetError())
	}
	want := "00-" + span.SpanContext().TraceID().String() + "-"
	mu.Lock()
	traced := 0
	for _, h := range seen {
		if strings.HasPrefix(h, want) {
			traced++
		}
	}
	before := len(seen)
	mu.Unlock()
	if traced == 0 {
		t.Fatalf("no request to the server carried traceparent %s…; saw %q", want, seen)
	}

	resp, err = e.srv.Execute(context.Background(), granted(t, call(t, conn, "search", map[string]any{"query": "again"}, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
		t.Fatalf("outcome %v %v", resp.GetOutcome(), resp.GetError())
	}
	mu.Lock()
	defer mu.Unlock()
	for _, h := range seen[before:] {
		if h != "" {
			t.Errorf("an untraced call sent traceparent %q", h)
		}
	}
}

// TestLimitCodesCounted: every safe code of a limit refusal is one the
// metrics count as such.
func TestLimitCodesCounted(t *testing.T) {
	t.Parallel()
	for _, c := range []string{CodeResponseLimitExceeded, CodeItemLimitExceeded, CodeMediaTypeNotAllowed} {
		if !telemetry.LimitCodes[c] {
			t.Errorf("%s is not counted in v0m3_limit_refusals_total", c)
		}
	}
}
