package policy

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	"github.com/v0m3/v0m3/services/internal/apierror"
)

func charge(calls, bytes, cost int64, key string) *policyv1.ChargeRequest {
	return &policyv1.ChargeRequest{TaskId: "task_1", Requester: "alice", Calls: calls, ResponseBytes: bytes, CostMicros: cost, IdempotencyKey: key}
}

func TestChargeDefaults(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	resp, err := e.client.Charge(context.Background(), charge(1, 1000, 20, "k1"))
	if err != nil {
		t.Fatalf("Charge: %v", err)
	}
	tb, rb := resp.GetTask(), resp.GetRequester()
	if tb.GetScope() != "task/task_1" || tb.GetMaxCalls() != 50 || tb.GetMaxResponseBytes() != 8<<20 || tb.GetMaxCostMicros() != 1_000_000 {
		t.Errorf("task budget = %v", tb)
	}
	if rb.GetScope() != "requester/alice" || rb.GetMaxCalls() != 500 || rb.GetMaxResponseBytes() != 64<<20 || rb.GetMaxCostMicros() != 10_000_000 {
		t.Errorf("requester budget = %v", rb)
	}
	for _, b := range []*policyv1.Budget{tb, rb} {
		if b.GetUsedCalls() != 1 || b.GetUsedResponseBytes() != 1000 || b.GetUsedCostMicros() != 20 {
			t.Errorf("%s usage = %d/%d/%d, want 1/1000/20", b.GetScope(), b.GetUsedCalls(), b.GetUsedResponseBytes(), b.GetUsedCostMicros())
		}
	}
}

func TestChargeExceeded(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		task      Limits
		requester Limits
		first     *policyv1.ChargeRequest
		second    *policyv1.ChargeRequest
		budget    string
		dimension string
		limit     int64
		used      int64
	}{
		{"task calls", Limits{Calls: 1}, Limits{}, charge(1, 0, 0, "a"), charge(1, 0, 0, "b"), "task/task_1", "calls", 1, 1},
		{"task response bytes", Limits{ResponseBytes: 100}, Limits{}, charge(1, 60, 0, "a"), charge(1, 41, 0, "b"), "task/task_1", "response_bytes", 100, 60},
		{"task cost", Limits{CostMicros: 500}, Limits{}, charge(1, 0, 500, "a"), charge(0, 0, 1, "b"), "task/task_1", "cost_micros", 500, 500},
		{"requester calls", Limits{}, Limits{Calls: 2}, charge(2, 0, 0, "a"), charge(1, 0, 0, "b"), "requester/alice", "calls", 2, 2},
		{"requester response bytes", Limits{}, Limits{ResponseBytes: 10}, charge(0, 10, 0, "a"), charge(0, 1, 0, "b"), "requester/alice", "response_bytes", 10, 10},
		{"requester cost", Limits{}, Limits{CostMicros: 7}, charge(0, 0, 3, "a"), charge(0, 0, 5, "b"), "requester/alice", "cost_micros", 7, 3},
		{"single charge over the limit", Limits{ResponseBytes: 5}, Limits{}, charge(0, 0, 0, "a"), charge(0, 6, 0, "b"), "task/task_1", "response_bytes", 5, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, options{task: tc.task, requester: tc.requester})
			ctx := context.Background()
			before, err := e.client.Charge(ctx, tc.first)
			if err != nil {
				t.Fatalf("first charge: %v", err)
			}
			_, err = e.client.Charge(ctx, tc.second)
			if !apierror.Is(err, codes.ResourceExhausted, "BUDGET_EXCEEDED") {
				t.Fatalf("err = %v, want RESOURCE_EXHAUSTED BUDGET_EXCEEDED", err)
			}
			md := apierror.Info(err).GetMetadata()
			if md["budget"] != tc.budget || md["dimension"] != tc.dimension ||
				md["limit"] != strconv.FormatInt(tc.limit, 10) || md["used"] != strconv.FormatInt(tc.used, 10) {
				t.Errorf("metadata = %v, want budget=%s dimension=%s limit=%d used=%d", md, tc.budget, tc.dimension, tc.limit, tc.used)
			}
			var qf *errdetails.QuotaFailure
			for _, d := range status.Convert(err).Details() {
				if q, ok := d.(*errdetails.QuotaFailure); ok {
					qf = q
				}
			}
			if qf == nil || len(qf.GetViolations()) != 1 || qf.GetViolations()[0].GetSubject() != tc.budget {
				t.Errorf("QuotaFailure = %v, want one violation on %s", qf, tc.budget)
			}

			// Nothing was charged, on either budget: a zero charge with a
			// fresh key shows the usage of the first charge alone.
			after, err := e.client.Charge(ctx, charge(0, 0, 0, "probe"))
			if err != nil {
				t.Fatalf("probe: %v", err)
			}
			for _, pair := range [][2]*policyv1.Budget{{before.GetTask(), after.GetTask()}, {before.GetRequester(), after.GetRequester()}} {
				b, a := pair[0], pair[1]
				if a.GetUsedCalls() != b.GetUsedCalls() || a.GetUsedResponseBytes() != b.GetUsedResponseBytes() || a.GetUsedCostMicros() != b.GetUsedCostMicros() {
					t.Errorf("%s changed by a refused charge: %v -> %v", b.GetScope(), b, a)
				}
			}
		})
	}
}

