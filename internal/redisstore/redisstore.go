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

	"github.com/v0m3/v0m3/internal/store"
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

// Write queues a transaction's writes on p, which runs them in one
// MULTI/EXEC.
type Write func(p redis.Pipeliner) error

// UpdateRead is Update for a function that decides on what read queues:
// each attempt watches keys and runs read's commands in one round trip
// (WATCH first, so the reads are under it), then calls decide, which
// inspects those commands (it may read more through tx) and returns the
// writes, and runs them in one MULTI/EXEC: two round trips where Update
// with separate reads takes three or more. A refusal (decide's error) or
// a replay (no writes) executes an empty MULTI/EXEC, as Abort does, so
// what decide saw is checked to be current: it is returned only then, and
// otherwise the attempt is retried on fresh state.
//
// The WATCH is not sent through tx.Watch, so go-redis does not know it
// is armed; every path ends with EXEC (which releases it) or UNWATCH, so
// no watch is left on a pooled connection.
func UpdateRead(ctx context.Context, c redis.UniversalClient, keys []string, read func(p redis.Pipeliner), decide func(tx *redis.Tx) (Write, error)) error {
	var clusterKeys []string
	if _, ok := c.(*redis.ClusterClient); ok {
		clusterKeys = keys // a cluster client picks the node by the watched keys
	}
	return Update(ctx, c, func(tx *redis.Tx) error {
		var watch *redis.Cmd
		_, _ = tx.Pipelined(ctx, func(p redis.Pipeliner) error {
			args := make([]any, 0, 1+len(keys))
			args = append(args, "watch")
			for _, k := range keys {
				args = append(args, k)
			}
			watch = p.Do(ctx, args...)
			read(p)
			return nil
		})
		if err := watch.Err(); err != nil {
			_ = tx.Unwatch(ctx).Err()
			return err
		}
		w, refused := decide(tx)
		if refused != nil || w == nil {
			w = checkCurrent(ctx)
		}
		_, err := tx.TxPipelined(ctx, w)
		switch {
		case errors.Is(err, redis.TxFailedErr):
			return err
		case err != nil:
			// EXEC may not have run: release the watch before the
			// connection goes back to the pool.
			_ = tx.Unwatch(ctx).Err()
		}
		if refused != nil {
			return refused
		}
		return err
	}, clusterKeys...)
}

// checkCurrent is the empty transaction whose EXEC fails when a watched
// key changed (see Abort).
func checkCurrent(ctx context.Context) Write {
	return func(p redis.Pipeliner) error {
		p.Ping(ctx)
		return nil
	}
}

// Decode decodes v, a value of MGET or (*redis.Cmd).Val (a string, nil
// when the key is absent) into m: store.ErrNotFound when absent.
func Decode(v any, m proto.Message) error {
	s, ok := v.(string)
	if !ok {
		return store.ErrNotFound
	}
	return Unmarshal([]byte(s), m)
}

// DecodeOptional is Decode for a record that may be absent: it returns m,
// or nil when v held no record.
func DecodeOptional[M proto.Message](v any, m M) (M, error) {
	var zero M
	switch err := Decode(v, m); {
	case errors.Is(err, store.ErrNotFound):
		return zero, nil
	case err != nil:
		return zero, err
	}
	return m, nil
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
		m := newMsg()
		if err := Decode(v, m); err != nil {
			return nil, fmt.Errorf("redis store: indexed record %s: %w", keys[i], err)
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
	_, execErr := tx.TxPipelined(ctx, checkCurrent(ctx))
	if errors.Is(execErr, redis.TxFailedErr) {
		return execErr
	}
	return err
}

// AbortReasons is a go-redis hook (Client.AddHook) that gives an aborted
// MULTI/EXEC the reply that aborted it: Redis answers EXEC with
// EXECABORT alone ("discarded because of previous errors"), while the
// reason, e.g. an OOM refusal at maxmemory, is on the queued commands.
// The error returned then wraps both, so callers can tell a full store
// from a broken one.
type AbortReasons struct{}

// DialHook leaves dialing as it is.
func (AbortReasons) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook leaves single commands as they are: their reply is their
// reason.
func (AbortReasons) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

// ProcessPipelineHook adds the first queued command's error to an
// EXECABORT.
func (AbortReasons) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if !redis.IsExecAbortError(err) {
			return err
		}
		for _, c := range cmds {
			if cerr := c.Err(); cerr != nil && !redis.IsExecAbortError(cerr) {
				return errors.Join(err, cerr)
			}
		}
		return err
	}
}
