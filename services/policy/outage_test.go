package policy

import (
	"context"
	"fmt"
	"strings"
	"testing"

	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/redistest"
	"github.com/v0m3/v0m3/internal/testkit"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
)

// TestStoreOutageIsUnavailable: with policy's Redis down, every call that
// needs the store is UNAVAILABLE STORE_UNAVAILABLE with a RetryInfo (try
// again later), not INTERNAL, and its message names neither the store's
// address nor its error; once Redis is back the same calls succeed on the
// records written before the outage.
func TestStoreOutageIsUnavailable(t *testing.T) {
	t.Parallel()
	redis := redistest.StartServer(t)
	e := newEnv(t, options{redisAddr: redis.Addr})
	h := mint(t, e, publicTarget, nil)

	calls := []struct {
		name string
		call func() error
	}{
		{"RegisterTask", func() error {
			_, err := e.client.RegisterTask(t.Context(), &policyv1.RegisterTaskRequest{TaskId: "task_2", Requester: "alice", SourceScope: task1Scope})
			return err
		}},
		{"MintHandle", func() error {
			_, err := e.client.MintHandle(t.Context(), &policyv1.MintHandleRequest{
				TaskId: "task_1", Requester: "alice", Capability: capRetrieve, Target: publicTarget, MappingId: mapRetrieve, MappingRevision: 2,
			})
			return err
		}},
		{"ResolveHandle", func() error {
			_, err := e.client.ResolveHandle(t.Context(), resolveReq(h.GetToken()))
			return err
		}},
		{"Charge", func() error {
			_, err := e.client.Charge(t.Context(), &policyv1.ChargeRequest{TaskId: "task_1", Requester: "alice", Calls: 1, IdempotencyKey: "k1"})
			return err
		}},
		{"ReportConnectionHealth", func() error {
			_, err := e.client.ReportConnectionHealth(t.Context(), &policyv1.ReportConnectionHealthRequest{
				ConnectionId: connOK, State: policyv1.HealthState_HEALTH_STATE_HEALTHY,
			})
			return err
		}},
		{"Eligible", func() error {
			_, err := e.client.Eligible(t.Context(), &policyv1.EligibleRequest{TaskId: "task_1", Requester: alice(), Purpose: "source_review", NeededCapabilities: []string{capRetrieve}})
			return err
		}},
	}

	redis.Sync(t) // what was written before the crash must survive it
	if err := redis.Kill(); err != nil {
		t.Fatal(err)
	}
	for _, c := range calls {
		err := c.call()
		if !apierror.Is(err, codes.Unavailable, apierror.ReasonStoreUnavailable) {
			t.Errorf("%s with Redis down: %v, want UNAVAILABLE %s", c.name, err, apierror.ReasonStoreUnavailable)
			continue
		}
		if apierror.RetryDelay(err) <= 0 {
			t.Errorf("%s with Redis down carries no retry delay: %v", c.name, status.Convert(err).Details())
		}
		if msg := status.Convert(err).Message(); strings.Contains(msg, redis.Addr) || strings.Contains(msg, "refused") {
			t.Errorf("%s: the message shows the store's error: %q", c.name, msg)
		}
	}

	if err := redis.Start(); err != nil {
		t.Fatal(err)
	}
	for _, c := range calls {
		testkit.EventuallySucceeds(t, c.name+" once Redis is back", c.call)
	}
}

// TestStoreThatCannotServeYetIsUnavailable: a Redis that answers but says
// it cannot serve for the moment is UNAVAILABLE STORE_UNAVAILABLE with a
// RetryInfo (retry with the same id), not INTERNAL: a replica cut off from
// its master (MASTERDOWN for reads, READONLY for writes, as during a
// failover) and a server busy with a script past its time limit (BUSY).
// Once Redis serves again, the same calls succeed on what was written
// before.
func TestStoreThatCannotServeYetIsUnavailable(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	e := newEnv(t, options{redisAddr: srv.Addr})
	h := mint(t, e, publicTarget, nil)
	admin := goredis.NewClient(&goredis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { _ = admin.Close() })

	read := func() error { _, err := e.client.ResolveHandle(t.Context(), resolveReq(h.GetToken())); return err }
	write := func() error {
		_, err := e.client.RegisterTask(t.Context(), &policyv1.RegisterTaskRequest{TaskId: "task_2", Requester: "alice", SourceScope: task1Scope})
		return err
	}
	wantUnavailable := func(what string, err error) {
		t.Helper()
		if !apierror.Is(err, codes.Unavailable, apierror.ReasonStoreUnavailable) {
			t.Errorf("%s: %v, want UNAVAILABLE %s", what, err, apierror.ReasonStoreUnavailable)
			return
		}
		if apierror.RetryDelay(err) <= 0 {
			t.Errorf("%s carries no retry delay: %v", what, status.Convert(err).Details())
		}
	}

	// A replica of a master that never answers: port 1 is closed.
	for _, cmd := range [][]any{{"config", "set", "replica-serve-stale-data", "no"}, {"replicaof", "127.0.0.1", "1"}} {
		if err := admin.Do(t.Context(), cmd...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	wantUnavailable("a read from a replica cut off from its master", read())
	wantUnavailable("a write to a replica", write())
	if err := admin.Do(t.Context(), "replicaof", "no", "one").Err(); err != nil {
		t.Fatal(err)
	}

	// A script that runs past busy-reply-threshold makes every other
	// command answer BUSY until it is killed.
	if err := admin.Do(t.Context(), "config", "set", "busy-reply-threshold", "10").Err(); err != nil {
		t.Fatal(err)
	}
	spin := goredis.NewClient(&goredis.Options{Addr: srv.Addr, MaxRetries: -1, ReadTimeout: -1})
	t.Cleanup(func() { _ = spin.Close() })
	spun := make(chan error, 1)
	go func() { spun <- spin.Eval(context.Background(), "while true do end", nil).Err() }()
	testkit.Eventually(t, "the script makes Redis busy", func() bool {
		return strings.HasPrefix(fmt.Sprint(admin.Ping(t.Context()).Err()), "BUSY ")
	})
	wantUnavailable("a read while Redis is busy", read())
	wantUnavailable("a write while Redis is busy", write())
	if err := admin.Do(t.Context(), "script", "kill").Err(); err != nil {
		t.Fatal(err)
	}
	<-spun

	testkit.Eventually(t, "calls succeed once Redis serves again", func() bool { return read() == nil && write() == nil })
}
