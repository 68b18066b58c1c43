package redisstore

import (
	"context"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/v0m3/v0m3/services/internal/retryqueue"
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

// List reads the whole hash: it holds at most what one queue bounds
// (retryqueue.Options.Max) per replica, and is read once per start.
func (s redisSpool) List(ctx context.Context) ([]retryqueue.Spooled, error) {
	all, err := s.c.HGetAll(ctx, s.key).Result()
	if err != nil {
		return nil, err
	}
	out := make([]retryqueue.Spooled, 0, len(all))
	for k, v := range all {
		out = append(out, retryqueue.Spooled{Key: k, Rec: []byte(v)})
	}
	slices.SortFunc(out, func(a, b retryqueue.Spooled) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}
