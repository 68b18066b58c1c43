package policy

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/v0m3/v0m3/internal/apierror"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// TestDecide: one round trip resolves a call's handle, authorizes and
// charges it once per intent; a denial or a handle that does not resolve
// charges nothing; a refused charge carries the decisions it came after;
// a charge for another task or requester is refused; on both stores.
func TestDecide(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, opts options) {
		opts.task = Limits{Calls: 2}
		e := newEnv(t, opts)
		ctx := context.Background()
		h := mint(t, e, publicTarget, nil)
		decide := func(purpose, token, key string) *policyv1.DecideRequest {
			r := &policyv1.DecideRequest{
				Requester: alice(), TaskId: "task_1", Capability: capRetrieve, ConnectionId: connOK,
				MappingId: mapRetrieve, MappingRevision: 2, Purpose: purpose,
				EffectClass: registryv1.EffectClass_EFFECT_CLASS_RETRIEVAL,
			}
			if token != "" {
				r.Handles = []*policyv1.HandleUse{{Field: "source", Token: token}}
			}
			if key != "" {
				r.Charge = &policyv1.ChargeRequest{TaskId: "task_1", Requester: "alice", Calls: 1, IdempotencyKey: key}
			}
			return r
		}
		used := func() int64 {
			t.Helper()
			// A zero charge under a fresh key reads the budget.
			res, err := e.client.Charge(ctx, &policyv1.ChargeRequest{TaskId: "task_1", Requester: "alice", IdempotencyKey: "read-" + t.Name()})
			if err != nil {
				t.Fatalf("read budget: %v", err)
			}
			return res.GetTask().GetUsedCalls()
		}

		res, err := e.client.Decide(ctx, decide("source_review", h.GetToken(), "int_1"))
		if err != nil {
			t.Fatalf("Decide: %v", err)
		}
		if hs := res.GetHandles(); len(hs) != 1 || hs[0].GetField() != "source" || hs[0].GetBinding().GetTarget() != publicTarget {
			t.Errorf("handles = %v, want source bound to the public target", hs)
		}
		if ds := res.GetDecisions(); len(ds) != 1 || ds[0].GetDecision() != policyv1.Decision_DECISION_ALLOW {
			t.Errorf("decisions = %v, want one allow", ds)
		}
		if got := res.GetCharge().GetTask().GetUsedCalls(); got != 1 {
			t.Errorf("task used calls after the charge = %d, want 1", got)
		}
		// The same intent again charges nothing more.
		if res, err := e.client.Decide(ctx, decide("source_review", h.GetToken(), "int_1")); err != nil || res.GetCharge().GetTask().GetUsedCalls() != 1 {
			t.Fatalf("Decide again: %v, %v; want the same charge", res, err)
		}

		for _, tc := range []struct {
			name   string
			in     *policyv1.DecideRequest
			code   codes.Code
			reason string // "" when the call is denied without an error
		}{
			{"denied on the connection", decide("publish", "", "int_2"), codes.OK, ""},
			{"unknown handle", decide("source_review", "h_"+"x0123456789abcdef0123456789abcdef0123456789", "int_3"), codes.NotFound, "HANDLE_UNKNOWN"},
			{"charge for another requester", func() *policyv1.DecideRequest {
				r := decide("source_review", "", "int_4")
				r.Charge.Requester = "mallory"
				return r
			}(), codes.InvalidArgument, "FIELD_INVALID"},
		} {
			res, err := e.client.Decide(ctx, tc.in)
			if tc.reason == "" {
				if err != nil || len(res.GetDecisions()) != 1 || res.GetDecisions()[0].GetDecision() != policyv1.Decision_DECISION_DENY || res.GetCharge() != nil {
					t.Errorf("%s: %v, %v; want one deny and no charge", tc.name, res, err)
				}
			} else if !apierror.Is(err, tc.code, tc.reason) {
				t.Errorf("%s: err = %v, want %v %s", tc.name, err, tc.code, tc.reason)
			}
			if got := used(); got != 1 {
				t.Errorf("%s: task used calls = %d, want 1 (nothing charged)", tc.name, got)
			}
		}

		// The second call uses the task's last call; the third is refused
		// for budget, with what was decided in the status details.
		if _, err := e.client.Decide(ctx, decide("source_review", "", "int_5")); err != nil {
			t.Fatalf("second call: %v", err)
		}
		_, err = e.client.Decide(ctx, decide("source_review", h.GetToken(), "int_6"))
		wantExceeded(t, err, "task/task_1", "calls", 2)
		var decided *policyv1.DecideResponse
		for _, d := range status.Convert(err).Details() {
			if r, ok := d.(*policyv1.DecideResponse); ok {
				decided = r
			}
		}
		if ds := decided.GetDecisions(); len(ds) != 1 || ds[0].GetDecision() != policyv1.Decision_DECISION_ALLOW || decided.GetCharge() != nil {
			t.Errorf("refused charge carries %v, want the allow decision and no charge", decided)
		}
	})
}
