package policy

import (
	"context"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/redistest"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// taskCeiling is the configured task budget of the tests below: the
// default of a dimension a profile leaves 0, and the platform's ceiling.
var taskCeiling = Limits{Calls: 10, ResponseBytes: 1000, CostMicros: 500}

// stores runs fn against a policy server on each store.
func stores(t *testing.T, fn func(t *testing.T, opts options)) {
	t.Run("bolt", func(t *testing.T) {
		t.Parallel()
		fn(t, options{task: taskCeiling})
	})
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		addr, _ := redistest.Start(t)
		fn(t, options{task: taskCeiling, redisAddr: addr})
	})
}

func chargeTask(task string, calls, bytes, cost int64, key string) *policyv1.ChargeRequest {
	return &policyv1.ChargeRequest{TaskId: task, Requester: "alice", Calls: calls, ResponseBytes: bytes, CostMicros: cost, IdempotencyKey: key}
}

// wantExceeded checks a charge was refused by the named budget dimension.
func wantExceeded(t *testing.T, err error, budget, dimension string, limit int64) {
	t.Helper()
	md := apierror.Info(err).GetMetadata()
	if !apierror.Is(err, codes.ResourceExhausted, "BUDGET_EXCEEDED") || md["budget"] != budget || md["dimension"] != dimension ||
		md["limit"] != strconv.FormatInt(limit, 10) {
		t.Fatalf("err = %v (%v), want BUDGET_EXCEEDED on %s %s limit %d", err, md, budget, dimension, limit)
	}
}

// TestTaskChargedAgainstItsProfileBudget: a task is charged against the
// budget it was registered with (its profile's default budget); a
// dimension left 0 takes the configured task budget; the budget survives a
// restart; and a ceiling lowered since registration still holds.
func TestTaskChargedAgainstItsProfileBudget(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, opts options) {
		e := newEnv(t, opts)
		ctx := context.Background()
		budget := &registryv1.TaskBudget{MaxCalls: 2, MaxCostMicros: 100}
		ts, err := e.client.RegisterTask(ctx, &policyv1.RegisterTaskRequest{TaskId: "task_p", Requester: "alice", Budget: budget})
		if err != nil || !proto.Equal(ts.GetBudget(), budget) {
			t.Fatalf("RegisterTask = %v, %v", ts, err)
		}
		resp, err := e.client.Charge(ctx, chargeTask("task_p", 1, 0, 0, "a"))
		if err != nil {
			t.Fatal(err)
		}
		if tb := resp.GetTask(); tb.GetMaxCalls() != 2 || tb.GetMaxResponseBytes() != taskCeiling.ResponseBytes || tb.GetMaxCostMicros() != 100 {
			t.Errorf("task budget = %v, want the profile's calls and cost, the configured response bytes", tb)
		}
		_, err = e.client.Charge(ctx, chargeTask("task_p", 0, 0, 101, "cost"))
		wantExceeded(t, err, "task/task_p", "cost_micros", 100)
		// The response bytes the profile left to the default.
		_, err = e.client.Charge(ctx, chargeTask("task_p", 0, taskCeiling.ResponseBytes+1, 0, "bytes"))
		wantExceeded(t, err, "task/task_p", "response_bytes", taskCeiling.ResponseBytes)
		if _, err := e.client.Charge(ctx, chargeTask("task_p", 1, 0, 0, "b")); err != nil {
			t.Fatal(err)
		}

		// The limit is the task's, kept across a restart.
		e.reopen()
		_, err = e.client.Charge(ctx, chargeTask("task_p", 1, 0, 0, "c"))
		wantExceeded(t, err, "task/task_p", "calls", 2)

		// Another task of the same requester has its own budget; one
		// registered without a budget, or not registered, the default.
		if _, err := e.client.RegisterTask(ctx, &policyv1.RegisterTaskRequest{TaskId: "task_d", Requester: "alice", Budget: &registryv1.TaskBudget{}}); err != nil {
			t.Fatal(err)
		}
		for _, task := range []string{"task_d", "task_unregistered"} {
			resp, err := e.client.Charge(ctx, chargeTask(task, 1, 0, 0, "a"))
			if err != nil || resp.GetTask().GetMaxCalls() != taskCeiling.Calls {
				t.Errorf("%s: charge = %v, %v; want the configured %d calls", task, resp, err, taskCeiling.Calls)
			}
		}

		// A ceiling lowered after registration holds for a budget first
		// charged since.
		if _, err := e.client.RegisterTask(ctx, &policyv1.RegisterTaskRequest{TaskId: "task_q", Requester: "alice",
			Budget: &registryv1.TaskBudget{MaxCalls: 8}}); err != nil {
			t.Fatal(err)
		}
		e.opts.task = Limits{Calls: 1, ResponseBytes: 1000, CostMicros: 500}
		e.reopen()
		if _, err := e.client.Charge(ctx, chargeTask("task_q", 1, 0, 0, "a")); err != nil {
			t.Fatal(err)
		}
		_, err = e.client.Charge(ctx, chargeTask("task_q", 1, 0, 0, "b"))
		wantExceeded(t, err, "task/task_q", "calls", 1)
	})
}

// scopeReads counts the task scope reads that reach the store.
type scopeReads struct {
	Store
	n atomic.Int64
}

