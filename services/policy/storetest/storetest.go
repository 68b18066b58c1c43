// Package storetest is the policy Store's conformance suite: the same
// tests run against every implementation (embedded file and Redis).
package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/v0m3/v0m3/internal/store"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/policy"
)

// Run runs every conformance test; newStore returns an empty store that
// lives until the (sub)test ends.
func Run(t *testing.T, newStore func(t *testing.T) policy.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, st policy.Store)
	}{
		{"HandleCreateIfAbsent", testHandleCreate},
		{"HandleExpiry", testHandleExpiry},
		{"Charge", testCharge},
		{"ChargeRefusedChangesNothing", testChargeRefused},
		{"ChargeIdempotency", testChargeIdempotency},
		{"ChargeRecordsOutliveOlderOnesSweep", testChargeRecordsKept},
		{"ConcurrentChargesRespectLimits", testConcurrentCharges},
		{"ConcurrentReplaysChargeOnce", testConcurrentReplays},
		{"ChargeBatchInOrder", testChargeBatch},
		{"ChargeBatchAllOrNone", testChargeBatchAllOrNone},
		{"ConcurrentBatchesRespectLimits", testConcurrentBatches},
		{"Health", testHealth},
		{"TaskScopeWrittenOnce", testTaskScope},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, newStore(t))
		})
	}
}

func binding(task string, exp time.Time) *policyv1.HandleBinding {
	return &policyv1.HandleBinding{TaskId: task, Requester: "alice", Capability: "notes.get", MappingId: "map_1", MappingRevision: 1, ExpireTime: timestamppb.New(exp)}
}

func testHandleCreate(t *testing.T, st policy.Store) {
	ctx := context.Background()
	exp := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	if _, err := st.GetHandle(ctx, "k_missing"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("missing handle: err = %v, want ErrNotFound", err)
	}
	first := binding("task_1", exp)
	if err := st.CreateHandle(ctx, "k1", first); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateHandle(ctx, "k1", binding("task_2", exp)); !errors.Is(err, store.ErrExists) {
		t.Errorf("second create: err = %v, want ErrExists", err)
	}
	got, err := st.GetHandle(ctx, "k1")
	if err != nil || !proto.Equal(got, first) {
		t.Errorf("get = %v, %v; want the first binding unchanged", got, err)
	}

	// Fifty concurrent creates of one key: exactly one wins.
	var wg sync.WaitGroup
	var mu sync.Mutex
	won := 0
	for i := range 50 {
		wg.Go(func() {
			err := st.CreateHandle(ctx, "k_race", binding(fmt.Sprintf("task_%d", i), exp))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				won++
			case !errors.Is(err, store.ErrExists):
				t.Errorf("create: %v", err)
			}
		})
	}
	wg.Wait()
	if won != 1 {
		t.Errorf("%d concurrent creates of one key succeeded, want 1", won)
	}
}

func testHandleExpiry(t *testing.T, st policy.Store) {
	ctx := context.Background()
	now := time.Now()
	for key, exp := range map[string]time.Time{
		"k_old":    now.Add(-2 * time.Hour),
		"k_recent": now.Add(-30 * time.Minute),
		"k_fresh":  now.Add(time.Hour),
	} {
		if err := st.CreateHandle(ctx, key, binding("task_1", exp)); err != nil {
			t.Fatal(err)
		}
	}
	// An expired handle is still readable until swept, so a late use can
	// be told "expired" rather than "unknown".
	if _, err := st.GetHandle(ctx, "k_recent"); err != nil {
		t.Errorf("expired, unswept handle: %v", err)
	}
	n, err := st.DeleteExpiredHandles(ctx, now.Add(-time.Hour))
	if err != nil || n != 1 {
		t.Fatalf("sweep before now-1h = %d, %v; want 1", n, err)
	}
	if _, err := st.GetHandle(ctx, "k_old"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("swept handle: err = %v, want ErrNotFound", err)
	}
	n, err = st.DeleteExpiredHandles(ctx, now)
	if err != nil || n != 1 {
		t.Fatalf("sweep before now = %d, %v; want 1", n, err)
	}
	if n, err := st.DeleteExpiredHandles(ctx, now); err != nil || n != 0 {
		t.Errorf("second sweep = %d, %v; want 0", n, err)
	}
	if _, err := st.GetHandle(ctx, "k_fresh"); err != nil {
		t.Errorf("unexpired handle after sweeps: %v", err)
	}
}

