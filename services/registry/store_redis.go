package registry

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/redisstore"
	"github.com/v0m3/v0m3/internal/store"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// Redis layout, under "{<prefix>:registry}:":
//
//	conn:<id>          Connection
//	conns              SET of connection ids
//	confrevs:<conn>    HASH SeqKey(revision) -> ConfigRevision
//	snap:<id>          DiscoverySnapshot
//	snaps:<conn>       LIST of snapshot ids, oldest first
//	map:<id>           current Mapping revision
//	maps               SET of mapping ids
//	connmaps:<conn>    SET of the connection's mapping ids
//	maprevs:<id>       HASH SeqKey(revision) -> Mapping
//	eventseq           last event sequence
//	events             STREAM; entry id "<sequence>-0", fields seq, event
//
// Capabilities and task profiles: see store_redis_definitions.go.
//
// Every change is one WATCH/MULTI/EXEC transaction: the keys it decides on
// are watched, so a concurrent writer makes EXEC fail and the change is
// recomputed from fresh state. The event stream's entry ids are the event
// sequences, so "events after n" is XRANGE from (n+1)-0.
type redisStore struct {
	c redis.UniversalClient
	k redisstore.Keys
}

// NewRedisStore returns the registry Store on Redis; prefix names the
// deployment, so several deployments can share one Redis.
func NewRedisStore(c redis.UniversalClient, prefix string) Store {
	return &redisStore{c: c, k: redisstore.NewKeys(prefix, "registry")}
}

func (r *redisStore) conn(id string) string     { return r.k.Key("conn", id) }
func (r *redisStore) confRevs(id string) string { return r.k.Key("confrevs", id) }
func (r *redisStore) snap(id string) string     { return r.k.Key("snap", id) }
func (r *redisStore) snaps(id string) string    { return r.k.Key("snaps", id) }
func (r *redisStore) mapping(id string) string  { return r.k.Key("map", id) }
func (r *redisStore) mapRevs(id string) string  { return r.k.Key("maprevs", id) }
func (r *redisStore) connMaps(id string) string { return r.k.Key("connmaps", id) }

func (r *redisStore) CreateConnection(ctx context.Context, c *registryv1.Connection, rev *registryv1.ConfigRevision, ev *registryv1.RegistryEvent) error {
	id := c.GetId()
	cb, err := redisstore.Marshal(c)
	if err != nil {
		return err
	}
	rb, err := redisstore.Marshal(rev)
	if err != nil {
		return err
	}
	seqKey := r.k.Key("eventseq")
	var seq int64
	err = redisstore.Update(ctx, r.c, func(tx *redis.Tx) error {
		n, err := tx.Exists(ctx, r.conn(id)).Result()
		if err != nil {
			return err
		}
		if n > 0 {
			return redisstore.Abort(ctx, tx, fmt.Errorf("create connection %s: %w", id, store.ErrExists))
		}
		last, err := lastSeq(ctx, tx, seqKey)
		if err != nil {
			return err
		}
		events, err := r.encodeEvents(last, []*registryv1.RegistryEvent{ev})
		if err != nil {
			return err
		}
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, r.conn(id), cb, 0)
			p.SAdd(ctx, r.k.Key("conns"), id)
			p.HSet(ctx, r.confRevs(id), store.SeqKey(rev.GetRevision()), rb)
			r.queueEvents(ctx, p, seqKey, events)
			return nil
		})
		seq = events[0].seq
		return err
	}, r.conn(id), seqKey)
	if err != nil {
		return err
	}
	// Like the embedded store, tell the caller the sequence assigned.
	ev.Sequence = seq
	return nil
}

// encodedEvent is an event with its assigned sequence and bytes.
type encodedEvent struct {
	seq   int64
	bytes []byte
}

