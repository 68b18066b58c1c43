package adapter

import (
	"context"
	"runtime"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/v0m3/v0m3/demo/fixture"
	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

func args(t *testing.T, m map[string]any) *structpb.Struct {
	t.Helper()
	s, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// call builds an execute request for a tool on conn.
func call(t *testing.T, conn *registryv1.Connection, tool string, a map[string]any, limits *registryv1.Limits) *adapterv1.ExecuteRequest {
	t.Helper()
	if limits == nil {
		limits = &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 10}
	}
	return &adapterv1.ExecuteRequest{
		ConnectionId:    conn.GetId(),
		ConfigRevision:  conn.GetConfigRevision(),
		MappingId:       "map_1",
		MappingRevision: 1,
		Target:          &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: tool},
		Arguments:       args(t, a),
		Limits:          limits,
		AttemptId:       "att_1",
	}
}

func execute(t *testing.T, e *env, req *adapterv1.ExecuteRequest) *adapterv1.ExecuteResponse {
	t.Helper()
	resp, err := e.srv.Execute(context.Background(), granted(t, req))
	if err != nil {
		t.Fatalf("Execute: %v", err)
	}
	return resp
}

func wantFailure(t *testing.T, resp *adapterv1.ExecuteResponse, outcome adapterv1.Outcome, code string) {
	t.Helper()
	if resp.GetOutcome() != outcome || resp.GetError().GetSafeCode() != code {
		t.Fatalf("outcome %v %q, want %v %q (stage %v, detail %q)", resp.GetOutcome(), resp.GetError().GetSafeCode(),
			outcome, code, resp.GetStage(), resp.GetError().GetUntrustedDetail())
	}
	if len(resp.GetItems()) != 0 {
		t.Errorf("a failed call returned %d items", len(resp.GetItems()))
	}
}

func TestDiscover(t *testing.T) {
	t.Parallel()
	transports(t, func(t *testing.T, e *env, conn *registryv1.Connection) {
		snap, err := e.srv.Discover(testkit.AsService(context.Background(), identity.Operator), &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()})
		if err != nil {
			t.Fatal(err)
		}
		if snap.GetId() == "" || snap.GetConnectionId() != conn.GetId() || snap.GetConfigRevision() != conn.GetConfigRevision() {
			t.Errorf("snapshot identity: %v %v %v", snap.GetId(), snap.GetConnectionId(), snap.GetConfigRevision())
		}
		if si := snap.GetServerInfo(); si.GetName() != fixture.ServerName || si.GetVersion() != fixture.ServerVersion {
			t.Errorf("server info = %v", si)
		}
		if snap.GetProtocolVersion() == "" || snap.GetRetrieveTime() == nil {
			t.Errorf("protocol version %q, retrieve time %v", snap.GetProtocolVersion(), snap.GetRetrieveTime())
		}
		var tools []string
		for _, ti := range snap.GetTools() {
			tools = append(tools, ti.GetName())
		}
		if !slices.IsSorted(tools) || !slices.Contains(tools, "search") || !slices.Contains(tools, "flood") {
			t.Errorf("tools = %v", tools)
		}
		i := slices.Index(tools, "search")
		search := snap.GetTools()[i]
		if search.GetDescription() != fixture.DescriptionDefault || search.GetInputSchema().GetFields()["properties"] == nil ||
			!search.GetAnnotations().GetFields()["readOnlyHint"].GetBoolValue() {
			t.Errorf("search identity = %v", search)
		}
		if len(snap.GetResources()) != 4 || snap.GetResources()[0].GetUri() != fixture.URIPrefix+"api-migration" ||
			snap.GetResources()[0].GetMimeType() != "text/markdown" {
			t.Errorf("resources = %v", snap.GetResources())
		}
		if r := e.policy.last(); r == nil || r.GetState() != policyv1.HealthState_HEALTH_STATE_HEALTHY {
			t.Errorf("health report = %v", r)
		}
	})
}