func budgets(task, requester string, maxCalls int64) (*policyv1.Budget, *policyv1.Budget) {
	return &policyv1.Budget{Scope: "task/" + task, MaxCalls: maxCalls, MaxResponseBytes: 1000, MaxCostMicros: 1000},
		&policyv1.Budget{Scope: "requester/" + requester, MaxCalls: 1000, MaxResponseBytes: 100000, MaxCostMicros: 100000}
}

func op(key, task, requester string, maxCalls, calls, bytes int64) policy.ChargeOp {
	tb, rb := budgets(task, requester, maxCalls)
	return policy.ChargeOp{
		Key: "task/" + task + "\x00" + key, Task: tb, Requester: rb,
		Request: &policyv1.ChargeRequest{TaskId: task, Requester: requester, Calls: calls, ResponseBytes: bytes, IdempotencyKey: key},
	}
}

// charge applies one op.
func charge(ctx context.Context, st policy.Store, op policy.ChargeOp) (policy.ChargeResult, error) {
	res, err := st.Charge(ctx, op)
	if err != nil {
		return policy.ChargeResult{}, err
	}
	return res[0], nil
}

func testCharge(t *testing.T, st policy.Store) {
	ctx := context.Background()
	res, err := charge(ctx, st, op("k1", "task_1", "alice", 5, 2, 100))
	if err != nil {
		t.Fatal(err)
	}
	if res.Replayed || res.Task.GetUsedCalls() != 2 || res.Task.GetUsedResponseBytes() != 100 || res.Task.GetMaxCalls() != 5 {
		t.Errorf("first charge = %+v", res)
	}
	// The requester budget spans tasks.
	res, err = charge(ctx, st, op("k1", "task_2", "alice", 5, 3, 0))
	if err != nil {
		t.Fatal(err)
	}
	if res.Task.GetUsedCalls() != 3 || res.Requester.GetUsedCalls() != 5 || res.Requester.GetScope() != "requester/alice" {
		t.Errorf("second task's charge = %+v; want task 3 calls, requester 5", res)
	}
}

func testChargeRefused(t *testing.T, st policy.Store) {
	ctx := context.Background()
	if _, err := charge(ctx, st, op("k1", "task_1", "alice", 5, 4, 0)); err != nil {
		t.Fatal(err)
	}
	_, err := charge(ctx, st, op("k2", "task_1", "alice", 5, 2, 0))
	var be *policy.BudgetExceededError
	if !errors.As(err, &be) || be.Scope != "task/task_1" || be.Dimension != "calls" || be.Used != 4 || be.Requested != 2 || be.Limit != 5 {
		t.Fatalf("over the limit: err = %v, want BudgetExceededError on task calls", err)
	}
	// Nothing was charged: not the requester, and k2 is free for a charge
	// that fits.
	res, err := charge(ctx, st, op("k2", "task_1", "alice", 5, 1, 0))
	if err != nil || res.Replayed || res.Task.GetUsedCalls() != 5 || res.Requester.GetUsedCalls() != 5 {
		t.Errorf("charge after refusal = %+v, %v; want 5 calls used on both budgets", res, err)
	}
}

