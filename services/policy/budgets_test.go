package policy

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/redistest"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
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
	if rb.GetScope() != "requester/alice/2026-03-01T00:00:00Z" || rb.GetMaxCalls() != 500 || rb.GetMaxResponseBytes() != 64<<20 || rb.GetMaxCostMicros() != 10_000_000 {
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
		{"requester calls", Limits{}, Limits{Calls: 2}, charge(2, 0, 0, "a"), charge(1, 0, 0, "b"), "requester/alice/2026-03-01T00:00:00Z", "calls", 2, 2},
		{"requester response bytes", Limits{}, Limits{ResponseBytes: 10}, charge(0, 10, 0, "a"), charge(0, 1, 0, "b"), "requester/alice/2026-03-01T00:00:00Z", "response_bytes", 10, 10},
		{"requester cost", Limits{}, Limits{CostMicros: 7}, charge(0, 0, 3, "a"), charge(0, 0, 5, "b"), "requester/alice/2026-03-01T00:00:00Z", "cost_micros", 7, 3},
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

// A requester's budget lasts one period (a day by default, midnight to
// midnight UTC): once spent, charges are refused with when the next one
// starts (metadata and RetryInfo), and the next period starts from
// nothing used, while the task's budget goes on counting.
func TestRequesterBudgetLastsAPeriod(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		period time.Duration
		resets time.Time
	}{
		{"a day by default", 0, time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC)},
		{"an hour", time.Hour, time.Date(2026, 3, 1, 13, 0, 0, 0, time.UTC)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, options{requester: Limits{Calls: 2, Period: tc.period}})
			ctx := t.Context()
			for _, key := range []string{"a", "b"} {
				if _, err := e.client.Charge(ctx, charge(1, 0, 0, key)); err != nil {
					t.Fatalf("charge %s: %v", key, err)
				}
			}
			_, err := e.client.Charge(ctx, charge(1, 0, 0, "c"))
			if !apierror.Is(err, codes.ResourceExhausted, "BUDGET_EXCEEDED") {
				t.Fatalf("third charge: %v, want BUDGET_EXCEEDED", err)
			}
			if got := apierror.Info(err).GetMetadata()["resets_at"]; got != tc.resets.Format(time.RFC3339) {
				t.Errorf("resets_at %q, want %s", got, tc.resets.Format(time.RFC3339))
			}
			var retry *errdetails.RetryInfo
			for _, d := range status.Convert(err).Details() {
				if r, ok := d.(*errdetails.RetryInfo); ok {
					retry = r
				}
			}
			if want := tc.resets.Sub(e.clock.Now()); retry.GetRetryDelay().AsDuration() != want {
				t.Errorf("RetryInfo %v, want a delay of %v", retry, want)
			}

			e.clock.Advance(tc.resets.Sub(e.clock.Now()))
			resp, err := e.client.Charge(ctx, charge(1, 0, 0, "c"))
			if err != nil {
				t.Fatalf("a charge in the next period: %v", err)
			}
			if r := resp.GetRequester(); r.GetScope() != "requester/alice/"+tc.resets.Format(time.RFC3339) || r.GetUsedCalls() != 1 {
				t.Errorf("the next period's budget = %v, want a fresh one with 1 call used", r)
			}
			if resp.GetTask().GetUsedCalls() != 3 {
				t.Errorf("the task's budget = %v, want 3 calls used across periods", resp.GetTask())
			}
		})
	}
}

