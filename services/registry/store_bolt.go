package registry

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/v0m3/v0m3/internal/store"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// Buckets of the bbolt layout. Keys that must list in order within a parent
// are "<parent>/<SeqKey(n)>".
const (
	bucketConnections      = "connections"       // conn id -> Connection
	bucketConfigRevisions  = "config_revisions"  // conn id/SeqKey(rev) -> ConfigRevision
	bucketSnapshots        = "snapshots"         // conn id/SeqKey(seq) -> DiscoverySnapshot
	bucketSnapshotIndex    = "snapshot_index"    // snap id -> StringValue(key in snapshots)
	bucketMappings         = "mappings"          // map id -> current Mapping revision
	bucketMappingRevisions = "mapping_revisions" // map id/SeqKey(rev) -> Mapping revision
	bucketEvents           = "events"            // SeqKey(seq) -> RegistryEvent
)

// errConflict reports a write that does not follow the stored revision; the
// server never produces one, so it is an internal error if it happens.
var errConflict = errors.New("registry store: revision conflict")

type boltStore struct {
	db *store.DB
}

// NewBoltStore returns the registry Store on an embedded bbolt database.
func NewBoltStore(db *store.DB) Store { return &boltStore{db: db} }

func childKey(parent string, n int64) string { return parent + "/" + store.SeqKey(n) }

func (b *boltStore) CreateConnection(ctx context.Context, c *registryv1.Connection, rev *registryv1.ConfigRevision, ev *registryv1.RegistryEvent) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return b.db.Update(func(tx *store.Tx) error {
		if err := tx.Create(bucketConnections, c.GetId(), c); err != nil {
			return fmt.Errorf("create connection %s: %w", c.GetId(), err)
		}
		if err := tx.Create(bucketConfigRevisions, childKey(c.GetId(), rev.GetRevision()), rev); err != nil {
			return fmt.Errorf("create config revision: %w", err)
		}
		return appendEvents(tx, []*registryv1.RegistryEvent{ev})
	})
}

func (b *boltStore) UpdateConnection(ctx context.Context, id string, fn func(*ConnectionUpdate) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return b.db.Update(func(tx *store.Tx) error {
		u := &ConnectionUpdate{Connection: &registryv1.Connection{}, capability: boltCapability(tx)}
		if err := tx.Get(bucketConnections, id, u.Connection); err != nil {
			return fmt.Errorf("connection %s: %w", id, err)
		}
		// Mappings are few (one per capability and connection, plus
		// history kept elsewhere), so a scan is cheaper than an index.
		err := store.List(tx, bucketMappings, "", newMapping, func(_ string, m *registryv1.Mapping) error {
			if m.GetConnectionId() == id {
				u.Mappings = append(u.Mappings, m)
			}
			return nil
		})
		if err != nil {
			return err
		}
		if sid := u.Connection.GetLatestSnapshotId(); sid != "" {
			s, err := getSnapshot(tx, sid)
			if err != nil {
				return fmt.Errorf("latest snapshot of %s: %w", id, err)
			}
			u.LatestSnapshot = s
		}
		if err := fn(u); err != nil {
			return err
		}
		return b.commit(tx, id, u)
	})
}

func (b *boltStore) commit(tx *store.Tx, id string, u *ConnectionUpdate) error {
	if u.Connection.GetId() != id {
		return fmt.Errorf("update of %s changed the connection id: %w", id, errConflict)
	}
	if err := tx.Put(bucketConnections, id, u.Connection); err != nil {
		return err
	}
	if r := u.Revision; r != nil {
		if r.GetConnectionId() != id {
			return fmt.Errorf("config revision for %s on %s: %w", r.GetConnectionId(), id, errConflict)
		}
		if err := tx.Create(bucketConfigRevisions, childKey(id, r.GetRevision()), r); err != nil {
			return fmt.Errorf("config revision %d of %s: %w", r.GetRevision(), id, err)
		}
	}
	if s := u.Snapshot; s != nil {
		if err := putSnapshot(tx, id, s); err != nil {
			return err
		}
	}
	for _, m := range u.WriteMappings {
		if err := putMapping(tx, id, m); err != nil {
			return err
		}
	}
	return appendEvents(tx, u.Events)
}