// A sweep of the charge records made before a charge keeps its record:
// its replay still charges nothing.
func testChargeRecordsKept(t *testing.T, st policy.Store) {
	ctx := context.Background()
	o := op("k1", "task_1", "alice", 5, 2, 10)
	o.At = time.Now()
	if _, err := charge(ctx, st, o); err != nil {
		t.Fatal(err)
	}
	if n, err := st.ForgetBefore(ctx, o.At); err != nil || n != 0 {
		t.Errorf("sweep of the charges before the only one = %d, %v; want 0", n, err)
	}
	if res, err := charge(ctx, st, o); err != nil || !res.Replayed || res.Task.GetUsedCalls() != 2 {
		t.Errorf("replay after the sweep = %+v, %v; want replayed with 2 calls used", res, err)
	}
}

func testChargeIdempotency(t *testing.T, st policy.Store) {
	ctx := context.Background()
	if _, err := charge(ctx, st, op("k1", "task_1", "alice", 5, 2, 10)); err != nil {
		t.Fatal(err)
	}
	res, err := charge(ctx, st, op("k1", "task_1", "alice", 5, 2, 10))
	if err != nil || !res.Replayed || res.Task.GetUsedCalls() != 2 {
		t.Errorf("replay = %+v, %v; want replayed with 2 calls used", res, err)
	}
	if _, err := charge(ctx, st, op("k1", "task_1", "alice", 5, 3, 10)); !errors.Is(err, policy.ErrIdempotencyConflict) {
		t.Errorf("reuse with other amounts: err = %v, want ErrIdempotencyConflict", err)
	}
}

