package e2e_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/v0m3/v0m3/demo/scenario"
	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/audit"
	"github.com/v0m3/v0m3/internal/redistest"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/suite"
)

// contractRow is one line of the error contract: a call, the code and
// ErrorInfo reason it must end in, the metadata it must carry (a value of
// "" only has to be present), whether it must say when to retry, and what
// it must not have left behind.
type contractRow struct {
	name   string
	call   func(context.Context) (result string, err error)
	code   codes.Code
	reason string
	meta   map[string]string
	retry  bool
	// same, for a call that succeeds, is the result every try must give.
	same string
	// left reports what the refused call left behind, "" for nothing.
	left func() string
}

// maxContractMessage bounds an error message whatever the caller or a
// server sent.
const maxContractMessage = 2048

// check makes the row's call twice: both tries must end alike, as the
// row says (a retry gives the same code, reason and result).
func (r contractRow) check(t *testing.T) {
	t.Helper()
	for try := 1; try <= 2; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		got, err := r.call(ctx)
		cancel()
		if apierror.Code(err) != r.code || apierror.Reason(err) != r.reason {
			t.Errorf("%s, try %d: %.300v, want %v %q", r.name, try, err, r.code, r.reason)
			continue
		}
		if err == nil {
			if r.same != "" && got != r.same {
				t.Errorf("%s, try %d: result %q, want %q every time", r.name, try, got, r.same)
			}
			continue
		}
		md := apierror.Info(err).GetMetadata()
		for k, v := range r.meta {
			if have, ok := md[k]; !ok || (v != "" && have != v) {
				t.Errorf("%s, try %d: metadata %s = %.80q, want %q (all: %.300v)", r.name, try, k, have, v, md)
			}
		}
		if d := apierror.RetryDelay(err); r.retry != (d > 0) {
			t.Errorf("%s, try %d: retry delay %v, want one: %v", r.name, try, d, r.retry)
		}
		if n := len(status.Convert(err).Message()); n > maxContractMessage {
			t.Errorf("%s, try %d: the message is %d bytes, over %d", r.name, try, n, maxContractMessage)
		}
	}
	if r.left != nil {
		if what := r.left(); what != "" {
			t.Errorf("%s left %s behind", r.name, what)
		}
	}
}

