package registry

import (
	"context"

	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// Store is the registry's persistence contract. Every state change that
// touches several records (a connection, its config revisions, snapshots,
// mapping revisions and the events describing them) is committed by one
// call, atomically: a crash or a concurrent writer never leaves half of it.
//
// Lookups of absent records return an error wrapping store.ErrNotFound.
// Errors returned by an update function are returned unchanged (so gRPC
// status errors built by the server reach the caller as they are).
type Store interface {
	// CreateConnection stores a new connection with its first config
	// revision and appends ev. It fails with store.ErrExists if the id is
	// taken.
	CreateConnection(ctx context.Context, c *registryv1.Connection, rev *registryv1.ConfigRevision, ev *registryv1.RegistryEvent) error
	// UpdateConnection loads one connection and everything that depends on
	// it into a ConnectionUpdate, calls fn, and commits what fn left in it,
	// all in one transaction. If fn returns an error nothing is written.
	// An optimistic implementation may call fn again (on a fresh
	// ConnectionUpdate) after a conflicting write, so fn must derive
	// everything from its argument.
	UpdateConnection(ctx context.Context, id string, fn func(*ConnectionUpdate) error) error

	// GetConnection returns one connection.
	GetConnection(ctx context.Context, id string) (*registryv1.Connection, error)
	// ListConnections returns every connection, in no particular order.
	ListConnections(ctx context.Context) ([]*registryv1.Connection, error)
	// ListConfigRevisions returns a connection's config revisions, oldest
	// first.
	ListConfigRevisions(ctx context.Context, connectionID string) ([]*registryv1.ConfigRevision, error)

	// GetSnapshot returns one discovery snapshot.
	GetSnapshot(ctx context.Context, id string) (*registryv1.DiscoverySnapshot, error)
	// ListSnapshots returns a connection's snapshots, oldest first.
	ListSnapshots(ctx context.Context, connectionID string) ([]*registryv1.DiscoverySnapshot, error)

	// GetMapping returns a mapping at its current revision (revision 0) or
	// at a past revision.
	GetMapping(ctx context.Context, id string, revision int64) (*registryv1.Mapping, error)
	// ListMappings returns every mapping at its current revision, in no
	// particular order.
	ListMappings(ctx context.Context) ([]*registryv1.Mapping, error)
	// ReadExecution reads, at one moment, what a call runs on: mapping
	// mappingID and capability at their current revisions and connection
	// connectionID. A part that does not exist (or whose name is "") is
	// left nil; only a failure to read is an error.
	ReadExecution(ctx context.Context, mappingID, capability, connectionID string) (Execution, error)

	// ListEvents returns up to limit events with a sequence greater than
	// after, in sequence order.
	ListEvents(ctx context.Context, after int64, limit int) ([]*registryv1.RegistryEvent, error)

	// CreateCapability stores revision 1 of a new capability and appends
	// events. It fails with store.ErrExists if the name is taken.
	CreateCapability(ctx context.Context, c *registryv1.Capability, events []*registryv1.RegistryEvent) error
	// UpdateCapability loads one capability and the current revision of
	// every mapping of it (on any connection) into a CapabilityUpdate,
	// calls fn, and commits what fn left in it, all in one transaction, so
	// a new revision and the mappings it sends to review are one change.
	// If fn returns an error nothing is written; like UpdateConnection, fn
	// may run again after a conflicting write.
	UpdateCapability(ctx context.Context, name string, fn func(*CapabilityUpdate) error) error
	// GetCapability returns a capability at its current revision
	// (revision 0) or at a past revision.
	GetCapability(ctx context.Context, name string, revision int64) (*registryv1.Capability, error)
	// ListCapabilities returns every capability at its current revision,
	// in no particular order.
	ListCapabilities(ctx context.Context) ([]*registryv1.Capability, error)

	// CreateTaskProfile stores revision 1 of a new task profile and
	// appends events. It fails with store.ErrExists if the name is taken.
	CreateTaskProfile(ctx context.Context, p *registryv1.TaskProfile, events []*registryv1.RegistryEvent) error
	// UpdateTaskProfile loads one profile into a ProfileUpdate, calls fn
	// and commits what fn left in it, in one transaction (fn may run
	// again after a conflicting write).
	UpdateTaskProfile(ctx context.Context, name string, fn func(*ProfileUpdate) error) error
	// GetTaskProfile returns a profile at its current revision (revision
	// 0) or at a past revision.
	GetTaskProfile(ctx context.Context, name string, revision int64) (*registryv1.TaskProfile, error)
	// ListTaskProfiles returns every profile at its current revision, in
	// no particular order.
	ListTaskProfiles(ctx context.Context) ([]*registryv1.TaskProfile, error)
}

// Execution is what one call runs on, as ReadExecution read it.
type Execution struct {
	Mapping    *registryv1.Mapping
	Capability *registryv1.Capability
	Connection *registryv1.Connection
}

// ConnectionUpdate is one connection's state as read inside a store
// transaction, plus the records the update function wants committed with
// it. The loaded messages are private copies: fn may change them in place.
type ConnectionUpdate struct {
	// Connection is the current record; it is written back as fn leaves it.
	Connection *registryv1.Connection
	// Mappings holds the current revision of every mapping on this
	// connection. They are read-only context: only those listed in
	// WriteMappings are written.
	Mappings []*registryv1.Mapping
	// LatestSnapshot is the connection's latest snapshot, nil if none.
	LatestSnapshot *registryv1.DiscoverySnapshot

	// Revision, if set, is a new config revision to store. Its number must
	// not exist yet.
	Revision *registryv1.ConfigRevision
	// Snapshot, if set, is a new immutable snapshot to store. Its id must
	// not exist yet.
	Snapshot *registryv1.DiscoverySnapshot
	// WriteMappings are written in order. A mapping whose revision equals
	// the stored current revision replaces it; revision current+1 (or 1 for
	// a new id) appends a new revision and makes it current. Any other
	// revision is a conflict. Earlier revisions stay readable as history.
	WriteMappings []*registryv1.Mapping
	// Events are appended in order; the store assigns their sequences.
	Events []*registryv1.RegistryEvent

	// capability reads a capability's current revision inside the
	// transaction (set by the store).
	capability func(name string) (*registryv1.Capability, error)
}

// Capability returns the current revision of the named capability as the
// transaction sees it, so a decision that depends on it (a review, a
// proposal) conflicts with a concurrent capability revision instead of
// racing it. An absent capability is an error wrapping store.ErrNotFound.
func (u *ConnectionUpdate) Capability(name string) (*registryv1.Capability, error) {
	return u.capability(name)
}

// Mapping returns the current revision of the mapping with the given id on
// this connection, or nil.
func (u *ConnectionUpdate) Mapping(id string) *registryv1.Mapping {
	for _, m := range u.Mappings {
		if m.GetId() == id {
			return m
		}
	}
	return nil
}

// CapabilityUpdate is one capability as read inside a store transaction,
// plus what the update function wants committed with it. The loaded
// messages are private copies.
type CapabilityUpdate struct {
	// Current is the capability at its current revision; read-only.
	Current *registryv1.Capability
	// Mappings holds the current revision of every mapping of the
	// capability, on every connection; read-only context.
	Mappings []*registryv1.Mapping

	// Write, if set, is stored: at Current's revision it replaces the
	// current revision (a state change such as deprecation); at the next
	// revision it appends a new revision and makes it current. Any other
	// revision, or another name, is a conflict. Nil writes no capability.
	Write *registryv1.Capability
	// WriteMappings are state changes of mappings listed in Mappings: each
	// replaces its mapping's current revision (the revision must equal
	// it).
	WriteMappings []*registryv1.Mapping
	// Events are appended in order; the store assigns their sequences.
	Events []*registryv1.RegistryEvent
}

// ProfileUpdate is one task profile as read inside a store transaction,
// plus what the update function wants committed with it.
type ProfileUpdate struct {
	// Current is the profile at its current revision; read-only.
	Current *registryv1.TaskProfile
	// Write follows the rules of CapabilityUpdate.Write.
	Write *registryv1.TaskProfile
	// Events are appended in order; the store assigns their sequences.
	Events []*registryv1.RegistryEvent
}
