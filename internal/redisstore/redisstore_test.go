package redisstore_test

import (
	"context"
	"errors"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/v0m3/v0m3/internal/redisstore"
	"github.com/v0m3/v0m3/internal/redistest"
)

var errRefused = errors.New("refused")

// TestUpdateRead checks the guarantees UpdateRead gives the stores: what
// decide saw is current when its writes, refusal or replay is returned (a
// write by another client in between makes it run again on fresh state),
// and the WATCH it sends in one round trip with the reads is released on
// every path, so the next transaction on the same pooled connection is not
// failed by it.
func TestUpdateRead(t *testing.T) {
	t.Parallel()
	addr, _ := redistest.Start(t)
	other := redistest.Client(t, addr)
	for _, tc := range []struct {
		name string
		// outcome is what decide returns once it has seen value n: writes
		// of n+1, a refusal or a replay (nil, nil).
		outcome func(n int) (increment bool, err error)
		// conflict: another client writes 10 during the first attempt.
		conflict bool
		want     error
		// wantValue is the stored value after UpdateRead.
		wantValue int
		// wantSeen is the value the last attempt decided on.
		wantSeen int
	}{
		{name: "write", outcome: func(int) (bool, error) { return true, nil }, wantValue: 2, wantSeen: 1},
		{name: "write after conflict", outcome: func(int) (bool, error) { return true, nil }, conflict: true, wantValue: 11, wantSeen: 10},
		{name: "refusal", outcome: func(int) (bool, error) { return false, errRefused }, want: errRefused, wantValue: 1, wantSeen: 1},
		{name: "refusal on stale view is retried", outcome: func(n int) (bool, error) {
			if n == 1 {
				return false, errRefused
			}
			return true, nil
		}, conflict: true, wantValue: 11, wantSeen: 10},
		{name: "replay", outcome: func(int) (bool, error) { return false, nil }, wantValue: 1, wantSeen: 1},
		{name: "replay on stale view is retried", outcome: func(int) (bool, error) { return false, nil }, conflict: true, wantValue: 10, wantSeen: 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			// One connection: a watch left behind would be on the
			// connection the next transaction uses.
			c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1})
			t.Cleanup(func() { _ = c.Close() })
			key := redisstore.NewKeys(redistest.Prefix(t), "test").Key("n")
			if err := c.Set(ctx, key, 1, 0).Err(); err != nil {
				t.Fatal(err)
			}
			attempts, seen := 0, 0
			var read *redis.StringCmd
			err := redisstore.UpdateRead(ctx, c, []string{key}, func(p redis.Pipeliner) {
				read = p.Get(ctx, key)
			}, func(*redis.Tx) (redisstore.Write, error) {
				attempts++
				n, err := read.Int()
				if err != nil {
					return nil, err
				}
				seen = n
				if tc.conflict && attempts == 1 {
					if err := other.Set(ctx, key, 10, 0).Err(); err != nil {
						return nil, err
					}
				}
				inc, err := tc.outcome(n)
				if !inc {
					return nil, err
				}
				return func(p redis.Pipeliner) error {
					p.Set(ctx, key, n+1, 0)
					return nil
				}, nil
			})
			if !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
				t.Fatalf("UpdateRead = %v, want %v", err, tc.want)
			}
			if seen != tc.wantSeen {
				t.Errorf("last attempt decided on %d, want %d", seen, tc.wantSeen)
			}
			got, err := other.Get(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			if got != strconv.Itoa(tc.wantValue) {
				t.Errorf("stored %s, want %d", got, tc.wantValue)
			}
			// Another client changes the key; the next transaction on c's
			// only connection, on another key, must still commit.
			if err := other.Set(ctx, key, 20, 0).Err(); err != nil {
				t.Fatal(err)
			}
			if err := c.Watch(ctx, func(tx *redis.Tx) error {
				_, err := tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
					p.Set(ctx, key+"-next", 1, 0)
					return nil
				})
				return err
			}, key+"-next"); err != nil {
				t.Fatalf("transaction after UpdateRead on the same connection: %v (a watch was left armed)", err)
			}
		})
	}
}