func TestChargeIdempotent(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	ctx := context.Background()
	first, err := e.client.Charge(ctx, charge(1, 100, 10, "attempt_1"))
	if err != nil {
		t.Fatal(err)
	}
	again, err := e.client.Charge(ctx, charge(1, 100, 10, "attempt_1"))
	if err != nil {
		t.Fatalf("replay: %v", err)
	}
	if again.GetTask().GetUsedCalls() != 1 || again.GetRequester().GetUsedCalls() != 1 || again.GetTask().GetUsedResponseBytes() != 100 {
		t.Errorf("replay charged again: %v (first %v)", again, first)
	}
	// The replay reports current budgets, including later charges.
	if _, err := e.client.Charge(ctx, charge(1, 0, 0, "attempt_2")); err != nil {
		t.Fatal(err)
	}
	again, err = e.client.Charge(ctx, charge(1, 100, 10, "attempt_1"))
	if err != nil || again.GetTask().GetUsedCalls() != 2 {
		t.Errorf("replay after another charge: %v, %v; want current usage 2 calls", again, err)
	}
	// A key reused for a different charge is refused, not silently replayed.
	_, err = e.client.Charge(ctx, charge(5, 100, 10, "attempt_1"))
	if !apierror.Is(err, codes.FailedPrecondition, "IDEMPOTENCY_KEY_REUSED") {
		t.Errorf("reused key: err = %v, want FAILED_PRECONDITION IDEMPOTENCY_KEY_REUSED", err)
	}
	// The same key in another task is another charge.
	other := charge(1, 0, 0, "attempt_1")
	other.TaskId = "task_2"
	resp, err := e.client.Charge(ctx, other)
	if err != nil || resp.GetTask().GetUsedCalls() != 1 || resp.GetRequester().GetUsedCalls() != 3 {
		t.Errorf("same key, other task: %v, %v", resp, err)
	}
}

func TestChargeAtomicUnderConcurrency(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{task: Limits{Calls: 10}})
	ctx := context.Background()
	const n = 50
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok, exhausted := 0, 0
	var other []error
	for i := range n {
		wg.Go(func() {
			_, err := e.client.Charge(ctx, charge(1, 10, 1, fmt.Sprintf("k%d", i)))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case apierror.Is(err, codes.ResourceExhausted, "BUDGET_EXCEEDED"):
				exhausted++
			default:
				other = append(other, err)
			}
		})
	}
	wg.Wait()
	if ok != 10 || exhausted != n-10 || len(other) > 0 {
		t.Fatalf("ok=%d exhausted=%d other=%v, want 10/%d/none", ok, exhausted, other, n-10)
	}
	resp, err := e.client.Charge(ctx, charge(0, 0, 0, "probe"))
	if err != nil {
		t.Fatal(err)
	}
	// The requester was charged exactly for the successful task charges.
	if resp.GetTask().GetUsedCalls() != 10 || resp.GetRequester().GetUsedCalls() != 10 || resp.GetRequester().GetUsedResponseBytes() != 100 {
		t.Errorf("after the race: task %v requester %v", resp.GetTask(), resp.GetRequester())
	}
}

func TestChargeValidates(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	_, err := e.client.Charge(context.Background(), &policyv1.ChargeRequest{Calls: -1})
	want := []string{"calls", "idempotency_key", "requester", "task_id"}
	if got := apierror.Fields(err); apierror.Code(err) != codes.InvalidArgument || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("err = %v (fields %v), want INVALID_ARGUMENT on %v", err, got, want)
	}
}
