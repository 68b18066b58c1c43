package policy

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/v0m3/v0m3/internal/redisstore"
	"github.com/v0m3/v0m3/internal/store"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
)

// Redis layout, under "{<prefix>:policy}:":
//
//	handle:<key>      HandleBinding, with a Redis TTL (see below)
//	handles:expiry    ZSET handle key -> expire time (unix microseconds)
//	budget:<scope>    Budget; a requester's with a Redis TTL ending
//	                  ChargeRetention after its period
//	charge:<key>      ChargeRequest recorded under an idempotency key, with
//	                  a Redis TTL of ChargeRetention
//	health:<conn>     ConnectionHealth
//	task:<id>         TaskScope, written once (SET NX)
//
// A handle's Redis TTL ends handleRetention after its expire time, so Redis
// forgets it on its own even if no sweep runs, while a late use inside the
// retention is still told "expired" rather than "unknown" (the service
// checks expire_time itself; the TTL never decides validity).
type redisPolicyStore struct {
	c redis.UniversalClient
	k redisstore.Keys
	// spec sends a charge on budgets this replica charged last in one
	// round trip (redisstore.Speculator).
	spec *redisstore.Speculator
}

// rememberedBudgets bounds the budgets (and charge records) the store
// remembers for one-round-trip charges.
const rememberedBudgets = 1024

// NewRedisStore returns the policy Store on Redis; prefix names the
// deployment, so several deployments can share one Redis.
func NewRedisStore(c redis.UniversalClient, prefix string) Store {
	return &redisPolicyStore{c: c, k: redisstore.NewKeys(prefix, "policy"), spec: redisstore.NewSpeculator(c, rememberedBudgets)}
}

// createHandle sets the binding only if the key is absent, with its TTL,
// and indexes its expiry, all or nothing.
var createHandle = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PXAT', ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4])
return 1
`)

// deleteExpired deletes up to ARGV[2] handles that expired before ARGV[1]
// (exclusive) and returns how many existed. Entries whose key Redis
// already dropped by TTL are removed from the index without counting.
var deleteExpired = redis.NewScript(`
local keys = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local n = 0
for _, k in ipairs(keys) do
  n = n + redis.call('DEL', KEYS[2] .. k)
  redis.call('ZREM', KEYS[1], k)
