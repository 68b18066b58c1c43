package registry

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/redisstore"
	"github.com/v0m3/v0m3/internal/store"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// Declared definitions in the Redis layout, beside those in
// store_redis.go:
//
//	cap:<name>            current Capability revision
//	caps                  SET of capability names
//	caprevs:<name>        HASH SeqKey(revision) -> Capability
//	profile:<name>        current TaskProfile revision
//	profiles              SET of task profile names
//	profilerevs:<name>    HASH SeqKey(revision) -> TaskProfile

// definitionKeys names the keys of one kind of definition.
type definitionKeys struct {
	current   func(name string) string
	revisions func(name string) string
	set       string
}

func (r *redisStore) capKeys() definitionKeys {
	return definitionKeys{
		current:   func(n string) string { return r.k.Key("cap", n) },
		revisions: func(n string) string { return r.k.Key("caprevs", n) },
		set:       r.k.Key("caps"),
	}
}

func (r *redisStore) profileKeys() definitionKeys {
	return definitionKeys{
		current:   func(n string) string { return r.k.Key("profile", n) },
		revisions: func(n string) string { return r.k.Key("profilerevs", n) },
		set:       r.k.Key("profiles"),
	}
}

// commitEvents queues writes and events in one MULTI/EXEC under the
// transaction's WATCH and, once committed, tells the caller the sequences
// assigned (like the embedded store).
func (r *redisStore) commitEvents(ctx context.Context, tx *redis.Tx, events []*registryv1.RegistryEvent, writes func(redis.Pipeliner)) (func(), error) {
	seqKey := r.k.Key("eventseq")
	last, err := lastSeq(ctx, tx, seqKey)
	if err != nil {
		return nil, err
	}
	encoded, err := r.encodeEvents(last, events)
	if err != nil {
		return nil, err
	}
	_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
		writes(p)
		r.queueEvents(ctx, p, seqKey, encoded)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return func() {
		for i, ev := range events {
			ev.Sequence = encoded[i].seq
		}
	}, nil
}

// createDefinition stores revision 1 of a new definition unless its name
// is taken.
func (r *redisStore) createDefinition(ctx context.Context, keys definitionKeys, d definition, events []*registryv1.RegistryEvent) error {
	if d.GetRevision() != 1 {
		return fmt.Errorf("new definition %s at revision %d: %w", d.GetName(), d.GetRevision(), errConflict)
	}
	b, err := redisstore.Marshal(d)
	if err != nil {
		return err
	}
	name := d.GetName()
	var done func()
	err = redisstore.Update(ctx, r.c, func(tx *redis.Tx) error {
		n, err := tx.Exists(ctx, keys.current(name)).Result()
		if err != nil {
			return err
		}
		if n > 0 {
			return redisstore.Abort(ctx, tx, fmt.Errorf("create %s: %w", name, store.ErrExists))
		}
		done, err = r.commitEvents(ctx, tx, events, func(p redis.Pipeliner) {
			p.Set(ctx, keys.current(name), b, 0)
			p.HSet(ctx, keys.revisions(name), store.SeqKey(1), b)
			p.SAdd(ctx, keys.set, name)
		})
		return err
	}, keys.current(name), r.k.Key("eventseq"))
	if err != nil {
		return err
	}
	done()
	return nil
}

// queueDefinition checks a definition write against the current revision
// and returns the writes that store it.
func queueDefinition(ctx context.Context, keys definitionKeys, cur, next definition) (func(redis.Pipeliner), error) {
	if err := checkDefinitionWrite(cur, next); err != nil {
		return nil, err
	}
	b, err := redisstore.Marshal(next)
	if err != nil {
		return nil, err
	}
	name, field := next.GetName(), store.SeqKey(next.GetRevision())
	return func(p redis.Pipeliner) {
		p.Set(ctx, keys.current(name), b, 0)
		p.HSet(ctx, keys.revisions(name), field, b)
	}, nil
}

