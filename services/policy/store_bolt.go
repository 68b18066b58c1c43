package policy

import (
	"context"
	"errors"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/v0m3/v0m3/internal/store"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
)

// Buckets of the embedded store.
const (
	bucketHandles = "handles"
	bucketBudgets = "budgets"
	bucketCharges = "charges"
	// bucketChargeTimes indexes charge records by when they were made
	// ("<unix nanos>\x00<key>"), so the oldest are found first.
	bucketChargeTimes = "charge_times"
	// bucketBudgetEnds indexes requester budgets by when their period
	// ends ("<unix nanos>\x00<scope>").
	bucketBudgetEnds = "budget_ends"
	bucketHealth     = "health"
	bucketTasks      = "tasks"
)

// boltStore is the embedded-file Store.
type boltStore struct {
	db *store.DB
}

// NewBoltStore returns a Store on an embedded bbolt database.
func NewBoltStore(db *store.DB) Store { return &boltStore{db: db} }

func (b *boltStore) CreateHandle(ctx context.Context, key string, h *policyv1.HandleBinding) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return b.db.Update(func(tx *store.Tx) error { return tx.Create(bucketHandles, key, h) })
}

func (b *boltStore) GetHandle(ctx context.Context, key string) (*policyv1.HandleBinding, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	h := &policyv1.HandleBinding{}
	if err := b.db.View(func(tx *store.Tx) error { return tx.Get(bucketHandles, key, h) }); err != nil {
		return nil, err
	}
	return h, nil
}

func (b *boltStore) DeleteExpiredHandles(ctx context.Context, before time.Time) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	n := 0
	err := b.db.Update(func(tx *store.Tx) error {
		var expired []string
		err := store.List(tx, bucketHandles, "", func() *policyv1.HandleBinding { return &policyv1.HandleBinding{} },
			func(key string, h *policyv1.HandleBinding) error {
				if h.GetExpireTime().AsTime().Before(before) {
					expired = append(expired, key)
				}
				return nil
			})
		if err != nil {
			return err
		}
		// Deleting while a cursor walks the bucket skips keys, so delete
		// after the walk.
		for _, k := range expired {
			if err := tx.Delete(bucketHandles, k); err != nil {
				return err
			}
		}
		n = len(expired)
		return nil
	})
	return n, err
}