end
return {n, #keys}
`)

func (r *redisPolicyStore) handle(key string) string { return r.k.Key("handle", key) }

func (r *redisPolicyStore) CreateHandle(ctx context.Context, key string, b *policyv1.HandleBinding) error {
	v, err := redisstore.Marshal(b)
	if err != nil {
		return err
	}
	exp := b.GetExpireTime().AsTime()
	forget := exp.Add(handleRetention)
	if !forget.After(time.Now()) {
		// Already past retention: keep it a moment so the caller's own
		// read-after-create still sees it, then let Redis drop it.
		forget = time.Now().Add(time.Minute)
	}
	ok, err := createHandle.Run(ctx, r.c, []string{r.handle(key), r.k.Key("handles", "expiry")},
		v, forget.UnixMilli(), exp.UnixMicro(), key).Int()
	if err != nil {
		return fmt.Errorf("create handle: %w", err)
	}
	if ok == 0 {
		return store.ErrExists
	}
	return nil
}

func (r *redisPolicyStore) GetHandle(ctx context.Context, key string) (*policyv1.HandleBinding, error) {
	h := &policyv1.HandleBinding{}
	if err := redisstore.Get(ctx, r.c, r.handle(key), h); err != nil {
		return nil, err
	}
	return h, nil
}

func (r *redisPolicyStore) DeleteExpiredHandles(ctx context.Context, before time.Time) (int, error) {
	const batch = 500
	total := 0
	for {
		res, err := deleteExpired.Run(ctx, r.c, []string{r.k.Key("handles", "expiry"), r.handle("")},
			strconv.FormatInt(before.UnixMicro(), 10), batch).Int64Slice()
		if err != nil {
			return total, fmt.Errorf("delete expired handles: %w", err)
		}
		total += int(res[0])
		if res[1] < batch {
			return total, nil
		}
	}
}

func (r *redisPolicyStore) Charge(ctx context.Context, ops ...ChargeOp) ([]ChargeResult, error) {
	// Every budget and idempotency record the ops touch is watched (or
	// checked, see redisstore.Speculator), the charges are decided by the
	// same applyCharges the embedded store uses, and written in one step:
	// a concurrent charge makes it fail and these are decided again, so
	// no charge is ever lost or applied twice.
	var keys []string
	budgetAt, chargeAt := map[string]int{}, map[string]int{}
	slot := func(at map[string]int, kind, id string) {
		if _, ok := at[id]; !ok {
			at[id] = len(keys)
			keys = append(keys, r.k.Key(kind, id))
		}
	}
	for _, op := range ops {
		slot(budgetAt, "budget", op.Task.GetScope())
		slot(budgetAt, "budget", op.Requester.GetScope())
		slot(chargeAt, "charge", op.Key)
		// A charge's idempotency key is new but for a replay, which the
		// transaction finds out.
		r.spec.Expect(keys[chargeAt[op.Key]], nil)
	}
	var res []ChargeResult
	err := r.spec.Update(ctx, keys, func(_ redis.Cmdable, vals []any) (redisstore.Write, error) {
		var (
			w   chargeWrites
			err error
		)
		res, w, err = applyCharges(ops, func(tmpl *policyv1.Budget) (*policyv1.Budget, error) {
			return decodeBudget(vals[budgetAt[tmpl.GetScope()]], tmpl)
		}, func(key string) (*policyv1.ChargeRequest, error) {
			v := vals[chargeAt[key]]
			if v == nil {
				return nil, nil
			}
			prev := &policyv1.ChargeRequest{}
			return prev, redisstore.Decode(v, prev)
		})
		if err != nil || len(w.charges) == 0 {
			// Replays alone write nothing: UpdateRead checks the budgets
			// returned are one consistent state.
			return nil, err
		}
		type set struct {
			v   []byte
			ttl time.Duration // 0: kept
		}
		ends := map[string]time.Time{}
		for _, op := range ops {
			if !op.RequesterEnds.IsZero() {
				ends[op.Requester.GetScope()] = op.RequesterEnds
			}
		}
		sets := make(map[string]set, len(w.budgets)+len(w.charges))
		for _, b := range w.budgets {
			v, err := redisstore.Marshal(b)
			if err != nil {
				return nil, err
			}
			var ttl time.Duration
			if end, ok := ends[b.GetScope()]; ok {
				ttl = max(time.Until(end)+ChargeRetention, time.Second)
			}
			sets[keys[budgetAt[b.GetScope()]]] = set{v, ttl}
		}
		for _, op := range w.charges {
			v, err := redisstore.Marshal(op.Request)
			if err != nil {
				return nil, err
			}
			sets[keys[chargeAt[op.Key]]] = set{v, ChargeRetention}
		}
		return func(p redis.Pipeliner) error {
			for k, s := range sets {
				p.Set(ctx, k, s.v, s.ttl)
			}
			return nil
		}, nil
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// decodeBudget decodes a budget read inside the transaction (an MGET
// value, nil when absent), or starts it from the template, exactly as the
// embedded store's loadBudget does.
func decodeBudget(v any, tmpl *policyv1.Budget) (*policyv1.Budget, error) {
	b := &policyv1.Budget{}
	switch err := redisstore.Decode(v, b); {
	case errors.Is(err, store.ErrNotFound):
		b = unusedBudget(tmpl)
	case err != nil:
		return nil, err
	}
	return withLimits(b, tmpl), nil
}

func (r *redisPolicyStore) CreateTaskScope(ctx context.Context, ts *policyv1.TaskScope) error {
	v, err := redisstore.Marshal(ts)
	if err != nil {
		return err
	}
	ok, err := r.c.SetNX(ctx, r.k.Key("task", ts.GetTaskId()), v, 0).Result()
	if err != nil {
		return fmt.Errorf("create task scope: %w", err)
	}
	if !ok {
		return store.ErrExists
	}
	return nil
}

func (r *redisPolicyStore) GetTaskScope(ctx context.Context, taskID string) (*policyv1.TaskScope, error) {
	ts := &policyv1.TaskScope{}
	if err := redisstore.Get(ctx, r.c, r.k.Key("task", taskID), ts); err != nil {
		return nil, err
	}
	return ts, nil
}

func (r *redisPolicyStore) PutHealth(ctx context.Context, h *policyv1.ConnectionHealth) error {
	v, err := redisstore.Marshal(h)
	if err != nil {
		return err
	}
	if err := r.c.Set(ctx, r.k.Key("health", h.GetConnectionId()), v, 0).Err(); err != nil {
		return fmt.Errorf("put health: %w", err)
	}
	return nil
}

func (r *redisPolicyStore) GetHealth(ctx context.Context, connectionID string) (*policyv1.ConnectionHealth, error) {
	h := &policyv1.ConnectionHealth{}
	if err := redisstore.Get(ctx, r.c, r.k.Key("health", connectionID), h); err != nil {
		return nil, err
	}
	return h, nil
}

// ForgetBefore deletes nothing: Redis forgets each charge record
// ChargeRetention after it was written, and each requester budget as long
// after its period ended (their TTLs).
func (r *redisPolicyStore) ForgetBefore(context.Context, time.Time) (int, error) {
	return 0, nil
}