func putSnapshot(tx *store.Tx, connID string, s *registryv1.DiscoverySnapshot) error {
	if s.GetConnectionId() != connID {
		return fmt.Errorf("snapshot for %s on %s: %w", s.GetConnectionId(), connID, errConflict)
	}
	seq, err := tx.NextSequence(bucketSnapshots)
	if err != nil {
		return err
	}
	key := childKey(connID, seq)
	if err := tx.Create(bucketSnapshotIndex, s.GetId(), wrapperspb.String(key)); err != nil {
		return fmt.Errorf("snapshot %s: %w", s.GetId(), err)
	}
	return tx.Create(bucketSnapshots, key, s)
}

func putMapping(tx *store.Tx, connID string, m *registryv1.Mapping) error {
	if m.GetConnectionId() != connID {
		return fmt.Errorf("mapping %s on %s written through %s: %w", m.GetId(), m.GetConnectionId(), connID, errConflict)
	}
	cur := &registryv1.Mapping{}
	err := tx.Get(bucketMappings, m.GetId(), cur)
	switch {
	case errors.Is(err, store.ErrNotFound):
		if m.GetRevision() != 1 {
			return fmt.Errorf("new mapping %s at revision %d: %w", m.GetId(), m.GetRevision(), errConflict)
		}
	case err != nil:
		return err
	case cur.GetConnectionId() != connID:
		return fmt.Errorf("mapping %s belongs to %s: %w", m.GetId(), cur.GetConnectionId(), errConflict)
	case m.GetRevision() == cur.GetRevision():
		// Replace the current revision (a state change).
	case m.GetRevision() == cur.GetRevision()+1:
		// Append a new revision.
	default:
		return fmt.Errorf("mapping %s revision %d after %d: %w", m.GetId(), m.GetRevision(), cur.GetRevision(), errConflict)
	}
	if err := tx.Put(bucketMappings, m.GetId(), m); err != nil {
		return err
	}
	return tx.Put(bucketMappingRevisions, childKey(m.GetId(), m.GetRevision()), m)
}

func appendEvents(tx *store.Tx, events []*registryv1.RegistryEvent) error {
	for _, ev := range events {
		seq, err := tx.NextSequence(bucketEvents)
		if err != nil {
			return err
		}
		ev.Sequence = seq
		if err := tx.Put(bucketEvents, store.SeqKey(seq), ev); err != nil {
			return err
		}
	}
	return nil
}

func newConnection() *registryv1.Connection         { return &registryv1.Connection{} }
func newConfigRevision() *registryv1.ConfigRevision { return &registryv1.ConfigRevision{} }
func newSnapshot() *registryv1.DiscoverySnapshot    { return &registryv1.DiscoverySnapshot{} }
func newMapping() *registryv1.Mapping               { return &registryv1.Mapping{} }
func newEvent() *registryv1.RegistryEvent           { return &registryv1.RegistryEvent{} }

func getSnapshot(tx *store.Tx, id string) (*registryv1.DiscoverySnapshot, error) {
	key := &wrapperspb.StringValue{}
	if err := tx.Get(bucketSnapshotIndex, id, key); err != nil {
		return nil, err
	}
	s := newSnapshot()
	if err := tx.Get(bucketSnapshots, key.GetValue(), s); err != nil {
		return nil, err
	}
	return s, nil
}

func (b *boltStore) GetConnection(ctx context.Context, id string) (*registryv1.Connection, error) {
	c := newConnection()
	err := b.view(ctx, func(tx *store.Tx) error { return tx.Get(bucketConnections, id, c) })
	if err != nil {
		return nil, fmt.Errorf("connection %s: %w", id, err)
	}
	return c, nil
}

func (b *boltStore) ListConnections(ctx context.Context) ([]*registryv1.Connection, error) {
	var out []*registryv1.Connection
	err := b.view(ctx, func(tx *store.Tx) error {
		return store.List(tx, bucketConnections, "", newConnection, func(_ string, c *registryv1.Connection) error {
			out = append(out, c)
			return nil
		})
	})
	return out, err
}