func getDefinitionRedis[D definition](ctx context.Context, c redis.Cmdable, keys definitionKeys, name string, revision int64, newMsg func() D) (D, error) {
	d := newMsg()
	var err error
	if revision == 0 {
		err = redisstore.Get(ctx, c, keys.current(name), d)
	} else {
		var b []byte
		b, err = c.HGet(ctx, keys.revisions(name), store.SeqKey(revision)).Bytes()
		switch {
		case errors.Is(err, redis.Nil):
			err = store.ErrNotFound
		case err == nil:
			err = redisstore.Unmarshal(b, d)
		}
	}
	if err != nil {
		var zero D
		return zero, fmt.Errorf("%s revision %d: %w", name, revision, err)
	}
	return d, nil
}

func listDefinitions[D definition](ctx context.Context, r *redisStore, keys definitionKeys, newMsg func() D) ([]D, error) {
	names, err := r.c.SMembers(ctx, keys.set).Result()
	if err != nil {
		return nil, fmt.Errorf("list definitions: %w", err)
	}
	return redisstore.MGet(ctx, r.c, keysOf(names, keys.current), newMsg)
}

func (r *redisStore) CreateCapability(ctx context.Context, c *registryv1.Capability, events []*registryv1.RegistryEvent) error {
	return r.createDefinition(ctx, r.capKeys(), c, events)
}

func (r *redisStore) UpdateCapability(ctx context.Context, name string, fn func(*CapabilityUpdate) error) error {
	keys := r.capKeys()
	var done func()
	err := redisstore.Update(ctx, r.c, func(tx *redis.Tx) error {
		cur, err := getDefinitionRedis(ctx, tx, keys, name, 0, newCapability)
		if err != nil {
			return fmt.Errorf("capability %w", err)
		}
		mappings, err := r.capabilityMappings(ctx, tx, name)
		if err != nil {
			return err
		}
		u := &CapabilityUpdate{Current: cur, Mappings: mappings}
		// fn may change the loaded messages in place; writes are checked
		// against what was read.
		loaded := map[string]*registryv1.Mapping{}
		for _, m := range mappings {
			loaded[m.GetId()] = proto.CloneOf(m)
		}
		if err := fn(u); err != nil {
			return redisstore.Abort(ctx, tx, err)
		}
		var writes []func(redis.Pipeliner)
		if u.Write != nil {
			w, err := queueDefinition(ctx, keys, cur, u.Write)
			if err != nil {
				return redisstore.Abort(ctx, tx, err)
			}
			writes = append(writes, w)
		}
		for _, m := range u.WriteMappings {
			if err := checkStateWrite(loaded, m); err != nil {
				return redisstore.Abort(ctx, tx, err)
			}
			b, err := redisstore.Marshal(m)
			if err != nil {
				return err
			}
			id, field := m.GetId(), store.SeqKey(m.GetRevision())
			writes = append(writes, func(p redis.Pipeliner) {
				p.Set(ctx, r.mapping(id), b, 0)
				p.HSet(ctx, r.mapRevs(id), field, b)
			})
		}
		if len(writes) == 0 && len(u.Events) == 0 {
			// Nothing to write: make sure what fn decided on was one
			// consistent state.
			done = func() {}
			return redisstore.Abort(ctx, tx, nil)
		}
		done, err = r.commitEvents(ctx, tx, u.Events, func(p redis.Pipeliner) {
			for _, w := range writes {
				w(p)
			}
		})
		return err
	}, keys.current(name), r.k.Key("maps"), r.k.Key("eventseq"))
	if err != nil {
		return err
	}
	done()
	return nil
}

