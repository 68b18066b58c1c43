package redisstore

import (
	"context"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/v0m3/v0m3/internal/retryqueue"
)

// Spool returns the hash "spool:<name>" of a service's keys as a
// retryqueue.Spool: where records waiting for another service are kept
// across a restart, shared by the service's replicas.
func Spool(c redis.UniversalClient, k Keys, name string) retryqueue.Spool {
	return redisSpool{c: c, key: k.Key("spool", name)}
}

type redisSpool struct {
	c   redis.UniversalClient
	key string
}

func (s redisSpool) Put(ctx context.Context, key string, rec []byte) error {
	return s.c.HSet(ctx, s.key, key, rec).Err()
}

func (s redisSpool) Delete(ctx context.Context, key string) error {
	return s.c.HDel(ctx, s.key, key).Err()
}

// List reads the hash with HSCAN, a page at a time, so a spool grown by
// a long outage does not hold Redis up the way one HGETALL would. A
// record written or deleted meanwhile may be listed or not; the queue
// reads the spool again later.
func (s redisSpool) List(ctx context.Context) ([]retryqueue.Spooled, error) {
	var out []retryqueue.Spooled
	it := s.c.HScan(ctx, s.key, 0, "", 1000).Iterator()
	for it.Next(ctx) {
		k := it.Val()
		if !it.Next(ctx) {
			break
		}
		out = append(out, retryqueue.Spooled{Key: k, Rec: []byte(it.Val())})
	}
	if err := it.Err(); err != nil {
		return nil, err
	}
	// HSCAN may return a field twice; keep one, in key order.
	slices.SortFunc(out, func(a, b retryqueue.Spooled) int { return strings.Compare(a.Key, b.Key) })
	return slices.CompactFunc(out, func(a, b retryqueue.Spooled) bool { return a.Key == b.Key }), nil
}
