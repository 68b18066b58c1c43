package registry

import (
	"context"
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/store"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// Buckets of declared definitions in the bbolt layout, beside those in
// store_bolt.go. Names are lower snake case, so they never contain the
// "/" that separates a parent from its revision.
const (
	bucketCapabilities        = "capabilities"         // name -> current Capability revision
	bucketCapabilityRevisions = "capability_revisions" // name/SeqKey(rev) -> Capability revision
	bucketProfiles            = "task_profiles"        // name -> current TaskProfile revision
	bucketProfileRevisions    = "task_profile_revisions"
)

// definition is what capabilities and task profiles share in the store:
// a name and revisions.
type definition interface {
	proto.Message
	GetName() string
	GetRevision() int64
}

func newCapability() *registryv1.Capability { return &registryv1.Capability{} }
func newProfile() *registryv1.TaskProfile   { return &registryv1.TaskProfile{} }

// createDefinition stores revision 1 of a new definition.
func createDefinition(tx *store.Tx, bucket, revisions string, d definition) error {
	if d.GetRevision() != 1 {
		return fmt.Errorf("new definition %s at revision %d: %w", d.GetName(), d.GetRevision(), errConflict)
	}
	if err := tx.Create(bucket, d.GetName(), d); err != nil {
		return fmt.Errorf("create %s: %w", d.GetName(), err)
	}
	return tx.Put(revisions, childKey(d.GetName(), 1), d)
}

// writeDefinition replaces the current revision of cur's definition or
// appends the next one, as next says.
func writeDefinition(tx *store.Tx, bucket, revisions string, cur, next definition) error {
	if err := checkDefinitionWrite(cur, next); err != nil {
		return err
	}
	if err := tx.Put(bucket, next.GetName(), next); err != nil {
		return err
	}
	return tx.Put(revisions, childKey(next.GetName(), next.GetRevision()), next)
}

// checkDefinitionWrite is the rule both stores apply to a definition write.
func checkDefinitionWrite(cur, next definition) error {
	switch {
	case next.GetName() != cur.GetName():
		return fmt.Errorf("update of %s writes %s: %w", cur.GetName(), next.GetName(), errConflict)
	case next.GetRevision() == cur.GetRevision(), next.GetRevision() == cur.GetRevision()+1:
		return nil
	}
	return fmt.Errorf("%s revision %d after %d: %w", cur.GetName(), next.GetRevision(), cur.GetRevision(), errConflict)
}

// checkStateWrite is the rule both stores apply to a mapping written by a
// capability update: a state change of a loaded mapping's current
// revision.
func checkStateWrite(loaded map[string]*registryv1.Mapping, m *registryv1.Mapping) error {
	cur, ok := loaded[m.GetId()]
	switch {
	case !ok:
		return fmt.Errorf("mapping %s is not a mapping of capability %s: %w", m.GetId(), m.GetCapability(), errConflict)
	case cur.GetRevision() != m.GetRevision() || cur.GetConnectionId() != m.GetConnectionId() || cur.GetCapability() != m.GetCapability():
		return fmt.Errorf("mapping %s revision %d written as revision %d: %w", m.GetId(), cur.GetRevision(), m.GetRevision(), errConflict)
	}
	return nil
}

func getDefinition[D definition](tx *store.Tx, bucket, revisions, name string, revision int64, newMsg func() D) (D, error) {
	d := newMsg()
	var err error
	if revision == 0 {
		err = tx.Get(bucket, name, d)
	} else {
		err = tx.Get(revisions, childKey(name, revision), d)
	}
	if err != nil {
		var zero D
		return zero, fmt.Errorf("%s revision %d: %w", name, revision, err)
	}
	return d, nil
}

func (b *boltStore) CreateCapability(ctx context.Context, c *registryv1.Capability, events []*registryv1.RegistryEvent) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return b.db.Update(func(tx *store.Tx) error {
		if err := createDefinition(tx, bucketCapabilities, bucketCapabilityRevisions, c); err != nil {
			return err
		}
		return appendEvents(tx, events)
	})
}