func (b *boltStore) ListConfigRevisions(ctx context.Context, connectionID string) ([]*registryv1.ConfigRevision, error) {
	var out []*registryv1.ConfigRevision
	err := b.view(ctx, func(tx *store.Tx) error {
		return store.List(tx, bucketConfigRevisions, connectionID+"/", newConfigRevision, func(_ string, r *registryv1.ConfigRevision) error {
			out = append(out, r)
			return nil
		})
	})
	return out, err
}

func (b *boltStore) GetSnapshot(ctx context.Context, id string) (*registryv1.DiscoverySnapshot, error) {
	var s *registryv1.DiscoverySnapshot
	err := b.view(ctx, func(tx *store.Tx) error {
		var err error
		s, err = getSnapshot(tx, id)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", id, err)
	}
	return s, nil
}

func (b *boltStore) ListSnapshots(ctx context.Context, connectionID string) ([]*registryv1.DiscoverySnapshot, error) {
	var out []*registryv1.DiscoverySnapshot
	err := b.view(ctx, func(tx *store.Tx) error {
		return store.List(tx, bucketSnapshots, connectionID+"/", newSnapshot, func(_ string, s *registryv1.DiscoverySnapshot) error {
			out = append(out, s)
			return nil
		})
	})
	return out, err
}

func (b *boltStore) GetMapping(ctx context.Context, id string, revision int64) (*registryv1.Mapping, error) {
	m := newMapping()
	err := b.view(ctx, func(tx *store.Tx) error {
		if revision == 0 {
			return tx.Get(bucketMappings, id, m)
		}
		return tx.Get(bucketMappingRevisions, childKey(id, revision), m)
	})
	if err != nil {
		return nil, fmt.Errorf("mapping %s revision %d: %w", id, revision, err)
	}
	return m, nil
}

func (b *boltStore) ReadExecution(ctx context.Context, mappingID, capability, connectionID string) (Execution, error) {
	var x Execution
	err := b.view(ctx, func(tx *store.Tx) error {
		var err error
		if x.Mapping, err = store.GetOptional(tx, bucketMappings, mappingID, newMapping()); err != nil {
			return err
		}
		if x.Capability, err = store.GetOptional(tx, bucketCapabilities, capability, newCapability()); err != nil {
			return err
		}
		x.Connection, err = store.GetOptional(tx, bucketConnections, connectionID, newConnection())
		return err
	})
	if err != nil {
		return Execution{}, fmt.Errorf("read execution of mapping %s: %w", mappingID, err)
	}
	return x, nil
}

func (b *boltStore) ListMappings(ctx context.Context) ([]*registryv1.Mapping, error) {
	var out []*registryv1.Mapping
	err := b.view(ctx, func(tx *store.Tx) error {
		return store.List(tx, bucketMappings, "", newMapping, func(_ string, m *registryv1.Mapping) error {
			out = append(out, m)
			return nil
		})
	})
	return out, err
}

func (b *boltStore) ListEvents(ctx context.Context, after int64, limit int) ([]*registryv1.RegistryEvent, error) {
	var out []*registryv1.RegistryEvent
	stop := errors.New("page full")
	err := b.view(ctx, func(tx *store.Tx) error {
		// store.List walks a prefix, so cover "every key after" with the
		// prefixes that sort after it instead of decoding the whole log.
		for _, prefix := range prefixesFrom(store.SeqKey(after + 1)) {
			err := store.List(tx, bucketEvents, prefix, newEvent, func(_ string, ev *registryv1.RegistryEvent) error {
				out = append(out, ev)
				if len(out) >= limit {
					return stop
				}
				return nil
			})
			if err != nil {
				return err
			}
		}
		return nil
	})
	if errors.Is(err, stop) {
		err = nil
	}
	return out, err
}

// prefixesFrom returns, in key order, prefixes that together match exactly
// the fixed-width decimal keys >= start: start itself, then for each
// position from the last, the same head followed by a greater digit.
func prefixesFrom(start string) []string {
	out := []string{start}
	for i := len(start) - 1; i >= 0; i-- {
		for d := start[i] + 1; d <= '9'; d++ {
			out = append(out, start[:i]+string(rune(d)))
		}
	}
	return out
}

func (b *boltStore) view(ctx context.Context, fn func(*store.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return b.db.View(fn)
}