// TestErrorContract is the one place showing V0M3's error contract (issue
// 15): for each kind of bad input or outage, through the real services
// (the whole suite on a real redis-server, the fixture as a real MCP
// server), the gRPC code, the ErrorInfo reason and metadata, whether the
// error says when to retry, that the same call again ends the same way,
// and that a refused call left nothing behind.
func TestErrorContract(t *testing.T) {
	t.Parallel()
	bins, cleanup, err := testkit.BuildBinaries("github.com/v0m3/v0m3/demo/fixture/fixturecmd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cleanup)
	rawFixture := bins[0]

	rs := redistest.StartServer(t)
	s, err := suite.Start(context.Background(), suite.Config{DataDir: t.TempDir(), Store: "redis://" + rs.Addr + "/0?prefix=contract"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	w := &world{t: t, s: s}
	w.connect(scenario.StdioFixture(v0m3Bin))
	task := w.startTask()
	taskID := task.GetTask().GetId()
	handle := scenario.FindHandle(scenario.FindOffered(task.GetCatalogue(), scenario.Retrieve), "Migration FAQ")
	first, err := w.retrieve(task, "call/once")
	if err != nil {
		t.Fatal(err)
	}
	peer, err := s.PeerClients(suite.Orchestrator)
	if err != nil {
		t.Fatal(err)
	}
	old, err := s.Connect(testkit.As(w.s, scenario.Integrator), &registryv1.CreateConnectionRequest{
		DisplayName: "Old server", Owner: "platform-team",
		Transport: &registryv1.Transport{Kind: &registryv1.Transport_Stdio{Stdio: &registryv1.StdioTransport{Command: rawFixture, Args: []string{"--raw", "huge-version"}}}},
	})
	if err != nil {
		t.Fatal(err)
	}

	mb := strings.Repeat("x", 1<<20)
	// A 1 MB (10^6 bytes) field name keeps the arguments within their
	// 1 MiB bound, so the name itself is what is refused.
	unknownName := strings.Repeat("f", 1_000_000)
	submit := func(call string, args map[string]any) func(context.Context) (string, error) {
		return func(context.Context) (string, error) {
			r, err := w.s.Orchestrator.SubmitToolRequest(testkit.As(w.s, scenario.Alice), &orchestratorv1.SubmitToolRequestRequest{
				TaskId: taskID, ProviderCallId: call, Capability: scenario.Retrieve, Arguments: scenario.MustStruct(args),
			})
			return r.GetId() + " " + r.GetState().String(), err
		}
	}
	connections := func() int {
		l, err := s.Registry.ListConnections(testkit.As(w.s, scenario.Integrator), &registryv1.ListConnectionsRequest{PageSize: 100})
		if err != nil {
			t.Fatal(err)
		}
		return len(l.GetConnections())
	}
	before := connections()
	// bigDetails counts the task's trace events with a detail of 100 KiB.
	bigDetails := func() int {
		tr, err := peer.Evidence.GetTrace(context.Background(), &evidencev1.GetTraceRequest{TaskId: taskID})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, ev := range tr.GetEvents() {
			if len(ev.GetProduct().GetDetail()) >= 100<<10 {
				n++
			}
		}
		return n
	}
	tooLong := func(field, limit string) map[string]string {
		return map[string]string{"field": field, "limit": limit, "unit": "bytes"}
	}

	live := []contractRow{
		{name: "the same provider call id with the same payload", call: submit("call/once", map[string]any{"source": handle, "query": "migration"}),
			code: codes.OK, same: first.GetId() + " " + first.GetState().String()},
		{name: "the same provider call id with another payload", call: submit("call/once", map[string]any{"source": handle, "query": "other"}),
			code: codes.AlreadyExists, reason: "IDEMPOTENCY_KEY_REUSED", meta: map[string]string{"request_id": first.GetId()}},
		{name: "a 32 KB provider call id", call: submit(strings.Repeat("c", 32<<10), map[string]any{"source": handle, "query": "q"}),
			code: codes.InvalidArgument, reason: "FIELD_TOO_LONG", meta: tooLong("provider_call_id", "256")},
		{name: "a 1 MB unknown argument field name", call: submit("call/unknown", map[string]any{"source": handle, "query": "q", unknownName: 1}),
			code: codes.InvalidArgument, reason: "UNKNOWN_ARGUMENT_FIELD", meta: map[string]string{"request_id": ""}},
		{name: "registry: a 1 MB connection name", call: func(ctx context.Context) (string, error) {
			_, err := s.Registry.CreateConnection(testkit.As(w.s, scenario.Integrator), &registryv1.CreateConnectionRequest{
				DisplayName: mb, Owner: "platform-team", Transport: scenario.StdioFixture(v0m3Bin),
			})
			return "", err
		}, code: codes.InvalidArgument, reason: "FIELD_TOO_LONG", meta: tooLong("display_name", "256"), left: func() string {
			if n := connections(); n != before {
				return "a connection"
			}
			return ""
		}},
		{name: "registry: a 1 MB connection id", call: func(ctx context.Context) (string, error) {
			_, err := s.Registry.GetConnection(testkit.As(w.s, scenario.Integrator), &registryv1.GetConnectionRequest{Id: mb})
			return "", err
		}, code: codes.InvalidArgument, reason: "FIELD_TOO_LONG", meta: tooLong("id", "256")},
		{name: "policy: a 1 MB charge idempotency key", call: func(ctx context.Context) (string, error) {
			_, err := peer.Policy.Charge(ctx, &policyv1.ChargeRequest{TaskId: taskID, Requester: scenario.Alice.ID, Calls: 1, IdempotencyKey: mb})
			return "", err
		}, code: codes.InvalidArgument, reason: "FIELD_TOO_LONG", meta: tooLong("idempotency_key", "256")},
		{name: "policy: a scope of 1001 targets", call: func(ctx context.Context) (string, error) {
			scope := make([]string, 1001)
			for i := range scope {
				scope[i] = "v0m3-sources://notes/" + strings.Repeat("n", i%7)
			}
			_, err := peer.Policy.RegisterTask(ctx, &policyv1.RegisterTaskRequest{TaskId: "task_contract", Requester: scenario.Alice.ID, SourceScope: scope})
			return "", err
		}, code: codes.InvalidArgument, reason: "SCOPE_TOO_LARGE", meta: map[string]string{"field": "source_scope", "limit": "1000", "unit": "entries"}},
		{name: "evidence: a 100 KiB trace detail", call: func(ctx context.Context) (string, error) {
			_, err := peer.Evidence.AppendTrace(ctx, &evidencev1.AppendTraceRequest{Event: &evidencev1.TraceEvent{
				TaskId: taskID, Layer: &evidencev1.TraceEvent_Product{Product: &evidencev1.ProductEvent{
					Kind: evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_REQUEST_REFUSED, Detail: strings.Repeat("d", 100<<10),
				}},
			}})
			return "", err
		}, code: codes.InvalidArgument, reason: "FIELD_TOO_LONG", meta: tooLong("event.product.detail", "65536"), left: func() string {
			if n := bigDetails(); n != 0 {
				return "a trace event"
			}
			return ""
		}},
		{name: "evidence: a 1 MB task id", call: func(ctx context.Context) (string, error) {
			_, err := peer.Evidence.GetTrace(ctx, &evidencev1.GetTraceRequest{TaskId: mb})
			return "", err
		}, code: codes.InvalidArgument, reason: "FIELD_TOO_LONG", meta: tooLong("task_id", "256")},
		{name: "adapter: a server speaking an unsupported protocol version (1 MiB of it)", call: func(ctx context.Context) (string, error) {
			_, err := s.Adapter.Discover(testkit.As(w.s, scenario.Integrator), &adapterv1.DiscoverRequest{ConnectionId: old.GetId()})
			return "", err
		}, code: codes.FailedPrecondition, reason: "PROTOCOL_VERSION_UNSUPPORTED", meta: map[string]string{"server_version": ""}},
	}
	for _, r := range live {
		r.check(t)
	}

	// Redis down: every service's store is unreachable.
	if err := rs.Kill(); err != nil {
		t.Fatal(err)
	}
	// A privileged action refused while Redis (and so evidence) is down
	// is audited once evidence is back: its record waits, it is not lost.
	downAt := time.Now()
	_, err = s.Registry.CreateConnection(testkit.As(w.s, scenario.Integrator), &registryv1.CreateConnectionRequest{
		DisplayName: "Down", Owner: "platform-team", Transport: scenario.StdioFixture(v0m3Bin),
	})
	if !apierror.Is(err, codes.Unavailable, apierror.ReasonStoreUnavailable) {
		t.Fatalf("a new connection with Redis down: %v, want UNAVAILABLE %s", err, apierror.ReasonStoreUnavailable)
	}
	storeDown := map[string]string{}
	down := []contractRow{
		{name: "orchestrator with Redis down: a submission", call: submit("call/redis", map[string]any{"source": handle, "query": "q"})},
		{name: "orchestrator with Redis down: a task read", call: func(ctx context.Context) (string, error) {
			_, err := s.Orchestrator.GetTask(testkit.As(w.s, scenario.Alice), &orchestratorv1.GetTaskRequest{Id: taskID})
			return "", err
		}},
		{name: "registry with Redis down", call: func(ctx context.Context) (string, error) {
			_, err := s.Registry.GetConnection(testkit.As(w.s, scenario.Integrator), &registryv1.GetConnectionRequest{Id: w.conn.GetId()})
			return "", err
		}},
		{name: "policy with Redis down", call: func(ctx context.Context) (string, error) {
			_, err := peer.Policy.Charge(ctx, &policyv1.ChargeRequest{TaskId: taskID, Requester: scenario.Alice.ID, Calls: 1, IdempotencyKey: "contract"})
			return "", err
		}},
		{name: "evidence with Redis down", call: func(ctx context.Context) (string, error) {
			_, err := peer.Evidence.GetTrace(ctx, &evidencev1.GetTraceRequest{TaskId: taskID})
			return "", err
		}},
	}
	for _, r := range down {
		r.code, r.reason, r.meta, r.retry = codes.Unavailable, apierror.ReasonStoreUnavailable, storeDown, true
		r.check(t)
	}
	if err := rs.Start(); err != nil {
		t.Fatal(err)
	}
	// Retried once Redis is back, the same reads succeed.
	for _, r := range down[1:] {
		testkit.Eventually(t, r.name+" answered once Redis is back", func() bool { _, err := r.call(context.Background()); return err == nil })
	}
	testkit.Eventually(t, "the audit record of the connection refused while Redis was down", func() bool {
		l, err := s.Evidence.ListAuditRecords(testkit.As(w.s, scenario.Auditor), &evidencev1.ListAuditRecordsRequest{
			Action: audit.ConnectionCreate, Principal: scenario.Integrator.ID, PageSize: 1000})
		if err != nil {
			return false
		}
		for _, r := range l.GetRecords() {
			if r.GetOutcome() == apierror.ReasonStoreUnavailable {
				if at := r.GetActionTime().AsTime(); at.Before(downAt) || !at.Before(r.GetTime().AsTime()) {
					t.Fatalf("the late record says the action was taken at %s (Redis went down at %s, the record appended at %s)", at, downAt, r.GetTime().AsTime())
				}
				return true
			}
		}
		return false
	})

	// Redis full (at its maxmemory, evicting nothing): every write is
	// refused whole while reads still answer; no retry delay, since only
	// making room helps.
	admin := redistest.Client(t, rs.Addr)
	if err := admin.ConfigSet(context.Background(), "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	fullRequests := func() string {
		l, err := s.Orchestrator.ListRequests(testkit.As(w.s, scenario.Alice), &orchestratorv1.ListRequestsRequest{TaskId: taskID, PageSize: 1000})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range l.GetRequests() {
			if r.GetProviderCallId() == "call/full" {
				return "request " + r.GetId()
			}
		}
		return ""
	}
	full := []contractRow{
		{name: "orchestrator with Redis full: a submission", call: submit("call/full", map[string]any{"source": handle, "query": "q"}), left: fullRequests},
		{name: "registry with Redis full: a new connection", call: func(ctx context.Context) (string, error) {
			_, err := s.Registry.CreateConnection(testkit.As(w.s, scenario.Integrator), &registryv1.CreateConnectionRequest{
				DisplayName: "Full", Owner: "platform-team", Transport: scenario.StdioFixture(v0m3Bin),
			})
			return "", err
		}, left: func() string {
			if n := connections(); n != before {
				return "a connection"
			}
			return ""
		}},
		{name: "policy with Redis full: a charge", call: func(ctx context.Context) (string, error) {
			_, err := peer.Policy.Charge(ctx, &policyv1.ChargeRequest{TaskId: taskID, Requester: scenario.Alice.ID, Calls: 1, IdempotencyKey: "contract-full"})
			return "", err
		}},
	}
	for _, r := range full {
		r.code, r.reason = codes.ResourceExhausted, apierror.ReasonStoreFull
		r.check(t)
	}
	if err := admin.ConfigSet(context.Background(), "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}

	// A notification flood: retrieve_authorized_source mapped onto the
	// hostile fixture's notify_flood tool, told to send 5,000,000 progress
	// notifications, far past the adapter's bound. The call ends quickly
	// in a recorded state naming the bound, and a retry returns it as
	// recorded.
	fs := startSuite(t, t.TempDir())
	fw := &world{t: t, s: fs}
	fw.conn, err = fs.Connect(testkit.As(fw.s, scenario.Integrator), &registryv1.CreateConnectionRequest{
		DisplayName: "Hostile", Owner: "platform-team",
		Transport: &registryv1.Transport{Kind: &registryv1.Transport_Stdio{Stdio: &registryv1.StdioTransport{Command: rawFixture, Args: []string{"--hostile"}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	fsnap := fw.discover()
	fm, err := fs.Registry.ProposeMapping(testkit.As(fw.s, scenario.Integrator), &registryv1.ProposeMappingRequest{
		Capability: scenario.Retrieve, ConnectionId: fw.conn.GetId(), SnapshotId: fsnap.GetId(),
		Target:      &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: "notify_flood"},
		ArgumentMap: []*registryv1.ArgumentBinding{{RemoteField: "count", Constant: structpb.NewNumberValue(5_000_000)}},
		Limits:      &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 5, AllowedMediaTypes: []string{"text/plain", "text/markdown"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	fw.mapping = fw.review(fm)
	ftask := fw.startTask()
	contractRow{name: "a notification flood", call: func(ctx context.Context) (string, error) {
		r, err := fw.retrieve(ftask, "call/flood")
		last := ""
		if n := len(r.GetAttempts()); n > 0 {
			last = r.GetAttempts()[n-1].GetError().GetSafeCode()
		}
		return r.GetState().String() + " " + last, err
	}, code: codes.OK, same: "REQUEST_STATE_FAILED NOTIFICATION_LIMIT_EXCEEDED"}.check(t)

	// A dependency down: the orchestrator (and the registry) with no policy
	// service at its address.
	ds, err := suite.Start(context.Background(), suite.Config{
		DataDir:  t.TempDir(),
		Services: []string{suite.Registry, suite.Evidence, suite.Adapter, suite.Orchestrator},
		Peers:    map[string]string{suite.Policy: testkit.FreeLoopbackAddr(t)},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ds.Close)
	contractRow{name: "orchestrator with policy unreachable: a task start", call: func(ctx context.Context) (string, error) {
		_, err := ds.Orchestrator.StartTask(testkit.As(ds, scenario.Alice), &orchestratorv1.StartTaskRequest{
			Profile: "source_review", Purpose: "review", SourceScope: faqScope,
		})
		return "", err
	}, code: codes.Unavailable, reason: "DEPENDENCY_UNAVAILABLE", retry: true}.check(t)
}
