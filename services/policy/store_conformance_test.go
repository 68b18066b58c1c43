package policy_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/v0m3/v0m3/internal/redistest"
	"github.com/v0m3/v0m3/internal/store"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	"github.com/v0m3/v0m3/services/policy"
	"github.com/v0m3/v0m3/services/policy/storetest"
)

func TestBoltStoreConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) policy.Store {
		db, err := store.Open(filepath.Join(t.TempDir(), "policy.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		return policy.NewBoltStore(db)
	})
}

func TestRedisStoreConformance(t *testing.T) {
	t.Parallel()
	addr, _ := redistest.Start(t)
	storetest.Run(t, func(t *testing.T) policy.Store {
		return policy.NewRedisStore(redistest.Client(t, addr), redistest.Prefix(t))
	})
}

// chargeOp is a charge of one call to task_1 and to the requester budget
// of one period, ending at ends, under key, made at.
func chargeOp(key, requesterScope string, at, ends time.Time) policy.ChargeOp {
	return policy.ChargeOp{At: at, RequesterEnds: ends, Key: "task/task_1\x00" + key,
		Task:      &policyv1.Budget{Scope: "task/task_1", MaxCalls: 100, MaxResponseBytes: 100, MaxCostMicros: 100},
		Requester: &policyv1.Budget{Scope: requesterScope, MaxCalls: 100, MaxResponseBytes: 100, MaxCostMicros: 100},
		Request:   &policyv1.ChargeRequest{TaskId: "task_1", Requester: "alice", Calls: 1, IdempotencyKey: key}}
}

// TestBoltForgetsOldRecords: the embedded store deletes the records of the
// charges made before the cutoff, whose keys then charge again, and the
// requester budgets whose period ended before it, and keeps the later
// ones; the task's budget stays.
func TestBoltForgetsOldRecords(t *testing.T) {
	t.Parallel()
	db, err := store.Open(filepath.Join(t.TempDir(), "policy.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	st := policy.NewBoltStore(db)
	ctx := t.Context()
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	old := chargeOp("old", "requester/alice/p0", t0, t0.Add(30*time.Minute))
	fresh := chargeOp("fresh", "requester/alice/p1", t0.Add(2*time.Hour), t0.Add(3*time.Hour))
	for _, o := range []policy.ChargeOp{old, fresh} {
		if _, err := st.Charge(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := st.ForgetBefore(ctx, t0.Add(time.Hour)); err != nil || n != 2 {
		t.Fatalf("sweep = %d, %v; want the older charge and the ended budget deleted", n, err)
	}
	if n, err := st.ForgetBefore(ctx, t0.Add(time.Hour)); err != nil || n != 0 {
		t.Errorf("second sweep = %d, %v; want nothing left to delete", n, err)
	}
	res, err := st.Charge(ctx, old, fresh)
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Replayed || res[0].Requester.GetUsedCalls() != 1 {
		t.Errorf("the old key = %+v; want charged again, to a budget started afresh", res[0])
	}
	if !res[1].Replayed || res[1].Requester.GetUsedCalls() != 1 || res[1].Task.GetUsedCalls() != 3 {
		t.Errorf("the fresh key = %+v; want replayed, its budget kept, the task's 3 calls kept", res[1])
	}
}

// TestRedisRecordTTL: Redis forgets a charge record on its own
// ChargeRetention after it was written, and a requester budget as long
// after its period ended; a task's budget has no TTL.
func TestRedisRecordTTL(t *testing.T) {
	t.Parallel()
	addr, _ := redistest.Start(t)
	c := redistest.Client(t, addr)
	st := policy.NewRedisStore(c, "chargettl")
	ctx := t.Context()
	ends := time.Now().Add(time.Hour)
	if _, err := st.Charge(ctx, chargeOp("k", "requester/alice/p0", time.Now(), ends)); err != nil {
		t.Fatal(err)
	}
	within := func(want time.Duration) func(time.Duration) bool {
		return func(d time.Duration) bool { return d > want-time.Minute && d <= want }
	}
	for pattern, want := range map[string]func(time.Duration) bool{
		"{chargettl:policy}:charge:*":                  within(policy.ChargeRetention),
		"{chargettl:policy}:budget:requester/alice/p0": within(time.Hour + policy.ChargeRetention),
		"{chargettl:policy}:budget:task/task_1":        func(d time.Duration) bool { return d == -1 }, // no TTL
	} {
		keys, err := c.Keys(ctx, pattern).Result()
		if err != nil || len(keys) != 1 {
			t.Fatalf("%s: %v, %v", pattern, keys, err)
		}
		if ttl, err := c.PTTL(ctx, keys[0]).Result(); err != nil || !want(ttl) {
			t.Errorf("%s: TTL %v, %v", keys[0], ttl, err)
		}
	}
}

// TestRedisHandleTTL checks that Redis forgets a handle on its own a day
// after it expires, even if no sweep ever runs.
func TestRedisHandleTTL(t *testing.T) {
	t.Parallel()
	addr, _ := redistest.Start(t)
	c := redistest.Client(t, addr)
	st := policy.NewRedisStore(c, "ttl")
	ctx := context.Background()
	exp := time.Now().Add(time.Hour)
	if err := st.CreateHandle(ctx, "k1", &policyv1.HandleBinding{TaskId: "t", ExpireTime: timestamppb.New(exp)}); err != nil {
		t.Fatal(err)
	}
	keys, err := c.Keys(ctx, "{ttl:policy}:handle:*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("handle keys = %v, %v", keys, err)
	}
	ttl, err := c.PTTL(ctx, keys[0]).Result()
	if err != nil {
		t.Fatal(err)
	}
	if ttl < 24*time.Hour || ttl > 25*time.Hour+time.Minute {
		t.Errorf("handle TTL = %v, want about expiry + 24h (25h)", ttl)
	}
}
