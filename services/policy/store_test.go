package policy

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/store"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
)

func TestStateSurvivesReopen(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{task: Limits{Calls: 3}})
	ctx := context.Background()

	h := mint(t, e, publicTarget, nil)
	if _, err := e.client.Charge(ctx, charge(2, 10, 1, "k1")); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.ReportConnectionHealth(ctx, &policyv1.ReportConnectionHealthRequest{
		ConnectionId: connOK, State: policyv1.HealthState_HEALTH_STATE_DEGRADED,
	}); err != nil {
		t.Fatal(err)
	}

	e.reopen()

	// The degraded report persisted.
	resp, err := e.client.Eligible(ctx, &policyv1.EligibleRequest{
		TaskId: "task_1", Requester: alice(), Purpose: "source_review", NeededCapabilities: []string{capRetrieve},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range resp.GetCapabilities() {
		if c.GetCapability() == capRetrieve && c.GetReason() != policyv1.NotOfferedReason_NOT_OFFERED_REASON_CONNECTION_DEGRADED {
			t.Errorf("after reopen %s = %v/%v, want CONNECTION_DEGRADED", capRetrieve, c.GetStage(), c.GetReason())
		}
	}
	if _, err := e.client.ReportConnectionHealth(ctx, &policyv1.ReportConnectionHealthRequest{
		ConnectionId: connOK, State: policyv1.HealthState_HEALTH_STATE_HEALTHY,
	}); err != nil {
		t.Fatal(err)
	}

	// The handle still resolves.
	if _, err := e.client.ResolveHandle(ctx, resolveReq(h.GetToken())); err != nil {
		t.Errorf("resolve after reopen: %v", err)
	}
	// The idempotency record and usage persisted.
	again, err := e.client.Charge(ctx, charge(2, 10, 1, "k1"))
	if err != nil || again.GetTask().GetUsedCalls() != 2 {
		t.Errorf("replay after reopen: %v, %v; want 2 calls used", again, err)
	}
	_, err = e.client.Charge(ctx, charge(2, 0, 0, "k2"))
	if !apierror.Is(err, codes.ResourceExhausted, "BUDGET_EXCEEDED") {
		t.Errorf("over the limit after reopen: err = %v", err)
	}
}

func TestBoltStoreHandles(t *testing.T) {
	t.Parallel()
	db, err := store.Open(filepath.Join(t.TempDir(), "policy.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	st := NewBoltStore(db)
	ctx := context.Background()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

	old := &policyv1.HandleBinding{TaskId: "t", ExpireTime: timestamppb.New(now.Add(-2 * time.Hour))}
	fresh := &policyv1.HandleBinding{TaskId: "t", ExpireTime: timestamppb.New(now.Add(time.Hour))}
	if err := st.CreateHandle(ctx, "k_old", old); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateHandle(ctx, "k_fresh", fresh); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateHandle(ctx, "k_fresh", old); !errors.Is(err, store.ErrExists) {
		t.Errorf("second create of a key: %v, want ErrExists", err)
	}
	n, err := st.DeleteExpiredHandles(ctx, now.Add(-time.Hour))
	if err != nil || n != 1 {
		t.Fatalf("DeleteExpiredHandles = %d, %v; want 1", n, err)
	}
	if _, err := st.GetHandle(ctx, "k_old"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("swept handle: %v, want ErrNotFound", err)
	}
	if _, err := st.GetHandle(ctx, "k_fresh"); err != nil {
		t.Errorf("fresh handle: %v", err)
	}
	if _, err := st.GetHealth(ctx, "conn_never"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("health never reported: %v, want ErrNotFound", err)
	}
}
