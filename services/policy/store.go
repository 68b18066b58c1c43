package policy

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
)

// Store is the policy service's persistence contract. Every implementation
// must make Charge atomic (every budget and idempotency record it touches
// changes together or not at all), and CreateHandle and CreateTaskScope
// create-if-absent.
type Store interface {
	// CreateHandle stores a handle binding under key, failing with
	// store.ErrExists if the key is taken.
	CreateHandle(ctx context.Context, key string, b *policyv1.HandleBinding) error
	// GetHandle returns the binding stored under key, or store.ErrNotFound.
	GetHandle(ctx context.Context, key string) (*policyv1.HandleBinding, error)
	// DeleteExpiredHandles deletes bindings that expired before t and
	// returns how many it deleted.
	DeleteExpiredHandles(ctx context.Context, before time.Time) (int, error)

	// Charge applies ops in order as one atomic step (see ChargeOp and
	// applyCharges) and returns the budgets after each. It returns a
	// *BudgetExceededError when a limit would be exceeded and
	// ErrIdempotencyConflict when an op's Key was already used for a
	// different charge; then nothing at all is charged. The record of a
	// charge's key is kept at least ChargeRetention.
	Charge(ctx context.Context, ops ...ChargeOp) ([]ChargeResult, error)
	// ForgetBefore deletes the records of charges made (ChargeOp.At)
	// before t, whose keys then charge again, and the requester budgets
	// whose period ended (ChargeOp.RequesterEnds) before t, and returns
	// how many it deleted. A store whose records expire on their own
	// ChargeRetention after those times (Redis) deletes none.
	ForgetBefore(ctx context.Context, before time.Time) (int, error)

	// CreateTaskScope stores a task's scope under its task id, failing with
	// store.ErrExists if the task is already registered: a scope never
	// changes once written.
	CreateTaskScope(ctx context.Context, ts *policyv1.TaskScope) error
	// GetTaskScope returns a task's scope, or store.ErrNotFound.
	GetTaskScope(ctx context.Context, taskID string) (*policyv1.TaskScope, error)

	// PutHealth records the latest health of a connection.
	PutHealth(ctx context.Context, h *policyv1.ConnectionHealth) error
	// GetHealth returns the latest health of a connection, or
	// store.ErrNotFound when none was ever reported.
	GetHealth(ctx context.Context, connectionID string) (*policyv1.ConnectionHealth, error)
}

// ChargeRetention is how long the record of a charge's idempotency key is
// kept: every charge of a call is made again, if at all, within the
// call's recovery (its approval, a retry, evidence coming back), and a
// record kept for good would add two per governed call to the store
// forever. A charge replayed later is charged again. A requester's
// budget is kept as long after its period ends, for whoever reads it.
const ChargeRetention = 24 * time.Hour

// ChargeOp is one atomic charge against a task's and a requester's budget.
type ChargeOp struct {
	// At is when the charge is made, by the service's clock: its record
	// is kept ChargeRetention from then.
	At time.Time
	// RequesterEnds is when the requester budget's period ends: the
	// budget is kept ChargeRetention after. Zero keeps it.
	RequesterEnds time.Time
	// Key is the idempotency key, already scoped to the task. A second
	// charge with the same key and the same amounts charges nothing and
	// returns the current budgets.
	Key string
	// Task is the task budget's scope and maxima, used to create the budget
	// on first charge and to fill maxima recorded as 0.
	Task *policyv1.Budget
	// Requester is the requester budget's scope and maxima, likewise.
	Requester *policyv1.Budget
	// Request holds the amounts charged.
	Request *policyv1.ChargeRequest
}

// ChargeResult is the budgets after a charge.
type ChargeResult struct {
	// Task is the task's budget.
	Task *policyv1.Budget
	// Requester is the requester's budget.
	Requester *policyv1.Budget
	// Replayed is true when the idempotency key had already been charged.
	Replayed bool
}

// ErrIdempotencyConflict means an idempotency key was reused for a charge
// with different amounts.
var ErrIdempotencyConflict = errors.New("policy: idempotency key already used for a different charge")

// BudgetExceededError names the budget and dimension a charge would exceed.
type BudgetExceededError struct {
	// Scope is "task/<id>" or "requester/<id>/<period start>".
	Scope string
	// Dimension is "calls", "response_bytes" or "cost_micros".
	Dimension string
	// Limit is the maximum.
	Limit int64
	// Used is what was used before the refused charge.
	Used int64
	// Requested is what the refused charge asked for.
	Requested int64
}

// Error implements error.
func (e *BudgetExceededError) Error() string {
	return fmt.Sprintf("budget %s exceeded: %s used %d of %d, charge of %d refused", e.Scope, e.Dimension, e.Used, e.Limit, e.Requested)
}

// chargeWrites is what applyCharges decided to store: each budget it
// changed and the charge records it added.
type chargeWrites struct {
	budgets []*policyv1.Budget
	charges []ChargeOp
}

