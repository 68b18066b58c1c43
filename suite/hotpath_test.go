package suite_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/v0m3/v0m3/demo/fixture"
	"github.com/v0m3/v0m3/demo/scenario"
	"github.com/v0m3/v0m3/internal/redistest"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/policy"
	"github.com/v0m3/v0m3/suite"
)

// rpcCounter is a slog handler that counts what the services log: every
// internal RPC (the serve package logs each one at Debug as "rpc"), and
// every record at Info or above (what a default deployment prints).
type rpcCounter struct {
	mu      sync.Mutex
	methods map[string]int
	loud    []string
}

func newRPCCounter() *rpcCounter { return &rpcCounter{methods: map[string]int{}} }

func (c *rpcCounter) Enabled(context.Context, slog.Level) bool { return true }
func (c *rpcCounter) WithAttrs([]slog.Attr) slog.Handler       { return c }
func (c *rpcCounter) WithGroup(string) slog.Handler            { return c }
func (c *rpcCounter) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.Message == "rpc" {
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "method" {
				m := a.Value.String()
				c.methods[m[strings.LastIndex(m, "/")+1:]]++
			}
			return true
		})
	}
	if r.Level >= slog.LevelInfo {
		c.loud = append(c.loud, r.Message)
	}
	return nil
}

// reset returns what was counted since the last reset and starts again.
func (c *rpcCounter) reset() (map[string]int, []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m, l := c.methods, c.loud
	c.methods, c.loud = map[string]int{}, nil
	return m, l
}

// governed is a suite with a reviewed retrieval mapping onto a real go-sdk
// MCP fixture over streamable HTTP, and one task offered it.
type governed struct {
	s      *suite.Suite
	ctx    context.Context // as the task's requester
	task   string
	handle string
	calls  atomic.Int64
}

// startGoverned starts the five services on store ("" for the file store)
// with log as their logger, and sets up a task that may call the fixture's
// search tool through a handle.
func startGoverned(tb testing.TB, store string, log *slog.Logger) *governed {
	tb.Helper()
	srv, err := fixture.NewServer(fixture.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	tb.Cleanup(hs.Close)
	// Budgets large enough for a benchmark's calls in one task.
	unlimited := policy.Limits{Calls: 1 << 40, ResponseBytes: 1 << 50, CostMicros: 1 << 50}
	s, err := suite.Start(context.Background(), suite.Config{DataDir: tb.TempDir(), Store: store, Log: log,
		TaskBudget: unlimited, RequesterBudget: unlimited})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Close)
	ctx := testkit.As(s, scenario.Integrator)
	conn, err := s.Connect(ctx, &registryv1.CreateConnectionRequest{
		DisplayName: "V0M3 Sources", Owner: "platform-team", Transport: scenario.HTTPFixture(hs.URL),
		CredentialScope: "read-only synthetic notes library; no credential",
	})
	if err != nil {
		tb.Fatal(err)
	}
	snap, err := s.Adapter.Discover(ctx, &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()})
	if err != nil {
		tb.Fatal(err)
	}
	m, err := s.Registry.ProposeMapping(ctx, &registryv1.ProposeMappingRequest{
		Capability: scenario.Retrieve, ConnectionId: conn.GetId(), SnapshotId: snap.GetId(),
		Target: &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: "search"},
		ArgumentMap: []*registryv1.ArgumentBinding{
			{RemoteField: "query", ProductField: "query"},
			{RemoteField: "uri", ProductField: "source", FromHandle: true},
		},
		Limits: &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 5, AllowedMediaTypes: []string{"text/markdown", "text/plain"}},
	})
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := s.Registry.ReviewMapping(testkit.As(s, scenario.Reviewer), &registryv1.ReviewMappingRequest{MappingId: m.GetId(), Revision: m.GetRevision(), Approve: true}); err != nil {
		tb.Fatal(err)
	}
	g := &governed{s: s, ctx: testkit.As(s, scenario.Alice)}
	started, err := s.Orchestrator.StartTask(g.ctx, &orchestratorv1.StartTaskRequest{
		Profile: "source_review", Purpose: "measure the governed call",
		SourceScope: []*orchestratorv1.SourceRef{{Uri: scenario.MigrationFAQURI, Title: "Migration FAQ"}},
	})
	if err != nil {
		tb.Fatal(err)
	}
	g.task = started.GetTask().GetId()
	g.handle = scenario.FindHandle(scenario.FindOffered(started.GetCatalogue(), scenario.Retrieve), "Migration FAQ")
	if g.handle == "" {
		tb.Fatal("no handle for the Migration FAQ")
	}
	return g
}

// call makes one governed call and checks it committed.
func (g *governed) call(tb testing.TB) {
	n := g.calls.Add(1)
	r, err := g.s.Orchestrator.SubmitToolRequest(g.ctx, &orchestratorv1.SubmitToolRequestRequest{
		TaskId: g.task, ProviderCallId: fmt.Sprintf("call-%d", n), Capability: scenario.Retrieve,
		Arguments: scenario.MustStruct(map[string]any{"source": g.handle, "query": "migration"}),
	})
	if err != nil {
		tb.Fatal(err)
	}
	if r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
		tb.Fatalf("request %s is %s, want executed", r.GetId(), r.GetState())
	}
}