// testConcurrentCharges sends 50 one-call charges at a task budget of 30
// calls at once: exactly 30 are charged, on both budgets.
func testConcurrentCharges(t *testing.T, st policy.Store) {
	ctx := context.Background()
	const n, limit = 50, 30
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok, refused := 0, 0
	for i := range n {
		wg.Go(func() {
			_, err := charge(ctx, st, op(fmt.Sprintf("k%d", i), "task_1", "alice", limit, 1, 7))
			var be *policy.BudgetExceededError
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case errors.As(err, &be):
				refused++
			default:
				t.Errorf("charge %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	if ok != limit || refused != n-limit {
		t.Errorf("%d charged, %d refused; want %d and %d", ok, refused, limit, n-limit)
	}
	res, err := charge(ctx, st, op("k0", "task_1", "alice", limit, 1, 7))
	if err != nil && !errors.As(err, new(*policy.BudgetExceededError)) {
		t.Fatal(err)
	}
	if err == nil && (res.Task.GetUsedCalls() != limit || res.Requester.GetUsedCalls() != limit || res.Task.GetUsedResponseBytes() != 7*limit) {
		t.Errorf("budgets after the race: task %d calls %d bytes, requester %d calls; want %d, %d, %d",
			res.Task.GetUsedCalls(), res.Task.GetUsedResponseBytes(), res.Requester.GetUsedCalls(), limit, 7*limit, limit)
	}
}

// testConcurrentReplays sends one charge 50 times at once: it is applied
// once and every other call is a replay.
func testConcurrentReplays(t *testing.T, st policy.Store) {
	ctx := context.Background()
	var wg sync.WaitGroup
	var mu sync.Mutex
	applied := 0
	for range 50 {
		wg.Go(func() {
			res, err := charge(ctx, st, op("same", "task_1", "alice", 100, 1, 0))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("charge: %v", err)
				return
			}
			if !res.Replayed {
				applied++
			}
			if res.Task.GetUsedCalls() != 1 {
				t.Errorf("a replay saw %d calls used, want 1", res.Task.GetUsedCalls())
			}
		})
	}
	wg.Wait()
	if applied != 1 {
		t.Errorf("charge applied %d times, want 1", applied)
	}
}

// testChargeBatch charges several ops in one step: each sees what the ones
// before it charged, and each result is the budgets just after it.
func testChargeBatch(t *testing.T, st policy.Store) {
	ctx := context.Background()
	res, err := st.Charge(ctx,
		op("k1", "task_1", "alice", 5, 2, 100),
		op("k1", "task_2", "alice", 5, 3, 0),
		op("k1", "task_1", "alice", 5, 2, 100), // the first again: a replay
		op("k2", "task_1", "alice", 5, 1, 0),
	)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		replayed          bool
		task, requester   int64
		taskResponseBytes int64
	}{{false, 2, 2, 100}, {false, 3, 5, 0}, {true, 2, 5, 100}, {false, 3, 6, 100}}
	if len(res) != len(want) {
		t.Fatalf("%d results, want %d", len(res), len(want))
	}
	for i, w := range want {
		r := res[i]
		if r.Replayed != w.replayed || r.Task.GetUsedCalls() != w.task || r.Requester.GetUsedCalls() != w.requester || r.Task.GetUsedResponseBytes() != w.taskResponseBytes {
			t.Errorf("result %d: replayed %t, task %d calls %d bytes, requester %d calls; want %+v",
				i, r.Replayed, r.Task.GetUsedCalls(), r.Task.GetUsedResponseBytes(), r.Requester.GetUsedCalls(), w)
		}
	}
	// What the batch charged is stored: the same charges again are replays.
	again, err := charge(ctx, st, op("k2", "task_1", "alice", 5, 1, 0))
	if err != nil || !again.Replayed || again.Task.GetUsedCalls() != 3 || again.Requester.GetUsedCalls() != 6 {
		t.Errorf("replay after the batch = %+v, %v; want replayed, task 3 calls, requester 6", again, err)
	}
}

// testChargeBatchAllOrNone: one refused op (over a limit, or a key reused
// within the batch) leaves every budget and key as it was.
func testChargeBatchAllOrNone(t *testing.T, st policy.Store) {
	ctx := context.Background()
	_, err := st.Charge(ctx, op("k1", "task_1", "alice", 5, 2, 0), op("k2", "task_2", "alice", 5, 6, 0))
	var be *policy.BudgetExceededError
	if !errors.As(err, &be) || be.Scope != "task/task_2" || be.Dimension != "calls" || be.Requested != 6 {
		t.Fatalf("batch over a limit: err = %v, want BudgetExceededError on task_2 calls", err)
	}
	_, err = st.Charge(ctx, op("k3", "task_1", "alice", 5, 1, 0), op("k3", "task_1", "alice", 5, 2, 0))
	if !errors.Is(err, policy.ErrIdempotencyConflict) {
		t.Fatalf("batch reusing a key: err = %v, want ErrIdempotencyConflict", err)
	}
	for _, k := range []string{"k1", "k3"} {
		res, err := charge(ctx, st, op(k, "task_1", "alice", 5, 1, 0))
		if err != nil || res.Replayed {
			t.Errorf("%s after the refused batches = %+v, %v; want a first charge", k, res, err)
		}
	}
	res, err := charge(ctx, st, op("k4", "task_2", "alice", 5, 1, 0))
	if err != nil || res.Task.GetUsedCalls() != 1 || res.Requester.GetUsedCalls() != 3 {
		t.Errorf("charge after the refused batches = %+v, %v; want task_2 1 call, requester 3", res, err)
	}
}

// testConcurrentBatches sends ten batches of five one-call charges at a
// task budget of 30 calls at once: exactly six batches are charged, whole.
func testConcurrentBatches(t *testing.T, st policy.Store) {
	ctx := context.Background()
	const batches, size, limit = 10, 5, 30
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok := 0
	for b := range batches {
		wg.Go(func() {
			ops := make([]policy.ChargeOp, size)
			for i := range ops {
				ops[i] = op(fmt.Sprintf("b%d-%d", b, i), "task_1", "alice", limit, 1, 0)
			}
			_, err := st.Charge(ctx, ops...)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case !errors.As(err, new(*policy.BudgetExceededError)):
				t.Errorf("batch %d: %v", b, err)
			}
		})
	}
	wg.Wait()
	if ok != limit/size {
		t.Errorf("%d batches charged, want %d", ok, limit/size)
	}
	var be *policy.BudgetExceededError
	if _, err := charge(ctx, st, op("last", "task_1", "alice", limit, 1, 0)); !errors.As(err, &be) || be.Used != limit {
		t.Errorf("task budget after the race: err = %v, want exceeded with %d calls used", err, limit)
	}
	res, err := charge(ctx, st, op("other", "task_2", "alice", limit, 1, 0))
	if err != nil || res.Requester.GetUsedCalls() != limit+1 {
		t.Errorf("requester budget after the race = %+v, %v; want %d calls used", res, err, limit+1)
	}
}