// encodeEvents encodes events with the sequences after last. The caller's
// messages get their sequence only once the transaction committed, so a
// retried transaction never leaves a stale one behind.
func (r *redisStore) encodeEvents(last int64, events []*registryv1.RegistryEvent) ([]encodedEvent, error) {
	out := make([]encodedEvent, 0, len(events))
	for i, ev := range events {
		withSeq := proto.CloneOf(ev)
		withSeq.Sequence = last + int64(i) + 1
		b, err := redisstore.Marshal(withSeq)
		if err != nil {
			return nil, err
		}
		out = append(out, encodedEvent{seq: withSeq.Sequence, bytes: b})
	}
	return out, nil
}

func (r *redisStore) queueEvents(ctx context.Context, p redis.Pipeliner, seqKey string, events []encodedEvent) {
	if len(events) == 0 {
		return
	}
	for _, e := range events {
		p.XAdd(ctx, &redis.XAddArgs{
			Stream: r.k.Key("events"),
			ID:     strconv.FormatInt(e.seq, 10) + "-0",
			Values: []any{"seq", e.seq, "event", e.bytes},
		})
	}
	p.Set(ctx, seqKey, events[len(events)-1].seq, 0)
}

func lastSeq(ctx context.Context, tx *redis.Tx, key string) (int64, error) {
	n, err := tx.Get(ctx, key).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	return n, err
}

func (r *redisStore) UpdateConnection(ctx context.Context, id string, fn func(*ConnectionUpdate) error) error {
	seqKey := r.k.Key("eventseq")
	var committed []*registryv1.RegistryEvent
	var seqs []int64
	err := redisstore.Update(ctx, r.c, func(tx *redis.Tx) error {
		u := &ConnectionUpdate{Connection: &registryv1.Connection{}, capability: r.redisCapability(ctx, tx)}
		if err := redisstore.Get(ctx, tx, r.conn(id), u.Connection); err != nil {
			return fmt.Errorf("connection %s: %w", id, err)
		}
		mids, err := tx.SMembers(ctx, r.connMaps(id)).Result()
		if err != nil {
			return err
		}
		slices.Sort(mids)
		for _, mid := range mids {
			if err := tx.Watch(ctx, r.mapping(mid)).Err(); err != nil {
				return err
			}
			m := newMapping()
			if err := redisstore.Get(ctx, tx, r.mapping(mid), m); err != nil {
				return fmt.Errorf("mapping %s of %s: %w", mid, id, err)
			}
			u.Mappings = append(u.Mappings, m)
		}
		if sid := u.Connection.GetLatestSnapshotId(); sid != "" {
			s := newSnapshot()
			if err := redisstore.Get(ctx, tx, r.snap(sid), s); err != nil {
				return fmt.Errorf("latest snapshot of %s: %w", id, err)
			}
			u.LatestSnapshot = s
		}
		if err := fn(u); err != nil {
			return redisstore.Abort(ctx, tx, err)
		}
		write, err := r.prepare(ctx, tx, id, u)
		if err != nil {
			return redisstore.Abort(ctx, tx, err)
		}
		last, err := lastSeq(ctx, tx, seqKey)
		if err != nil {
			return err
		}
		events, err := r.encodeEvents(last, u.Events)
		if err != nil {
			return err
		}
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			write(p)
			r.queueEvents(ctx, p, seqKey, events)
			return nil
		})
		if err != nil {
			return err
		}
		committed, seqs = u.Events, nil
		for _, e := range events {
			seqs = append(seqs, e.seq)
		}
		return nil
	}, r.conn(id), r.connMaps(id), seqKey)
	if err != nil {
		return err
	}
	// Like the embedded store, tell the caller the sequences assigned.
	for i, ev := range committed {
		ev.Sequence = seqs[i]
	}
	return nil
}