// capabilityMappings reads, under WATCH, the current revision of every
// mapping of a capability. Mappings are few, so the ids come from the set
// of all mappings (watched by the caller, so a new one conflicts).
func (r *redisStore) capabilityMappings(ctx context.Context, tx *redis.Tx, name string) ([]*registryv1.Mapping, error) {
	ids, err := tx.SMembers(ctx, r.k.Key("maps")).Result()
	if err != nil {
		return nil, err
	}
	all, err := redisstore.MGet(ctx, tx, keysOf(ids, r.mapping), newMapping)
	if err != nil {
		return nil, err
	}
	var keys []string
	for _, m := range all {
		if m.GetCapability() == name {
			keys = append(keys, r.mapping(m.GetId()))
		}
	}
	if len(keys) == 0 {
		return nil, nil
	}
	// Watch, then read again: a change between the first read and the
	// WATCH would otherwise go unnoticed. A mapping never changes its
	// capability, so the filter above stays right.
	if err := tx.Watch(ctx, keys...).Err(); err != nil {
		return nil, err
	}
	return redisstore.MGet(ctx, tx, keys, newMapping)
}

func (r *redisStore) GetCapability(ctx context.Context, name string, revision int64) (*registryv1.Capability, error) {
	c, err := getDefinitionRedis(ctx, r.c, r.capKeys(), name, revision, newCapability)
	if err != nil {
		return nil, fmt.Errorf("capability %w", err)
	}
	return c, nil
}

func (r *redisStore) ListCapabilities(ctx context.Context) ([]*registryv1.Capability, error) {
	return listDefinitions(ctx, r, r.capKeys(), newCapability)
}

func (r *redisStore) CreateTaskProfile(ctx context.Context, p *registryv1.TaskProfile, events []*registryv1.RegistryEvent) error {
	return r.createDefinition(ctx, r.profileKeys(), p, events)
}

func (r *redisStore) UpdateTaskProfile(ctx context.Context, name string, fn func(*ProfileUpdate) error) error {
	keys := r.profileKeys()
	var done func()
	err := redisstore.Update(ctx, r.c, func(tx *redis.Tx) error {
		cur, err := getDefinitionRedis(ctx, tx, keys, name, 0, newProfile)
		if err != nil {
			return fmt.Errorf("task profile %w", err)
		}
		u := &ProfileUpdate{Current: cur}
		if err := fn(u); err != nil {
			return redisstore.Abort(ctx, tx, err)
		}
		var write func(redis.Pipeliner)
		if u.Write != nil {
			if write, err = queueDefinition(ctx, keys, cur, u.Write); err != nil {
				return redisstore.Abort(ctx, tx, err)
			}
		}
		if write == nil && len(u.Events) == 0 {
			done = func() {}
			return redisstore.Abort(ctx, tx, nil)
		}
		done, err = r.commitEvents(ctx, tx, u.Events, func(p redis.Pipeliner) {
			if write != nil {
				write(p)
			}
		})
		return err
	}, keys.current(name), r.k.Key("eventseq"))
	if err != nil {
		return err
	}
	done()
	return nil
}

func (r *redisStore) GetTaskProfile(ctx context.Context, name string, revision int64) (*registryv1.TaskProfile, error) {
	p, err := getDefinitionRedis(ctx, r.c, r.profileKeys(), name, revision, newProfile)
	if err != nil {
		return nil, fmt.Errorf("task profile %w", err)
	}
	return p, nil
}

func (r *redisStore) ListTaskProfiles(ctx context.Context) ([]*registryv1.TaskProfile, error) {
	return listDefinitions(ctx, r, r.profileKeys(), newProfile)
}

// redisCapability reads a capability's current revision under the
// transaction's WATCH, for ConnectionUpdate.Capability: a concurrent
// revision of it makes the connection's transaction run again.
func (r *redisStore) redisCapability(ctx context.Context, tx *redis.Tx) func(string) (*registryv1.Capability, error) {
	return func(name string) (*registryv1.Capability, error) {
		keys := r.capKeys()
		if err := tx.Watch(ctx, keys.current(name)).Err(); err != nil {
			return nil, err
		}
		c, err := getDefinitionRedis(ctx, tx, keys, name, 0, newCapability)
		if err != nil {
			return nil, fmt.Errorf("capability %w", err)
		}
		return c, nil
	}
}
