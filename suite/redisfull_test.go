package suite_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/v0m3/v0m3/demo/scenario"
	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/redistest"
	"github.com/v0m3/v0m3/internal/testkit"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/suite"
)

// TestRedisThatEvictsOrIsFull: on a real Redis, a maxmemory-policy that
// evicts keys makes every stateful service report NOT_SERVING until it is
// noeviction again; a Redis at its maxmemory refuses each write, which
// the caller gets as RESOURCE_EXHAUSTED STORE_FULL with nothing written,
// whatever kind of write it was (a transaction, a script), and the same
// calls succeed once there is room.
func TestRedisThatEvictsOrIsFull(t *testing.T) {
	t.Parallel()
	rs := redistest.StartServer(t)
	s, err := suite.Start(context.Background(), suite.Config{DataDir: t.TempDir(), Store: redisURL(rs.Addr, "full")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	ctx := context.Background()
	admin := redistest.Client(t, rs.Addr)
	config := func(kv ...string) {
		t.Helper()
		for i := 0; i < len(kv); i += 2 {
			if err := admin.ConfigSet(ctx, kv[i], kv[i+1]).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}

	all := statefulHealth(t, s)
	testkit.Eventually(t, "every service SERVING", all(healthpb.HealthCheckResponse_SERVING))
	for _, policy := range []string{"allkeys-lru", "volatile-ttl"} {
		config("maxmemory-policy", policy)
		testkit.Eventually(t, "every service NOT_SERVING on a Redis with maxmemory-policy "+policy, all(healthpb.HealthCheckResponse_NOT_SERVING))
		config("maxmemory-policy", "noeviction")
		testkit.Eventually(t, "every service SERVING once Redis evicts nothing", all(healthpb.HealthCheckResponse_SERVING))
	}

	platform := s.As(ctx, scenario.Integrator.ID, scenario.Integrator.Groups...)
	alice := s.As(ctx, scenario.Alice.ID, scenario.Alice.Groups...)
	create := func() error {
		_, err := s.Registry.CreateConnection(platform, &registryv1.CreateConnectionRequest{
			DisplayName: "notes", Owner: "alice",
			Transport: &registryv1.Transport{Kind: &registryv1.Transport_StreamableHttp{StreamableHttp: &registryv1.StreamableHTTPTransport{Url: "http://127.0.0.1:1/mcp"}}},
		})
		return err
	}
	start := func() error {
		_, err := s.Orchestrator.StartTask(alice, &orchestratorv1.StartTaskRequest{Profile: "source_review"})
		return err
	}
	count := func() (conns, tasks int) {
		t.Helper()
		cl, err := s.Registry.ListConnections(platform, &registryv1.ListConnectionsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		tl, err := s.Orchestrator.ListTasks(alice, &orchestratorv1.ListTasksRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return len(cl.GetConnections()), len(tl.GetTasks())
	}

	// Full: every write is refused (reads still answer).
	config("maxmemory", "1")
	for name, write := range map[string]func() error{"CreateConnection": create, "StartTask": start} {
		err := write()
		if !apierror.Is(err, codes.ResourceExhausted, apierror.ReasonStoreFull) {
			t.Errorf("%s on a full Redis: %v, want RESOURCE_EXHAUSTED %s", name, err, apierror.ReasonStoreFull)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, "nothing was written") || strings.Contains(msg, "OOM") {
			t.Errorf("%s: message %q should say nothing was written, in its own words (not Redis's reply)", name, msg)
		}
	}
	if conns, tasks := count(); conns != 0 || tasks != 0 {
		t.Errorf("after the refused writes: %d connections and %d tasks stored, want none", conns, tasks)
	}

	// Room again: the same calls succeed.
	config("maxmemory", "0")
	if err := create(); err != nil {
		t.Errorf("CreateConnection with room again: %v", err)
	}
	if err := start(); err != nil {
		t.Errorf("StartTask with room again: %v", err)
	}
	if conns, tasks := count(); conns != 1 || tasks != 1 {
		t.Errorf("with room again: %d connections and %d tasks, want 1 and 1", conns, tasks)
	}
}