// prepare checks what u asks to write against the watched state and
// returns the writes to queue. Nothing is written here.
func (r *redisStore) prepare(ctx context.Context, tx *redis.Tx, id string, u *ConnectionUpdate) (func(redis.Pipeliner), error) {
	if u.Connection.GetId() != id {
		return nil, fmt.Errorf("update of %s changed the connection id: %w", id, errConflict)
	}
	var writes []func(redis.Pipeliner)
	put := func(key string, v []byte) {
		writes = append(writes, func(p redis.Pipeliner) { p.Set(ctx, key, v, 0) })
	}
	cb, err := redisstore.Marshal(u.Connection)
	if err != nil {
		return nil, err
	}
	put(r.conn(id), cb)

	if rev := u.Revision; rev != nil {
		if rev.GetConnectionId() != id {
			return nil, fmt.Errorf("config revision for %s on %s: %w", rev.GetConnectionId(), id, errConflict)
		}
		field := store.SeqKey(rev.GetRevision())
		exists, err := tx.HExists(ctx, r.confRevs(id), field).Result()
		if err != nil {
			return nil, err
		}
		if exists {
			return nil, fmt.Errorf("config revision %d of %s: %w", rev.GetRevision(), id, store.ErrExists)
		}
		b, err := redisstore.Marshal(rev)
		if err != nil {
			return nil, err
		}
		writes = append(writes, func(p redis.Pipeliner) { p.HSet(ctx, r.confRevs(id), field, b) })
	}

	if s := u.Snapshot; s != nil {
		if s.GetConnectionId() != id {
			return nil, fmt.Errorf("snapshot for %s on %s: %w", s.GetConnectionId(), id, errConflict)
		}
		if err := tx.Watch(ctx, r.snap(s.GetId())).Err(); err != nil {
			return nil, err
		}
		n, err := tx.Exists(ctx, r.snap(s.GetId())).Result()
		if err != nil {
			return nil, err
		}
		if n > 0 {
			return nil, fmt.Errorf("snapshot %s: %w", s.GetId(), store.ErrExists)
		}
		b, err := redisstore.Marshal(s)
		if err != nil {
			return nil, err
		}
		sid := s.GetId()
		writes = append(writes, func(p redis.Pipeliner) {
			p.Set(ctx, r.snap(sid), b, 0)
			p.RPush(ctx, r.snaps(id), sid)
		})
	}

	// current tracks each mapping's current revision as the writes so far
	// leave it, so several writes to one mapping chain like in one bolt
	// transaction.
	current := map[string]*registryv1.Mapping{}
	for _, m := range u.WriteMappings {
		if m.GetConnectionId() != id {
			return nil, fmt.Errorf("mapping %s on %s written through %s: %w", m.GetId(), m.GetConnectionId(), id, errConflict)
		}
		mid := m.GetId()
		cur, seen := current[mid]
		if !seen {
			if err := tx.Watch(ctx, r.mapping(mid)).Err(); err != nil {
				return nil, err
			}
			stored := newMapping()
			switch err := redisstore.Get(ctx, tx, r.mapping(mid), stored); {
			case errors.Is(err, store.ErrNotFound):
				stored = nil
			case err != nil:
				return nil, err
			}
			cur = stored
		}
		switch {
		case cur == nil:
			if m.GetRevision() != 1 {
				return nil, fmt.Errorf("new mapping %s at revision %d: %w", mid, m.GetRevision(), errConflict)
			}
		case cur.GetConnectionId() != id:
			return nil, fmt.Errorf("mapping %s belongs to %s: %w", mid, cur.GetConnectionId(), errConflict)
		case m.GetRevision() == cur.GetRevision(), m.GetRevision() == cur.GetRevision()+1:
			// Replace the current revision, or append the next one.
		default:
			return nil, fmt.Errorf("mapping %s revision %d after %d: %w", mid, m.GetRevision(), cur.GetRevision(), errConflict)
		}
		current[mid] = m
		b, err := redisstore.Marshal(m)
		if err != nil {
			return nil, err
		}
		field := store.SeqKey(m.GetRevision())
		writes = append(writes, func(p redis.Pipeliner) {
			p.Set(ctx, r.mapping(mid), b, 0)
			p.HSet(ctx, r.mapRevs(mid), field, b)
			p.SAdd(ctx, r.k.Key("maps"), mid)
			p.SAdd(ctx, r.connMaps(id), mid)
		})
	}
	return func(p redis.Pipeliner) {
		for _, w := range writes {
			w(p)
		}
	}, nil
}

