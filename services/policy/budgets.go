package policy

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/failpoint"
	"github.com/v0m3/v0m3/internal/groupsend"
	"github.com/v0m3/v0m3/internal/store"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
)

// Charge atomically charges a task's and a requester's budgets. If either
// would exceed any limit, nothing is charged and the error names the budget
// and dimension. Charging the same idempotency key again charges nothing
// and returns the current budgets. A task is charged against the budget it
// was registered with (see RegisterTask); an unregistered task against the
// configured task budget. A requester is charged against the budget of the
// current period, with the limits configured now.
func (s *Server) Charge(ctx context.Context, req *policyv1.ChargeRequest) (*policyv1.ChargeResponse, error) {
	op, periodEnd, err := s.chargeOp(ctx, req)
	if err != nil {
		return nil, err
	}
	p := &pendingCharge{op: op}
	failpoint.Hit(FailPointChargeBefore)
	err = s.charges.Send(ctx, []*pendingCharge{p})
	if err == nil {
		failpoint.Hit(FailPointChargeAfter)
	}
	var exceeded *BudgetExceededError
	switch {
	case errors.As(err, &exceeded):
		s.log.InfoContext(ctx, "budget exceeded", "task_id", req.GetTaskId(), "requester", req.GetRequester(),
			"budget", exceeded.Scope, "dimension", exceeded.Dimension, "limit", exceeded.Limit, "used", exceeded.Used,
			"requested", exceeded.Requested)
		var resets time.Time
		if exceeded.Scope == op.Requester.GetScope() {
			resets = periodEnd
		}
		return nil, budgetExceeded(exceeded, resets, s.now())
	case errors.Is(err, ErrIdempotencyConflict):
		return nil, apierror.New(codes.FailedPrecondition, "IDEMPOTENCY_KEY_REUSED",
			"this idempotency key was already used for a different charge; use a new key for a new charge",
			map[string]string{"task_id": req.GetTaskId()})
	case err != nil:
		return nil, s.storeError(ctx, err, "charge the budgets")
	}
	res := p.res
	s.log.DebugContext(ctx, "budgets charged", "task_id", req.GetTaskId(), "requester", req.GetRequester(),
		"replayed", res.Replayed, "task_used_calls", res.Task.GetUsedCalls(), "requester_used_calls", res.Requester.GetUsedCalls())
	return &policyv1.ChargeResponse{Task: res.Task, Requester: res.Requester}, nil
}

// pendingCharge is one charge handed to the store's shared charges, and
// its result once applied.
type pendingCharge struct {
	op  ChargeOp
	res ChargeResult
}

// newStoreCharges returns the sender of charges to st: concurrent charges
// (Decide's and Charge's alike) are applied together, in one store
// transaction (one round trip on Redis, one commit on the file store), and
// without optimistic conflicts among themselves on the budgets they share
// (every call of one requester charges the requester's budget). A lone
// charge goes at once. Charge is all or none, so a shared transaction
// refused for its content (a budget exceeded, a key reused) is applied
// again one caller at a time, and each caller learns its own answer.
func newStoreCharges(st Store) *groupsend.Sender[*pendingCharge] {
	return groupsend.New(func(ctx context.Context, pending []*pendingCharge) error {
		ops := make([]ChargeOp, len(pending))
		for i, p := range pending {
			ops[i] = p.op
		}
		res, err := st.Charge(ctx, ops...)
		if err != nil {
			return err
		}
		for i, r := range res {
			pending[i].res = r
		}
		return nil
	}, groupsend.Options[*pendingCharge]{
		MaxItems: maxSharedCharges,
		Isolate: func(err error) bool {
			return errors.As(err, new(*BudgetExceededError)) || errors.Is(err, ErrIdempotencyConflict)
		},
	})
}

// maxSharedCharges bounds the charges one store transaction applies.
const maxSharedCharges = 256

