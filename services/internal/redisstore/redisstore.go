// Package redisstore holds what every service's Redis Store shares: key
// naming, protobuf encoding and the optimistic-transaction loop.
//
// Keys are "{<deployment>:<service>}:<kind>:<id>". The braces are a Redis
// Cluster hash tag: every key of one service of one deployment lives in
// one slot, so multi-key transactions and scripts are legal on a cluster
// too, and two deployments (or two services) sharing one Redis never see
// each other's keys.
package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/services/internal/store"
)

// Keys builds the keys of one service in one deployment.
type Keys struct {
	base string
}

// NewKeys returns the key builder for service under the deployment prefix.
// An empty prefix is "v0m3".
func NewKeys(prefix, service string) Keys {
	if prefix == "" {
		prefix = "v0m3"
	}
	// Braces would end the hash tag early and put keys in other slots.
	clean := strings.NewReplacer("{", "_", "}", "_")
	return Keys{base: "{" + clean.Replace(prefix) + ":" + clean.Replace(service) + "}"}
}

// Key joins parts under the service's base: Key("conn", id).
func (k Keys) Key(parts ...string) string {
	return k.base + ":" + strings.Join(parts, ":")
}

// Marshal encodes m deterministically, so equal messages are equal bytes.
func Marshal(m proto.Message) ([]byte, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("redis store: encode %T: %w", m, err)
	}
	return b, nil
}

// Unmarshal decodes b into m.
func Unmarshal(b []byte, m proto.Message) error {
	if err := proto.Unmarshal(b, m); err != nil {
		return fmt.Errorf("redis store: decode %T: %w", m, err)
	}
	return nil
}

// Get reads key into m through c (a client, a Tx or a pipeline's parent),
// returning store.ErrNotFound when the key is absent.
func Get(ctx context.Context, c redis.Cmdable, key string, m proto.Message) error {
	b, err := c.Get(ctx, key).Bytes()
	if errors.Is(err, redis.Nil) {
		return store.ErrNotFound
	}
	if err != nil {
		return err
	}
	return Unmarshal(b, m)
}

// Update runs fn as an optimistic transaction: fn reads under WATCH on
// keys (it may watch more with tx.Watch before queueing writes) and writes
// with tx.TxPipelined. When another client changed a watched key, EXEC
// fails with redis.TxFailedErr and fn runs again from the start, after a
// short jittered pause so contending writers spread out. Any other error
// from fn is returned unchanged. It gives up only when ctx ends.
func Update(ctx context.Context, c redis.UniversalClient, fn func(tx *redis.Tx) error, keys ...string) error {
	for attempt := 0; ; attempt++ {
		err := c.Watch(ctx, fn, keys...)
		if !errors.Is(err, redis.TxFailedErr) {
			return err
		}
		pause := time.Duration(rand.Int64N(int64(time.Millisecond) << min(attempt, 5)))
		select {
		case <-ctx.Done():
			return fmt.Errorf("redis store: transaction kept conflicting: %w", ctx.Err())
		case <-time.After(pause):
		}
	}
}

// MGet reads the records at keys in one round trip, in the order of keys.
// A missing record fails with store.ErrNotFound: callers read keys from an
// index, and an index entry without its record is an inconsistency.
func MGet[M proto.Message](ctx context.Context, c redis.Cmdable, keys []string, newMsg func() M) ([]M, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	vals, err := c.MGet(ctx, keys...).Result()
	if err != nil {
		return nil, err
	}
	out := make([]M, 0, len(vals))
	for i, v := range vals {
		s, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("redis store: indexed record %s: %w", keys[i], store.ErrNotFound)
		}
		m := newMsg()
		if err := Unmarshal([]byte(s), m); err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}

// HashValues returns a hash's values ordered by field. Callers use
// fixed-width sequence fields (store.SeqKey), so that is numeric order.
func HashValues[M proto.Message](ctx context.Context, c redis.Cmdable, key string, newMsg func() M) ([]M, error) {
	all, err := c.HGetAll(ctx, key).Result()
	if err != nil {
		return nil, err
	}
	fields := make([]string, 0, len(all))
	for f := range all {
		fields = append(fields, f)
	}
	slices.Sort(fields)
	out := make([]M, 0, len(fields))
	for _, f := range fields {
		m := newMsg()
		if err := Unmarshal([]byte(all[f]), m); err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}

// Abort is how a transaction function refuses a change: it returns err
// only if what the function read is still current. A refusal decided on a
// view that a concurrent writer has since changed may be wrong (the view
// can even mix states from before and after that write), so then Abort
// returns redis.TxFailedErr and Update runs the function again on fresh
// state. It checks by executing an empty MULTI/EXEC under the same WATCH.
// A function that returns what it read without writing (a replay) calls
// Abort(ctx, tx, nil) so that what it returns is one consistent state.
func Abort(ctx context.Context, tx *redis.Tx, err error) error {
	_, execErr := tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Ping(ctx)
		return nil
	})
	if errors.Is(execErr, redis.TxFailedErr) {
		return execErr
	}
	return err
}