func (r *scopeReads) GetTaskScope(ctx context.Context, taskID string) (*policyv1.TaskScope, error) {
	r.n.Add(1)
	return r.Store.GetTaskScope(ctx, taskID)
}

// TestTaskScopeReadOnce: a registered task's scope is read from the store
// once, not on every charge (two per governed call), and its budget still
// holds; a task not yet registered is read again on each charge, so that
// registering it later is seen.
func TestTaskScopeReadOnce(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, opts options) {
		reads := &scopeReads{}
		opts.wrap = func(st Store) Store { reads.Store = st; return reads }
		e := newEnv(t, opts)
		ctx := context.Background()
		register := func(task string, budget *registryv1.TaskBudget) {
			t.Helper()
			if _, err := e.client.RegisterTask(ctx, &policyv1.RegisterTaskRequest{TaskId: task, Requester: "alice", Budget: budget}); err != nil {
				t.Fatal(err)
			}
			reads.n.Store(0)
		}
		charges := func(task string, keys ...string) {
			t.Helper()
			for _, key := range keys {
				if _, err := e.client.Charge(ctx, chargeTask(task, 1, 0, 0, key)); err != nil {
					t.Fatalf("charge %s %s: %v", task, key, err)
				}
			}
		}

		register("task_p", &registryv1.TaskBudget{MaxCalls: 2})
		charges("task_p", "a", "b")
		_, err := e.client.Charge(ctx, chargeTask("task_p", 1, 0, 0, "c"))
		wantExceeded(t, err, "task/task_p", "calls", 2)
		if got := reads.n.Load(); got != 1 {
			t.Errorf("a registered task's scope was read %d times in three charges, want 1", got)
		}

		charges("task_late", "a", "b")
		if got := reads.n.Load(); got != 3 {
			t.Errorf("an unregistered task's scope was read %d times in two charges, want 2 (not kept)", got-1)
		}
		register("task_late", nil)
		charges("task_late", "c", "d")
		if got := reads.n.Load(); got != 1 {
			t.Errorf("a task registered late was read %d times in two charges, want 1", got)
		}
	})
}

// TestRegisterTaskBudget: a profile's budget may not exceed the configured
// task budget in any dimension: such a registration is refused, naming
// each dimension, and stores nothing. A budget is part of the
// registration: a retry with the same one is answered with the record, a
// different one never replaces it.
func TestRegisterTaskBudget(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, opts options) {
		e := newEnv(t, opts)
		ctx := context.Background()
		refusals := []struct {
			name   string
			budget *registryv1.TaskBudget
			reason string
			fields []string
		}{
			{"above the ceiling in calls", &registryv1.TaskBudget{MaxCalls: 11}, "BUDGET_ABOVE_CEILING", []string{"budget.max_calls"}},
			{"above the ceiling in two dimensions", &registryv1.TaskBudget{MaxCalls: 10, MaxResponseBytes: 1001, MaxCostMicros: 501},
				"BUDGET_ABOVE_CEILING", []string{"budget.max_cost_micros", "budget.max_response_bytes"}},
			{"negative", &registryv1.TaskBudget{MaxCalls: -1}, "FIELD_INVALID", []string{"budget.max_calls"}},
		}
		for _, tc := range refusals {
			_, err := e.client.RegisterTask(ctx, &policyv1.RegisterTaskRequest{TaskId: "task_big", Requester: "alice", Budget: tc.budget})
			if !apierror.Is(err, codes.InvalidArgument, tc.reason) || !slices.Equal(apierror.Fields(err), tc.fields) {
				t.Errorf("%s: err = %v (fields %v), want INVALID_ARGUMENT %s on %v", tc.name, err, apierror.Fields(err), tc.reason, tc.fields)
			}
		}
		if _, err := e.srv.store.GetTaskScope(ctx, "task_big"); err == nil {
			t.Error("a refused registration was stored")
		}

		atCeiling := &registryv1.TaskBudget{MaxCalls: 10, MaxResponseBytes: 1000, MaxCostMicros: 500}
		first, err := e.client.RegisterTask(ctx, &policyv1.RegisterTaskRequest{TaskId: "task_big", Requester: "alice", Budget: atCeiling})
		if err != nil {
			t.Fatalf("a budget at the ceiling: %v", err)
		}
		again, err := e.client.RegisterTask(ctx, &policyv1.RegisterTaskRequest{TaskId: "task_big", Requester: "alice", Budget: atCeiling})
		if err != nil || !proto.Equal(again, first) {
			t.Errorf("retry = %v, %v; want the first record", again, err)
		}
		for _, other := range []*registryv1.TaskBudget{nil, {MaxCalls: 9, MaxResponseBytes: 1000, MaxCostMicros: 500}} {
			_, err := e.client.RegisterTask(ctx, &policyv1.RegisterTaskRequest{TaskId: "task_big", Requester: "alice", Budget: other})
			if !apierror.Is(err, codes.AlreadyExists, "TASK_ALREADY_REGISTERED") {
				t.Errorf("re-register with budget %v: err = %v, want ALREADY_EXISTS TASK_ALREADY_REGISTERED", other, err)
			}
		}
		stored, err := e.srv.store.GetTaskScope(ctx, "task_big")
		if err != nil || !proto.Equal(stored.GetBudget(), atCeiling) {
			t.Errorf("stored %v, %v; want the first budget", stored, err)
		}
	})
}