func TestExecuteSearch(t *testing.T) {
	t.Parallel()
	transports(t, func(t *testing.T, e *env, conn *registryv1.Connection) {
		resp := execute(t, e, call(t, conn, "search", map[string]any{"query": "Retry-After"}, nil))
		if resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK || resp.GetStage() != adapterv1.DeliveryStage_DELIVERY_STAGE_RESULT_OBSERVED {
			t.Fatalf("outcome %v stage %v error %v", resp.GetOutcome(), resp.GetStage(), resp.GetError())
		}
		if len(resp.GetItems()) != 1 {
			t.Fatalf("items = %v", resp.GetItems())
		}
		it := resp.GetItems()[0]
		if it.GetUri() != fixture.URIPrefix+"rate-limits" || it.GetMediaType() != "text/markdown" ||
			!strings.Contains(it.GetText(), fixture.RateLimitQualification(1)) || it.GetMetadata()["revision"] != "1" ||
			!strings.HasPrefix(it.GetContentDigest(), "sha256:") {
			t.Errorf("item = %v", it)
		}
		if resp.GetMethod() != "tools/call" || !strings.HasPrefix(resp.GetResponseDigest(), "sha256:") || resp.GetResponseBytes() < int64(len(it.GetText())) ||
			resp.GetSendTime() == nil || resp.GetObserveTime() == nil || resp.GetServerInfo().GetName() != fixture.ServerName {
			t.Errorf("evidence: method %q digest %q bytes %d send %v observe %v server %v", resp.GetMethod(), resp.GetResponseDigest(),
				resp.GetResponseBytes(), resp.GetSendTime(), resp.GetObserveTime(), resp.GetServerInfo())
		}
		again := execute(t, e, call(t, conn, "search", map[string]any{"query": "Retry-After"}, nil))
		if again.GetResponseDigest() != resp.GetResponseDigest() {
			t.Errorf("same result, different digests")
		}
	})
}

func TestExecuteResourceRead(t *testing.T) {
	t.Parallel()
	transports(t, func(t *testing.T, e *env, conn *registryv1.Connection) {
		req := call(t, conn, "", nil, nil)
		req.Arguments = nil
		req.Target = &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_RESOURCE, Name: fixture.URIPrefix + "migration-faq"}
		resp := execute(t, e, req)
		if resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK || resp.GetMethod() != "resources/read" || len(resp.GetItems()) != 1 {
			t.Fatalf("resp = %v", resp)
		}
		if it := resp.GetItems()[0]; !strings.Contains(it.GetText(), fixture.HostileParagraph) || it.GetMetadata()["revision"] != "1" {
			t.Errorf("item = %v", it)
		}
		req.Target.Name = fixture.URIPrefix + "nope"
		wantFailure(t, execute(t, e, req), adapterv1.Outcome_OUTCOME_INVALID_REQUEST, "JSONRPC_-32602")
	})
}

// TestFloodStopsAtLimit has the server stream 256 MiB; the adapter stops
// reading at the limit. Not parallel: it measures the process's
// allocations.
func TestFloodStopsAtLimit(t *testing.T) {
	transports(t, func(t *testing.T, e *env, conn *registryv1.Connection) {
		req := call(t, conn, "flood", map[string]any{"bytes": 268435456}, &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 10})
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		resp := execute(t, e, req)
		runtime.ReadMemStats(&after)
		wantFailure(t, resp, adapterv1.Outcome_OUTCOME_INVALID_REQUEST, CodeResponseLimitExceeded)
		if d := resp.GetError().GetAdapterDetail(); d != "response exceeded max_response_bytes=65536" || resp.GetError().GetUntrustedDetail() != "" {
			t.Errorf("detail = %q", d)
		}
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
			t.Errorf("the adapter allocated %d MiB reading a flood limited to 64 KiB", grew>>20)
		}
		t.Logf("read %d bytes, allocated %d KiB", resp.GetResponseBytes(), (after.TotalAlloc-before.TotalAlloc)>>10)
		if resp.GetResponseBytes() < 64<<10 || resp.GetResponseBytes() > 2<<20 {
			t.Errorf("read %d bytes of a flood limited to 64 KiB", resp.GetResponseBytes())
		}
	})
}