// Limits are those configured when a charge is made: raising one lets the
// next charge through, for a requester and a task already charged, on
// both stores.
func TestRaisedLimitsApplyAtTheNextCharge(t *testing.T) {
	t.Parallel()
	redisAddr, _ := redistest.Start(t)
	for _, tc := range []struct {
		name  string
		redis bool
		first options
	}{
		{"requester on a file", false, options{requester: Limits{Calls: 1}}},
		{"task on a file", false, options{task: Limits{Calls: 1}}},
		{"requester on redis", true, options{requester: Limits{Calls: 1}}},
		{"task on redis", true, options{task: Limits{Calls: 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			opts := tc.first
			if tc.redis {
				opts.redisAddr = redisAddr
			}
			e := newEnv(t, opts)
			ctx := t.Context()
			if _, err := e.client.Charge(ctx, charge(1, 0, 0, "a")); err != nil {
				t.Fatal(err)
			}
			if _, err := e.client.Charge(ctx, charge(1, 0, 0, "b")); !apierror.Is(err, codes.ResourceExhausted, "BUDGET_EXCEEDED") {
				t.Fatalf("over the limit: %v, want BUDGET_EXCEEDED", err)
			}
			e.opts.task.Calls, e.opts.requester.Calls = max(e.opts.task.Calls, 1)*10, max(e.opts.requester.Calls, 1)*10
			e.reopen()
			resp, err := e.client.Charge(ctx, charge(1, 0, 0, "b"))
			if err != nil {
				t.Fatalf("after raising the limit: %v", err)
			}
			if resp.GetTask().GetUsedCalls() != 2 || resp.GetRequester().GetUsedCalls() != 2 {
				t.Errorf("budgets after the raise = %v / %v; want 2 calls used on each", resp.GetTask(), resp.GetRequester())
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

// heldStore holds its first Charge until released and records how many
// charges each Charge carried.
type heldStore struct {
	Store
	hold, held chan struct{}
	mu         sync.Mutex
	sizes      []int
}

func (h *heldStore) Charge(ctx context.Context, ops ...ChargeOp) ([]ChargeResult, error) {
	h.mu.Lock()
	first := len(h.sizes) == 0
	h.sizes = append(h.sizes, len(ops))
	h.mu.Unlock()
	if first {
		close(h.held)
		<-h.hold
	}
	return h.Store.Charge(ctx, ops...)
}

// TestConcurrentChargesShareAStoreTransaction: charges arriving while
// one is being stored are stored together, in one transaction; when one
// of them exceeds its budget the transaction is refused and each is
// stored again alone, so only that caller is refused and every other
// charge is made, exactly once.
func TestConcurrentChargesShareAStoreTransaction(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		calls   []int64 // of the waiting charges, each in a task of its own
		refused int     // index in calls of the charge over budget, or -1
		sizes   []int
	}{
		{"every charge fits", []int64{1, 2, 3}, -1, []int{1, 3}},
		{"one charge over its task's budget", []int64{1, 4, 3}, 1, []int{1, 3, 1, 1, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := &heldStore{hold: make(chan struct{}), held: make(chan struct{})}
			e := newEnv(t, options{task: Limits{Calls: 3}, wrap: func(st Store) Store { h.Store = st; return h }})
			ctx := context.Background()
			taskCharge := func(i int, calls int64) *policyv1.ChargeRequest {
				c := charge(calls, 0, 0, "k")
				c.TaskId = fmt.Sprintf("task_%d", i)
				return c
			}
			var wg sync.WaitGroup
			wg.Go(func() {
				if _, err := e.client.Charge(ctx, taskCharge(99, 1)); err != nil {
					t.Errorf("leading charge: %v", err)
				}
			})
			<-h.held
			errs := make([]error, len(tc.calls))
			for i, calls := range tc.calls {
				wg.Go(func() { _, errs[i] = e.client.Charge(ctx, taskCharge(i, calls)) })
				for e.srv.charges.Waiting() < i+1 {
					runtime.Gosched()
				}
			}
			close(h.hold)
			wg.Wait()

			for i, err := range errs {
				switch {
				case i == tc.refused && !apierror.Is(err, codes.ResourceExhausted, "BUDGET_EXCEEDED"):
					t.Errorf("charge %d: %v, want BUDGET_EXCEEDED", i, err)
				case i != tc.refused && err != nil:
					t.Errorf("charge %d: %v, want charged", i, err)
				}
			}
			h.mu.Lock()
			sizes := slices.Clone(h.sizes)
			h.mu.Unlock()
			if !slices.Equal(sizes, tc.sizes) {
				t.Errorf("charges per store transaction = %v, want %v", sizes, tc.sizes)
			}
			// Each charge made was made once: again, it is a replay.
			for i, calls := range tc.calls {
				resp, err := e.client.Charge(ctx, taskCharge(i, calls))
				if i == tc.refused {
					continue
				}
				if err != nil || resp.GetTask().GetUsedCalls() != calls {
					t.Errorf("task_%d charged again: %v, %v; want %d calls used, once", i, resp, err, calls)
				}
			}
		})
	}
}