func testHealth(t *testing.T, st policy.Store) {
	ctx := context.Background()
	if _, err := st.GetHealth(ctx, "conn_never"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("never reported: err = %v, want ErrNotFound", err)
	}
	for _, state := range []policyv1.HealthState{policyv1.HealthState_HEALTH_STATE_DEGRADED, policyv1.HealthState_HEALTH_STATE_HEALTHY} {
		if err := st.PutHealth(ctx, &policyv1.ConnectionHealth{ConnectionId: "conn_1", State: state}); err != nil {
			t.Fatal(err)
		}
		got, err := st.GetHealth(ctx, "conn_1")
		if err != nil || got.GetState() != state {
			t.Errorf("health = %v, %v; want %v", got, err, state)
		}
	}
}

func testTaskScope(t *testing.T, st policy.Store) {
	ctx := context.Background()
	if _, err := st.GetTaskScope(ctx, "task_missing"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("missing task: err = %v, want ErrNotFound", err)
	}
	// The scope keeps the task's budget with it.
	first := &policyv1.TaskScope{TaskId: "task_1", Requester: "alice", SourceScope: []string{"notes://a", "notes://b"},
		RegisterTime: timestamppb.New(time.Now().Truncate(time.Microsecond)),
		Budget:       &registryv1.TaskBudget{MaxCalls: 3, MaxCostMicros: 250}}
	if err := st.CreateTaskScope(ctx, first); err != nil {
		t.Fatal(err)
	}
	wider := proto.CloneOf(first)
	wider.Requester, wider.SourceScope = "mallory", append(wider.SourceScope, "notes://secret")
	wider.Budget.MaxCalls = 1000
	if err := st.CreateTaskScope(ctx, wider); !errors.Is(err, store.ErrExists) {
		t.Errorf("second create: err = %v, want ErrExists", err)
	}
	got, err := st.GetTaskScope(ctx, "task_1")
	if err != nil || !proto.Equal(got, first) {
		t.Errorf("get = %v, %v; want the first scope unchanged", got, err)
	}

	// Concurrent registrations of one task with different scopes: exactly
	// one is stored, whole.
	var wg sync.WaitGroup
	var mu sync.Mutex
	won := map[string]bool{}
	for i := range 20 {
		wg.Go(func() {
			ts := &policyv1.TaskScope{TaskId: "task_race", Requester: fmt.Sprintf("user_%d", i), SourceScope: []string{fmt.Sprintf("notes://%d", i)}}
			err := st.CreateTaskScope(ctx, ts)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				won[ts.GetRequester()] = true
			case !errors.Is(err, store.ErrExists):
				t.Errorf("create: %v", err)
			}
		})
	}
	wg.Wait()
	if len(won) != 1 {
		t.Fatalf("%d concurrent registrations of one task succeeded, want 1", len(won))
	}
	got, err = st.GetTaskScope(ctx, "task_race")
	if err != nil || !won[got.GetRequester()] || len(got.GetSourceScope()) != 1 || got.GetSourceScope()[0] != "notes://"+strings.TrimPrefix(got.GetRequester(), "user_") {
		t.Errorf("stored scope %v, %v is not the winner's", got, err)
	}
}