func (b *boltStore) Charge(ctx context.Context, ops ...ChargeOp) ([]ChargeResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var res []ChargeResult
	// Concurrent charges share a commit (store.DB.Batch); every run sets
	// res anew.
	err := b.db.Batch(func(tx *store.Tx) error {
		var (
			w   chargeWrites
			err error
		)
		// Budgets started by this transaction: only a new requester
		// budget is indexed by its period's end (see ForgetBefore).
		started := map[string]bool{}
		res, w, err = applyCharges(ops, func(tmpl *policyv1.Budget) (*policyv1.Budget, error) {
			b, isNew, err := loadBudget(tx, tmpl)
			started[tmpl.GetScope()] = isNew
			return b, err
		}, func(key string) (*policyv1.ChargeRequest, error) {
			prev := &policyv1.ChargeRequest{}
			switch err := tx.Get(bucketCharges, key, prev); {
			case errors.Is(err, store.ErrNotFound):
				return nil, nil
			case err != nil:
				return nil, err
			}
			return prev, nil
		})
		if err != nil {
			return err
		}
		for _, bud := range w.budgets {
			if err := tx.Put(bucketBudgets, bud.GetScope(), bud); err != nil {
				return err
			}
		}
		for _, op := range ops {
			scope := op.Requester.GetScope()
			if op.RequesterEnds.IsZero() || !started[scope] {
				continue
			}
			started[scope] = false // once, however many ops share it
			if err := tx.Put(bucketBudgetEnds, timeKey(op.RequesterEnds, scope), wrapperspb.String(scope)); err != nil {
				return err
			}
		}
		for _, op := range w.charges {
			if err := tx.Put(bucketCharges, op.Key, op.Request); err != nil {
				return err
			}
			at := op.At
			if at.IsZero() {
				at = time.Now()
			}
			if err := tx.Put(bucketChargeTimes, timeKey(at, op.Key), wrapperspb.String(op.Key)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// timeKey is the key, in a time index, of key at t: time order is key
// order.
func timeKey(t time.Time, key string) string {
	return store.SeqKey(t.UnixNano()) + "\x00" + key
}

// maxForgotten bounds the records one transaction of ForgetBefore deletes.
const maxForgotten = 10000

// errEnough stops a walk that found what it needed.
var errEnough = errors.New("enough")

func (b *boltStore) ForgetBefore(ctx context.Context, before time.Time) (int, error) {
	charges, err := b.deleteIndexed(ctx, bucketChargeTimes, bucketCharges, before)
	if err != nil {
		return charges, err
	}
	budgets, err := b.deleteIndexed(ctx, bucketBudgetEnds, bucketBudgets, before)
	return charges + budgets, err
}

// deleteIndexed deletes the records of bucket whose time in index (see
// timeKey) is before t, oldest first, at most maxForgotten a
// transaction, and returns how many it deleted.
func (b *boltStore) deleteIndexed(ctx context.Context, index, bucket string, before time.Time) (int, error) {
	cutoff := store.SeqKey(before.UnixNano())
	total := 0
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		n := 0
		err := b.db.Update(func(tx *store.Tx) error {
			var old, keys []string
			err := store.List(tx, index, "", func() *wrapperspb.StringValue { return &wrapperspb.StringValue{} },
				func(k string, v *wrapperspb.StringValue) error {
					if k >= cutoff || len(old) == maxForgotten {
						return errEnough
					}
					old, keys = append(old, k), append(keys, v.GetValue())
					return nil
				})
			if err != nil && !errors.Is(err, errEnough) {
				return err
			}
			// Deleting while a cursor walks the bucket skips keys.
			for i, k := range old {
				if err := tx.Delete(index, k); err != nil {
					return err
				}
				if err := tx.Delete(bucket, keys[i]); err != nil {
					return err
				}
			}
			n = len(old)
			return nil
		})
		total += n
		if err != nil || n < maxForgotten {
			return total, err
		}
	}
}

// loadBudget reads a budget, or starts it from the template (isNew).
func loadBudget(tx *store.Tx, tmpl *policyv1.Budget) (b *policyv1.Budget, isNew bool, err error) {
	b = &policyv1.Budget{}
	switch err := tx.Get(bucketBudgets, tmpl.GetScope(), b); {
	case errors.Is(err, store.ErrNotFound):
		return unusedBudget(tmpl), true, nil
	case err != nil:
		return nil, false, err
	}
	return withLimits(b, tmpl), false, nil
}

func (b *boltStore) CreateTaskScope(ctx context.Context, ts *policyv1.TaskScope) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return b.db.Update(func(tx *store.Tx) error { return tx.Create(bucketTasks, ts.GetTaskId(), ts) })
}

func (b *boltStore) GetTaskScope(ctx context.Context, taskID string) (*policyv1.TaskScope, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ts := &policyv1.TaskScope{}
	if err := b.db.View(func(tx *store.Tx) error { return tx.Get(bucketTasks, taskID, ts) }); err != nil {
		return nil, err
	}
	return ts, nil
}

func (b *boltStore) PutHealth(ctx context.Context, h *policyv1.ConnectionHealth) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return b.db.Update(func(tx *store.Tx) error { return tx.Put(bucketHealth, h.GetConnectionId(), h) })
}

func (b *boltStore) GetHealth(ctx context.Context, connectionID string) (*policyv1.ConnectionHealth, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	h := &policyv1.ConnectionHealth{}
	if err := b.db.View(func(tx *store.Tx) error { return tx.Get(bucketHealth, connectionID, h) }); err != nil {
		return nil, err
	}
	return h, nil
}