func (b *boltStore) UpdateCapability(ctx context.Context, name string, fn func(*CapabilityUpdate) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return b.db.Update(func(tx *store.Tx) error {
		cur, err := getDefinition(tx, bucketCapabilities, bucketCapabilityRevisions, name, 0, newCapability)
		if err != nil {
			return fmt.Errorf("capability %w", err)
		}
		u := &CapabilityUpdate{Current: cur}
		loaded := map[string]*registryv1.Mapping{}
		// Mappings are few; a scan is cheaper than keeping an index.
		err = store.List(tx, bucketMappings, "", newMapping, func(_ string, m *registryv1.Mapping) error {
			if m.GetCapability() == name {
				u.Mappings = append(u.Mappings, m)
				loaded[m.GetId()] = proto.CloneOf(m)
			}
			return nil
		})
		if err != nil {
			return err
		}
		if err := fn(u); err != nil {
			return err
		}
		if u.Write != nil {
			if err := writeDefinition(tx, bucketCapabilities, bucketCapabilityRevisions, cur, u.Write); err != nil {
				return err
			}
		}
		for _, m := range u.WriteMappings {
			if err := checkStateWrite(loaded, m); err != nil {
				return err
			}
			if err := putMapping(tx, m.GetConnectionId(), m); err != nil {
				return err
			}
		}
		return appendEvents(tx, u.Events)
	})
}

func (b *boltStore) GetCapability(ctx context.Context, name string, revision int64) (*registryv1.Capability, error) {
	var c *registryv1.Capability
	err := b.view(ctx, func(tx *store.Tx) error {
		var err error
		c, err = getDefinition(tx, bucketCapabilities, bucketCapabilityRevisions, name, revision, newCapability)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("capability %w", err)
	}
	return c, nil
}

func (b *boltStore) ListCapabilities(ctx context.Context) ([]*registryv1.Capability, error) {
	var out []*registryv1.Capability
	err := b.view(ctx, func(tx *store.Tx) error {
		return store.List(tx, bucketCapabilities, "", newCapability, func(_ string, c *registryv1.Capability) error {
			out = append(out, c)
			return nil
		})
	})
	return out, err
}

func (b *boltStore) CreateTaskProfile(ctx context.Context, p *registryv1.TaskProfile, events []*registryv1.RegistryEvent) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return b.db.Update(func(tx *store.Tx) error {
		if err := createDefinition(tx, bucketProfiles, bucketProfileRevisions, p); err != nil {
			return err
		}
		return appendEvents(tx, events)
	})
}

func (b *boltStore) UpdateTaskProfile(ctx context.Context, name string, fn func(*ProfileUpdate) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return b.db.Update(func(tx *store.Tx) error {
		cur, err := getDefinition(tx, bucketProfiles, bucketProfileRevisions, name, 0, newProfile)
		if err != nil {
			return fmt.Errorf("task profile %w", err)
		}
		u := &ProfileUpdate{Current: cur}
		if err := fn(u); err != nil {
			return err
		}
		if u.Write != nil {
			if err := writeDefinition(tx, bucketProfiles, bucketProfileRevisions, cur, u.Write); err != nil {
				return err
			}
		}
		return appendEvents(tx, u.Events)
	})
}

func (b *boltStore) GetTaskProfile(ctx context.Context, name string, revision int64) (*registryv1.TaskProfile, error) {
	var p *registryv1.TaskProfile
	err := b.view(ctx, func(tx *store.Tx) error {
		var err error
		p, err = getDefinition(tx, bucketProfiles, bucketProfileRevisions, name, revision, newProfile)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("task profile %w", err)
	}
	return p, nil
}

func (b *boltStore) ListTaskProfiles(ctx context.Context) ([]*registryv1.TaskProfile, error) {
	var out []*registryv1.TaskProfile
	err := b.view(ctx, func(tx *store.Tx) error {
		return store.List(tx, bucketProfiles, "", newProfile, func(_ string, p *registryv1.TaskProfile) error {
			out = append(out, p)
			return nil
		})
	})
	return out, err
}

// boltCapability reads a capability's current revision inside tx, for
// ConnectionUpdate.Capability.
func boltCapability(tx *store.Tx) func(string) (*registryv1.Capability, error) {
	return func(name string) (*registryv1.Capability, error) {
		c, err := getDefinition(tx, bucketCapabilities, bucketCapabilityRevisions, name, 0, newCapability)
		if err != nil {
			return nil, fmt.Errorf("capability %w", err)
		}
		return c, nil
	}
}