func TestLimitsOnContent(t *testing.T) {
	t.Parallel()
	transports(t, func(t *testing.T, e *env, conn *registryv1.Connection) {
		t.Run("too many items", func(t *testing.T) {
			resp := execute(t, e, call(t, conn, "many", map[string]any{"count": 20}, &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 5}))
			wantFailure(t, resp, adapterv1.Outcome_OUTCOME_INVALID_REQUEST, CodeItemLimitExceeded)
		})
		t.Run("binary when only text is allowed", func(t *testing.T) {
			resp := execute(t, e, call(t, conn, "binary", map[string]any{}, nil))
			wantFailure(t, resp, adapterv1.Outcome_OUTCOME_INVALID_REQUEST, CodeMediaTypeNotAllowed)
		})
		t.Run("binary when allowed: size and digest, never bytes", func(t *testing.T) {
			resp := execute(t, e, call(t, conn, "binary", map[string]any{}, &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 1, AllowedMediaTypes: []string{"image/png"}}))
			if resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK || len(resp.GetItems()) != 1 {
				t.Fatalf("resp = %v", resp)
			}
			if it := resp.GetItems()[0]; it.GetBlobSize() == 0 || it.GetText() != "" || it.GetMediaType() != "image/png" {
				t.Errorf("item = %v", it)
			}
		})
	})
}

func TestRemoteErrors(t *testing.T) {
	t.Parallel()
	transports(t, func(t *testing.T, e *env, conn *registryv1.Connection) {
		t.Run("tool error text is untrusted detail", func(t *testing.T) {
			resp := execute(t, e, call(t, conn, "search", map[string]any{"query": "x", "uri": fixture.URIPrefix + "nope"}, nil))
			wantFailure(t, resp, adapterv1.Outcome_OUTCOME_INVALID_REQUEST, CodeToolError)
			if resp.GetError().GetUntrustedDetail() != "no such note" || resp.GetStage() != adapterv1.DeliveryStage_DELIVERY_STAGE_RESULT_OBSERVED {
				t.Errorf("detail %q stage %v", resp.GetError().GetUntrustedDetail(), resp.GetStage())
			}
		})
		t.Run("unknown tool is a JSON-RPC error", func(t *testing.T) {
			resp := execute(t, e, call(t, conn, "export", map[string]any{}, nil))
			if resp.GetOutcome() != adapterv1.Outcome_OUTCOME_INVALID_REQUEST || !strings.HasPrefix(resp.GetError().GetSafeCode(), "JSONRPC_") {
				t.Errorf("resp = %v", resp)
			}
		})
		t.Run("crash after send is unknown", func(t *testing.T) {
			resp := execute(t, e, call(t, conn, "crash", map[string]any{}, nil))
			wantFailure(t, resp, adapterv1.Outcome_OUTCOME_UNKNOWN, CodeTransportClosed)
			if resp.GetStage() < adapterv1.DeliveryStage_DELIVERY_STAGE_SENT || resp.GetSendTime() == nil {
				t.Errorf("stage %v send time %v", resp.GetStage(), resp.GetSendTime())
			}
		})
	})
}

func TestUnreachable(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	conns := map[string]*registryv1.Connection{
		"http":  e.httpConn("http://127.0.0.1:1/mcp"),
		"stdio": e.stdioConn("--transport", "nonsense"),
	}
	for name, conn := range conns {
		t.Run(name, func(t *testing.T) {
			resp := execute(t, e, call(t, conn, "search", map[string]any{"query": "x"}, nil))
			wantFailure(t, resp, adapterv1.Outcome_OUTCOME_UNAVAILABLE, CodeServerUnreachable)
			if resp.GetStage() != adapterv1.DeliveryStage_DELIVERY_STAGE_PREPARED {
				t.Errorf("stage = %v", resp.GetStage())
			}
			_, err := e.srv.Discover(testkit.AsService(context.Background(), identity.Operator), &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()})
			if !apierror.Is(err, codes.Unavailable, "SERVER_UNREACHABLE") {
				t.Errorf("Discover: %v", err)
			}
		})
	}
	if r := e.policy.last(); r == nil || r.GetState() != policyv1.HealthState_HEALTH_STATE_DEGRADED {
		t.Errorf("health report = %v", r)
	}
}

