package registry

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/v0m3/v0m3/internal/redisstore"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// RedisEventGroup reads the registry event stream as one member of a Redis
// consumer group: the replicas of a service that reacts to registry events
// join the same group, and each event is delivered to one of them, not to
// all. An event stays pending for its consumer until acknowledged, so a
// replica that dies before Ack leaves it to be claimed (Claim) by another.
type RedisEventGroup struct {
	c        redis.UniversalClient
	stream   string
	group    string
	consumer string
}

// NewRedisEventGroup joins (creating if needed) the consumer group named
// group on the registry event stream of the deployment prefix, as
// consumer. A new group starts at the beginning of the stream.
func NewRedisEventGroup(ctx context.Context, c redis.UniversalClient, prefix, group, consumer string) (*RedisEventGroup, error) {
	stream := redisstore.NewKeys(prefix, "registry").Key("events")
	err := c.XGroupCreateMkStream(ctx, stream, group, "0").Err()
	if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return nil, fmt.Errorf("registry events: create group %s: %w", group, err)
	}
	return &RedisEventGroup{c: c, stream: stream, group: group, consumer: consumer}, nil
}

// Next returns up to count events not yet delivered to any member of the
// group, waiting up to block for one to arrive (0 returns at once). The
// events are pending for this consumer until Ack.
func (g *RedisEventGroup) Next(ctx context.Context, count int, block time.Duration) ([]*registryv1.RegistryEvent, error) {
	if block <= 0 {
		block = -1 // go-redis: no BLOCK argument
	}
	res, err := g.c.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: g.group, Consumer: g.consumer, Streams: []string{g.stream, ">"}, Count: int64(count), Block: block,
	}).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("registry events: read group: %w", err)
	}
	var out []*registryv1.RegistryEvent
	for _, s := range res {
		evs, err := decodeEntries(s.Messages)
		if err != nil {
			return nil, err
		}
		out = append(out, evs...)
	}
	return out, nil
}

// Claim takes over events that another consumer of the group received but
// did not acknowledge for at least minIdle (a replica that died), and
// returns them; they are then pending for this consumer.
func (g *RedisEventGroup) Claim(ctx context.Context, minIdle time.Duration, count int) ([]*registryv1.RegistryEvent, error) {
	msgs, _, err := g.c.XAutoClaim(ctx, &redis.XAutoClaimArgs{
		Stream: g.stream, Group: g.group, Consumer: g.consumer, MinIdle: minIdle, Start: "0-0", Count: int64(count),
	}).Result()
	if err != nil {
		return nil, fmt.Errorf("registry events: claim: %w", err)
	}
	return decodeEntries(msgs)
}

// Ack acknowledges handled events by sequence.
func (g *RedisEventGroup) Ack(ctx context.Context, sequences ...int64) error {
	if len(sequences) == 0 {
		return nil
	}
	ids := make([]string, len(sequences))
	for i, s := range sequences {
		ids[i] = strconv.FormatInt(s, 10) + "-0"
	}
	if err := g.c.XAck(ctx, g.stream, g.group, ids...).Err(); err != nil {
		return fmt.Errorf("registry events: ack: %w", err)
	}
	return nil
}

func decodeEntries(msgs []redis.XMessage) ([]*registryv1.RegistryEvent, error) {
	out := make([]*registryv1.RegistryEvent, 0, len(msgs))
	for _, m := range msgs {
		s, ok := m.Values["event"].(string)
		if !ok {
			return nil, fmt.Errorf("registry events: entry %s has no event field", m.ID)
		}
		ev := newEvent()
		if err := redisstore.Unmarshal([]byte(s), ev); err != nil {
			return nil, err
		}
		out = append(out, ev)
	}
	return out, nil
}