// TestGovernedCallCost counts what one governed call costs inside the
// system: internal RPCs by method and log lines a default deployment
// prints. It fails when the hot path grows back (a trace event per round
// trip, a registry read per call, Info logs per call).
func TestGovernedCallCost(t *testing.T) {
	t.Parallel()
	counter := newRPCCounter()
	g := startGoverned(t, "", slog.New(counter))
	g.call(t) // the first call may warm caches
	counter.reset()
	calls := 3
	if n, err := strconv.Atoi(os.Getenv("V0M3_COST_CALLS")); err == nil && n > 0 {
		calls = n // e.g. to count fsyncs per call with strace at two counts
	}
	for range calls {
		g.call(t)
	}
	methods, loud := counter.reset()
	total := 0
	names := make([]string, 0, len(methods))
	for m, n := range methods {
		total += n
		names = append(names, m)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, m := range names {
		fmt.Fprintf(&b, "  %-28s %.1f\n", m, float64(methods[m])/float64(calls))
	}
	if len(loud) > 0 {
		t.Log("log lines at Info or above:", loud)
	}
	t.Logf("per governed call: %.1f internal RPCs, %.1f log lines at Info or above\n%s", float64(total)/float64(calls), float64(len(loud))/float64(calls), b.String())

	// What one call may cost at most: the trace written at the call's two
	// checkpoints (plus the adapter's protocol event), capability
	// contracts and mapping facts from caches, the evidentiary rule
	// applied in the orchestrator (evidence applies it again on record),
	// no Info line from the services whose hot path is quiet (the one left
	// is the adapter's).
	for _, tc := range []struct {
		what string
		got  int
		max  int
	}{
		{"internal RPCs", total, 9},
		// Handles, authorization and the call's charge: one Decide.
		{"Decide RPCs", methods["Decide"], 1},
		{"ResolveHandle RPCs", methods["ResolveHandle"], 0},
		{"Authorize RPCs", methods["Authorize"], 0},
		{"Charge RPCs (the response bytes, after the call)", methods["Charge"], 1},
		{"AppendTrace RPCs", methods["AppendTrace"], 1},
		{"AppendTraces RPCs", methods["AppendTraces"], 2},
		{"GetCapability RPCs", methods["GetCapability"], 0},
		// The one currency check reads the connection with the mapping.
		{"ResolveExecution RPCs (the one currency check, with the connection)", methods["ResolveExecution"], 1},
		{"ResolveMapping RPCs", methods["ResolveMapping"], 0},
		// The adapter uses its own earlier reading of the connection when
		// the orchestrator's (made in ResolveExecution) has its digest.
		{"GetConnection RPCs", methods["GetConnection"], 0},
		// A mapping's capability and connection never change: policy
		// keeps them.
		{"GetMapping RPCs", methods["GetMapping"], 0},
		// The orchestrator assesses each observation itself, then
		// records it.
		{"ValidateObservation RPCs", methods["ValidateObservation"], 0},
		{"log lines at Info or above", len(loud), 1},
	} {
		if tc.got > tc.max*calls {
			t.Errorf("%s: %d in %d calls, want at most %d per call", tc.what, tc.got, calls, tc.max)
		}
	}
	if methods["ResolveExecution"] < calls {
		t.Errorf("ResolveExecution: %d in %d calls; every call must check that its mapping is current", methods["ResolveExecution"], calls)
	}

	// What the call costs buys a complete trace: every call's protocol
	// event is in it once the call returned, once, before the product
	// event that tells of the attempt's execution.
	tr, err := g.s.Evidence.GetTrace(g.ctx, &evidencev1.GetTraceRequest{TaskId: g.task})
	if err != nil {
		t.Fatal(err)
	}
	protocolAt := map[string]int{}
	executed := 0
	for i, ev := range tr.GetEvents() {
		if p := ev.GetProtocol(); p != nil {
			if _, dup := protocolAt[p.GetRequestId()]; dup {
				t.Errorf("attempt %s has two protocol events", p.GetRequestId())
			}
			protocolAt[p.GetRequestId()] = i
			continue
		}
		if pr := ev.GetProduct(); pr.GetKind() == evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_EXECUTED {
			executed++
			if at, ok := protocolAt[pr.GetAttemptId()]; !ok || at > i {
				t.Errorf("attempt %s: its protocol event is not before the product event of its execution", pr.GetAttemptId())
			}
		}
	}
	if len(protocolAt) != calls+1 || executed != calls+1 {
		t.Errorf("the trace holds %d protocol events and %d executions, want %d of each", len(protocolAt), executed, calls+1)
	}
}

// BenchmarkGovernedCallE2E drives governed calls through the five
// services over gRPC to a real MCP server (the fixture over streamable
// HTTP), on each store, with one caller and with 32:
//
//	go test -run '^$' -bench GovernedCallE2E ./suite
func BenchmarkGovernedCallE2E(b *testing.B) {
	run := func(b *testing.B, store string) {
		g := startGoverned(b, store, nil)
		g.call(b)
		b.Run("callers=1", func(b *testing.B) {
			for b.Loop() {
				g.call(b)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
		})
		b.Run("callers=32", func(b *testing.B) {
			b.SetParallelism((32 + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					g.call(b)
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
		})
	}
	b.Run("file", func(b *testing.B) { run(b, "") })
	b.Run("redis", func(b *testing.B) {
		addr, _ := redistest.Start(b)
		run(b, redisURL(addr, "e2e"))
	})
}