func TestPreconditions(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	conn := e.stdioConn()
	ctx := context.Background()

	req := call(t, conn, "search", map[string]any{"query": "x"}, nil)
	req.ConfigRevision = 2
	if _, err := e.srv.Execute(ctx, granted(t, req)); !apierror.Is(err, codes.FailedPrecondition, "CONFIG_REVISION_CHANGED") {
		t.Errorf("changed revision: %v", err)
	}

	retired := e.registry.add(&registryv1.Connection{State: registryv1.ConnectionState_CONNECTION_STATE_RETIRED, Transport: conn.GetTransport()})
	if _, err := e.srv.Execute(ctx, granted(t, call(t, retired, "search", map[string]any{"query": "x"}, nil))); !apierror.Is(err, codes.FailedPrecondition, "CONNECTION_RETIRED") {
		t.Errorf("retired execute: %v", err)
	}
	if _, err := e.srv.Discover(testkit.AsService(ctx, identity.Operator), &adapterv1.DiscoverRequest{ConnectionId: retired.GetId()}); !apierror.Is(err, codes.FailedPrecondition, "CONNECTION_RETIRED") {
		t.Errorf("retired discover: %v", err)
	}
	if _, err := e.srv.Discover(testkit.AsService(ctx, identity.Operator), &adapterv1.DiscoverRequest{ConnectionId: "conn_missing"}); apierror.Code(err) != codes.NotFound {
		t.Errorf("missing connection: %v", err)
	}

	_, err := e.srv.Execute(ctx, granted(t, &adapterv1.ExecuteRequest{ConnectionId: conn.GetId(), Limits: &registryv1.Limits{MaxResponseBytes: 1 << 40}}))
	want := []string{"attempt_id", "config_revision", "limits.max_items", "limits.max_response_bytes", "mapping_id", "mapping_revision", "target"}
	if apierror.Code(err) != codes.InvalidArgument || !slices.Equal(apierror.Fields(err), want) {
		t.Errorf("invalid request: %v fields %v", err, apierror.Fields(err))
	}
}

func TestLocalServerGetsNoInheritedEnvironment(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	conn := e.stdioConn("--hostile")
	resp := execute(t, e, call(t, conn, "env", map[string]any{}, nil))
	if resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK || len(resp.GetItems()) != 1 {
		t.Fatalf("resp = %v", resp)
	}
	names := strings.Split(resp.GetItems()[0].GetText(), "\n")
	if slices.Contains(names, secretEnv) {
		t.Errorf("the local server saw %s: %v", secretEnv, names)
	}
	// The run's own directories are the sandbox's; nothing is inherited.
	want := []string{"FIXTURE_MODE", "HOME", "PATH", "TMPDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_RUNTIME_DIR", "XDG_STATE_HOME"}
	if !slices.Equal(names, want) {
		t.Errorf("environment names = %v, want only %v", names, want)
	}
}

func TestProtocolTraceRedactsSecrets(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	conn := e.stdioConn()
	req := call(t, conn, "search", map[string]any{"query": "cursor", "filters": map[string]any{"api_key": "k-123", "Authorization": "Bearer x"}}, nil)
	req.TaskId, req.SnapshotId = "task_1", "snap_1"
	resp := execute(t, e, req)
	e.evidence.mu.Lock()
	defer e.evidence.mu.Unlock()
	if len(e.evidence.events) != 1 {
		t.Fatalf("trace events = %d", len(e.evidence.events))
	}
	ev := e.evidence.events[0]
	p := ev.GetProtocol()
	if ev.GetTaskId() != "task_1" || p.GetRequestId() != "att_1" || p.GetSnapshotId() != "snap_1" || p.GetMethod() != "tools/call" ||
		p.GetOutcome() != outcomeName(resp.GetOutcome()) || p.GetConnectionId() != conn.GetId() {
		t.Errorf("event = %v", ev)
	}
	f := p.GetSafeArguments().GetFields()["filters"].GetStructValue().GetFields()
	if f["api_key"].GetStringValue() != Redacted || f["Authorization"].GetStringValue() != Redacted ||
		p.GetSafeArguments().GetFields()["query"].GetStringValue() != "cursor" {
		t.Errorf("safe arguments = %v", p.GetSafeArguments())
	}
}

func TestHealth(t *testing.T) {
	t.Parallel()
	transports(t, func(t *testing.T, e *env, conn *registryv1.Connection) {
		resp, err := e.srv.Health(context.Background(), &adapterv1.HealthRequest{ConnectionId: conn.GetId()})
		if err != nil || !resp.GetHealthy() {
			t.Fatalf("Health = %v, %v", resp, err)
		}
		if r := e.policy.last(); r.GetState() != policyv1.HealthState_HEALTH_STATE_HEALTHY {
			t.Errorf("report = %v", r)
		}
	})
}