func (r *redisStore) GetConnection(ctx context.Context, id string) (*registryv1.Connection, error) {
	c := newConnection()
	if err := redisstore.Get(ctx, r.c, r.conn(id), c); err != nil {
		return nil, fmt.Errorf("connection %s: %w", id, err)
	}
	return c, nil
}

func (r *redisStore) ListConnections(ctx context.Context) ([]*registryv1.Connection, error) {
	ids, err := r.c.SMembers(ctx, r.k.Key("conns")).Result()
	if err != nil {
		return nil, fmt.Errorf("list connections: %w", err)
	}
	return redisstore.MGet(ctx, r.c, keysOf(ids, r.conn), newConnection)
}

func (r *redisStore) ListConfigRevisions(ctx context.Context, connectionID string) ([]*registryv1.ConfigRevision, error) {
	return redisstore.HashValues(ctx, r.c, r.confRevs(connectionID), newConfigRevision)
}

func (r *redisStore) GetSnapshot(ctx context.Context, id string) (*registryv1.DiscoverySnapshot, error) {
	s := newSnapshot()
	if err := redisstore.Get(ctx, r.c, r.snap(id), s); err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", id, err)
	}
	return s, nil
}

func (r *redisStore) ListSnapshots(ctx context.Context, connectionID string) ([]*registryv1.DiscoverySnapshot, error) {
	ids, err := r.c.LRange(ctx, r.snaps(connectionID), 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("list snapshots of %s: %w", connectionID, err)
	}
	return redisstore.MGet(ctx, r.c, keysOf(ids, r.snap), newSnapshot)
}

func (r *redisStore) GetMapping(ctx context.Context, id string, revision int64) (*registryv1.Mapping, error) {
	m := newMapping()
	var err error
	if revision == 0 {
		err = redisstore.Get(ctx, r.c, r.mapping(id), m)
	} else {
		var b []byte
		b, err = r.c.HGet(ctx, r.mapRevs(id), store.SeqKey(revision)).Bytes()
		switch {
		case errors.Is(err, redis.Nil):
			err = store.ErrNotFound
		case err == nil:
			err = redisstore.Unmarshal(b, m)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("mapping %s revision %d: %w", id, revision, err)
	}
	return m, nil
}

func (r *redisStore) ReadExecution(ctx context.Context, mappingID, capability, connectionID string) (Execution, error) {
	// One MGET: the key of an empty name is one no record has.
	vals, err := r.c.MGet(ctx, r.mapping(mappingID), r.capKeys().current(capability), r.conn(connectionID)).Result()
	if err != nil {
		return Execution{}, fmt.Errorf("read execution of mapping %s: %w", mappingID, err)
	}
	var x Execution
	if x.Mapping, err = redisstore.DecodeOptional(vals[0], newMapping()); err == nil {
		if x.Capability, err = redisstore.DecodeOptional(vals[1], newCapability()); err == nil {
			x.Connection, err = redisstore.DecodeOptional(vals[2], newConnection())
		}
	}
	if err != nil {
		return Execution{}, fmt.Errorf("read execution of mapping %s: %w", mappingID, err)
	}
	return x, nil
}

func (r *redisStore) ListMappings(ctx context.Context) ([]*registryv1.Mapping, error) {
	ids, err := r.c.SMembers(ctx, r.k.Key("maps")).Result()
	if err != nil {
		return nil, fmt.Errorf("list mappings: %w", err)
	}
	return redisstore.MGet(ctx, r.c, keysOf(ids, r.mapping), newMapping)
}

func (r *redisStore) ListEvents(ctx context.Context, after int64, limit int) ([]*registryv1.RegistryEvent, error) {
	if limit <= 0 {
		limit = 1
	}
	msgs, err := r.c.XRangeN(ctx, r.k.Key("events"), strconv.FormatInt(after+1, 10)+"-0", "+", int64(limit)).Result()
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	return decodeEntries(msgs)
}

func keysOf(ids []string, key func(string) string) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = key(id)
	}
	return out
}