// applyCharges decides ops in order, as both stores do inside their
// transaction: budget reads a stored budget (or starts it from its
// template, see withLimits), recorded reads the charge recorded under an
// idempotency key (nil when none). A later op sees what earlier ops
// charged and recorded, so a batch decides as the same charges sent one
// by one would. The first refusal is the error, and then nothing is to be
// written.
func applyCharges(ops []ChargeOp, budget func(tmpl *policyv1.Budget) (*policyv1.Budget, error),
	recorded func(key string) (*policyv1.ChargeRequest, error)) ([]ChargeResult, chargeWrites, error) {
	var w chargeWrites
	budgets := make(map[string]*policyv1.Budget, 2)
	load := func(tmpl *policyv1.Budget) (*policyv1.Budget, error) {
		if b, ok := budgets[tmpl.GetScope()]; ok {
			return b, nil
		}
		b, err := budget(tmpl)
		if err != nil {
			return nil, err
		}
		budgets[tmpl.GetScope()] = b
		return b, nil
	}
	changed := map[string]bool{}
	added := map[string]*policyv1.ChargeRequest{}
	results := make([]ChargeResult, len(ops))
	for i, op := range ops {
		task, err := load(op.Task)
		if err != nil {
			return nil, w, err
		}
		requester, err := load(op.Requester)
		if err != nil {
			return nil, w, err
		}
		prev, ok := added[op.Key]
		if !ok {
			if prev, err = recorded(op.Key); err != nil {
				return nil, w, err
			}
		}
		replayed := prev != nil
		if replayed && !sameCharge(prev, op.Request) {
			return nil, w, ErrIdempotencyConflict
		}
		if !replayed {
			if err := applyCharge(op.Request, task, requester); err != nil {
				return nil, w, err
			}
			for _, b := range []*policyv1.Budget{task, requester} {
				if !changed[b.GetScope()] {
					changed[b.GetScope()] = true
					w.budgets = append(w.budgets, b)
				}
			}
			added[op.Key] = op.Request
			w.charges = append(w.charges, op)
		}
		results[i] = ChargeResult{Task: task, Requester: requester, Replayed: replayed}
		if i < len(ops)-1 {
			// Later ops change the same budgets in place.
			results[i].Task, results[i].Requester = proto.CloneOf(task), proto.CloneOf(requester)
		}
	}
	return results, w, nil
}

// applyCharge checks every limit of every budget first and only then adds
// the amounts, so a refused charge changes nothing. Budgets whose maxima are
// 0 take the maxima of their template. Implementations of Store call it
// inside their transaction.
func applyCharge(req *policyv1.ChargeRequest, budgets ...*policyv1.Budget) error {
	type dim struct {
		name      string
		max, used *int64
		amount    int64
	}
	dims := func(b *policyv1.Budget) []dim {
		return []dim{
			{"calls", &b.MaxCalls, &b.UsedCalls, req.GetCalls()},
			{"response_bytes", &b.MaxResponseBytes, &b.UsedResponseBytes, req.GetResponseBytes()},
			{"cost_micros", &b.MaxCostMicros, &b.UsedCostMicros, req.GetCostMicros()},
		}
	}
	for _, b := range budgets {
		for _, d := range dims(b) {
			// Written as a subtraction so huge amounts cannot overflow.
			if d.amount > *d.max-*d.used {
				return &BudgetExceededError{Scope: b.GetScope(), Dimension: d.name, Limit: *d.max, Used: *d.used, Requested: d.amount}
			}
		}
	}
	for _, b := range budgets {
		for _, d := range dims(b) {
			*d.used += d.amount
		}
	}
	return nil
}

// sameCharge reports whether two charge requests ask for the same thing.
func sameCharge(a, b *policyv1.ChargeRequest) bool {
	return a.GetTaskId() == b.GetTaskId() && a.GetRequester() == b.GetRequester() &&
		a.GetCalls() == b.GetCalls() && a.GetResponseBytes() == b.GetResponseBytes() &&
		a.GetCostMicros() == b.GetCostMicros()
}

// withLimits gives a stored budget the template's limits, those in force
// now (the configured requester budget; the task's registered budget, its
// unset dimensions from the configured defaults): raising a limit takes
// effect at the next charge instead of never for a budget already charged.
// A template dimension of 0 leaves the stored limit.
func withLimits(b, tmpl *policyv1.Budget) *policyv1.Budget {
	if v := tmpl.GetMaxCalls(); v > 0 {
		b.MaxCalls = v
	}
	if v := tmpl.GetMaxResponseBytes(); v > 0 {
		b.MaxResponseBytes = v
	}
	if v := tmpl.GetMaxCostMicros(); v > 0 {
		b.MaxCostMicros = v
	}
	return b
}

// unusedBudget is a budget charged for the first time: the template's
// limits, nothing used.
func unusedBudget(tmpl *policyv1.Budget) *policyv1.Budget {
	b := proto.CloneOf(tmpl)
	b.UsedCalls, b.UsedResponseBytes, b.UsedCostMicros = 0, 0, 0
	return b
}