// chargeOp checks a charge request and turns it into the store's
// operation; periodEnd is when the requester budget it charges ends.
func (s *Server) chargeOp(ctx context.Context, req *policyv1.ChargeRequest) (op ChargeOp, periodEnd time.Time, err error) {
	var bad []apierror.FieldViolation
	for _, f := range []struct{ name, v string }{
		{"task_id", req.GetTaskId()}, {"requester", req.GetRequester()}, {"idempotency_key", req.GetIdempotencyKey()},
	} {
		if f.v == "" {
			bad = append(bad, apierror.FieldViolation{Field: f.name, Description: "required"})
		}
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"calls", req.GetCalls()}, {"response_bytes", req.GetResponseBytes()}, {"cost_micros", req.GetCostMicros()}} {
		if f.v < 0 {
			bad = append(bad, apierror.FieldViolation{Field: f.name, Description: "must not be negative"})
		}
	}
	if len(bad) > 0 {
		return ChargeOp{}, time.Time{}, apierror.InvalidArgument(apierror.ReasonFieldInvalid, "the charge request is invalid", bad...)
	}

	tl, rl := s.deps.TaskBudget, s.deps.RequesterBudget
	switch ts, err := s.taskScope(ctx, req.GetTaskId()); {
	case err == nil:
		tl = taskLimits(ts.GetBudget(), s.deps.TaskBudget)
	case !errors.Is(err, store.ErrNotFound):
		return ChargeOp{}, time.Time{}, s.storeError(ctx, err, "read the task scope")
	}
	now := s.now()
	start := now.UTC().Truncate(rl.Period)
	end := start.Add(rl.Period)
	return ChargeOp{
		At: now, RequesterEnds: end,
		// Keys are scoped to the task, so two tasks cannot collide.
		Key: "task/" + req.GetTaskId() + "\x00" + req.GetIdempotencyKey(),
		Task: &policyv1.Budget{Scope: "task/" + req.GetTaskId(),
			MaxCalls: tl.Calls, MaxResponseBytes: tl.ResponseBytes, MaxCostMicros: tl.CostMicros},
		Requester: &policyv1.Budget{Scope: requesterScope(req.GetRequester(), start),
			MaxCalls: rl.Calls, MaxResponseBytes: rl.ResponseBytes, MaxCostMicros: rl.CostMicros},
		Request: req,
	}, end, nil
}

// requesterScope names a requester's budget for the period that starts at
// start: "requester/<id>/<start, RFC 3339>". Each period's budget is a
// budget of its own, so a new period starts from nothing used.
func requesterScope(requester string, start time.Time) string {
	return "requester/" + requester + "/" + start.Format(time.RFC3339)
}

// budgetExceeded is RESOURCE_EXHAUSTED with an ErrorInfo naming the budget
// and a google.rpc.QuotaFailure. A budget that resets (a requester's, at
// the end of its period) says when, in the metadata ("resets_at") and as
// a google.rpc.RetryInfo.
func budgetExceeded(e *BudgetExceededError, resets, now time.Time) error {
	md := map[string]string{
		"budget":    e.Scope,
		"dimension": e.Dimension,
		"limit":     strconv.FormatInt(e.Limit, 10),
		"used":      strconv.FormatInt(e.Used, 10),
		"requested": strconv.FormatInt(e.Requested, 10),
	}
	msg := fmt.Sprintf("budget %s would be exceeded: %s used %d of %d, this charge needs %d; nothing was charged",
		e.Scope, e.Dimension, e.Used, e.Limit, e.Requested)
	if !resets.IsZero() {
		md["resets_at"] = resets.UTC().Format(time.RFC3339)
		msg += "; a new budget starts at " + md["resets_at"]
	}
	err := apierror.New(codes.ResourceExhausted, "BUDGET_EXCEEDED", msg, md)
	details := []protoadapt.MessageV1{&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{
		Subject:     e.Scope,
		Description: fmt.Sprintf("%s limit %d reached", e.Dimension, e.Limit),
	}}}}
	if !resets.IsZero() {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(max(resets.Sub(now), 0))})
	}
	if d, derr := status.Convert(err).WithDetails(details...); derr == nil {
		return d.Err()
	}
	return err
}
