// Package storetest is the registry Store's conformance suite: the same
// tests run against every implementation (embedded file and Redis), so
// the service behaves the same whichever store a deployment chooses.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/store"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/registry"
)

// Run runs every conformance test; newStore returns an empty store that
// lives until the (sub)test ends.
func Run(t *testing.T, newStore func(t *testing.T) registry.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, st registry.Store)
	}{
		{"ConnectionCRUD", testConnectionCRUD},
		{"ConfigRevisions", testConfigRevisions},
		{"Snapshots", testSnapshots},
		{"MappingRevisions", testMappingRevisions},
		{"ReadExecution", testReadExecution},
		{"FailedUpdateWritesNothing", testFailedUpdateWritesNothing},
		{"EventOrder", testEventOrder},
		{"ConcurrentUpdatesLoseNothing", testConcurrentUpdates},
	}
	tests = append(tests, definitionTests...)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, newStore(t))
		})
	}
}

func conn(id string) *registryv1.Connection {
	return &registryv1.Connection{Id: id, DisplayName: "conn " + id, Owner: "alice", ConfigRevision: 1}
}

func rev(id string, n int64) *registryv1.ConfigRevision {
	return &registryv1.ConfigRevision{ConnectionId: id, Revision: n, Reason: fmt.Sprintf("revision %d", n)}
}

func event(id, detail string) *registryv1.RegistryEvent {
	return &registryv1.RegistryEvent{Type: registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_CONNECTION_CREATED, ConnectionId: id, Detail: detail}
}

func create(t *testing.T, st registry.Store, id string) {
	t.Helper()
	if err := st.CreateConnection(context.Background(), conn(id), rev(id, 1), event(id, "created")); err != nil {
		t.Fatalf("create %s: %v", id, err)
	}
}

func testConnectionCRUD(t *testing.T, st registry.Store) {
	ctx := context.Background()
	if _, err := st.GetConnection(ctx, "conn_missing"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("get missing: err = %v, want ErrNotFound", err)
	}
	create(t, st, "conn_a")
	create(t, st, "conn_b")
	ev := event("conn_a", "again")
	if err := st.CreateConnection(ctx, conn("conn_a"), rev("conn_a", 1), ev); !errors.Is(err, store.ErrExists) {
		t.Errorf("create twice: err = %v, want ErrExists", err)
	}
	got, err := st.GetConnection(ctx, "conn_a")
	if err != nil || !proto.Equal(got, conn("conn_a")) {
		t.Errorf("get = %v, %v; want %v", got, err, conn("conn_a"))
	}
	all, err := st.ListConnections(ctx)
	if err != nil || len(all) != 2 {
		t.Errorf("list = %d connections, %v; want 2", len(all), err)
	}
	if err := st.UpdateConnection(ctx, "conn_missing", func(*registry.ConnectionUpdate) error { return nil }); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("update missing: err = %v, want ErrNotFound", err)
	}
	err = st.UpdateConnection(ctx, "conn_a", func(u *registry.ConnectionUpdate) error {
		u.Connection.DisplayName = "renamed"
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := st.GetConnection(ctx, "conn_a"); got.GetDisplayName() != "renamed" {
		t.Errorf("after update display name = %q", got.GetDisplayName())
	}
	err = st.UpdateConnection(ctx, "conn_a", func(u *registry.ConnectionUpdate) error {
		u.Connection.Id = "conn_other"
		return nil
	})
	if err == nil {
		t.Error("an update changing the connection id succeeded")
	}
}

func testConfigRevisions(t *testing.T, st registry.Store) {
	ctx := context.Background()
	create(t, st, "conn_a")
	for n := int64(2); n <= 3; n++ {
		err := st.UpdateConnection(ctx, "conn_a", func(u *registry.ConnectionUpdate) error {
			u.Connection.ConfigRevision = n
			u.Revision = rev("conn_a", n)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// A revision number that exists is refused, and nothing is written.
	err := st.UpdateConnection(ctx, "conn_a", func(u *registry.ConnectionUpdate) error {
		u.Connection.ConfigRevision = 2
		u.Revision = rev("conn_a", 2)
		return nil
	})
	if !errors.Is(err, store.ErrExists) {
		t.Errorf("reusing revision 2: err = %v, want ErrExists", err)
	}
	if got, _ := st.GetConnection(ctx, "conn_a"); got.GetConfigRevision() != 3 {
		t.Errorf("refused update changed the connection: config revision %d", got.GetConfigRevision())
	}
	revs, err := st.ListConfigRevisions(ctx, "conn_a")
	if err != nil {
		t.Fatal(err)
	}
	if len(revs) != 3 {
		t.Fatalf("%d revisions, want 3", len(revs))
	}
	for i, r := range revs {
		if r.GetRevision() != int64(i+1) {
			t.Errorf("revision %d at position %d; want oldest first", r.GetRevision(), i)
		}
	}
	if other, _ := st.ListConfigRevisions(ctx, "conn_a2"); len(other) != 0 {
		t.Errorf("a connection whose id extends another's sees %d revisions", len(other))
	}
}

func testSnapshots(t *testing.T, st registry.Store) {
	ctx := context.Background()
	create(t, st, "conn_a")
	for i := 1; i <= 12; i++ {
		sid := fmt.Sprintf("snap_%02d", i)
		err := st.UpdateConnection(ctx, "conn_a", func(u *registry.ConnectionUpdate) error {
			if i > 1 && u.LatestSnapshot.GetId() != fmt.Sprintf("snap_%02d", i-1) {
				return fmt.Errorf("latest snapshot = %q before %s", u.LatestSnapshot.GetId(), sid)
			}
			u.Snapshot = &registryv1.DiscoverySnapshot{Id: sid, ConnectionId: "conn_a", Digest: "sha256:" + sid}
			u.Connection.LatestSnapshotId = sid
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	err := st.UpdateConnection(ctx, "conn_a", func(u *registry.ConnectionUpdate) error {
		u.Snapshot = &registryv1.DiscoverySnapshot{Id: "snap_03", ConnectionId: "conn_a"}
		return nil
	})
	if !errors.Is(err, store.ErrExists) {
		t.Errorf("snapshot id reused: err = %v, want ErrExists", err)
	}
	s, err := st.GetSnapshot(ctx, "snap_07")
	if err != nil || s.GetDigest() != "sha256:snap_07" {
		t.Errorf("get snapshot = %v, %v", s, err)
	}
	if _, err := st.GetSnapshot(ctx, "snap_missing"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("missing snapshot: err = %v", err)
	}
	all, err := st.ListSnapshots(ctx, "conn_a")
	if err != nil || len(all) != 12 {
		t.Fatalf("list = %d, %v; want 12", len(all), err)
	}
	for i, s := range all {
		if want := fmt.Sprintf("snap_%02d", i+1); s.GetId() != want {
			t.Errorf("position %d = %s, want %s (oldest first)", i, s.GetId(), want)
		}
	}
}

func mapping(id, connID string, rev int64, st registryv1.MappingState) *registryv1.Mapping {
	return &registryv1.Mapping{Id: id, Revision: rev, ConnectionId: connID, Capability: "notes.search", State: st}
}

func writeMappings(st registry.Store, connID string, ms ...*registryv1.Mapping) error {
	return st.UpdateConnection(context.Background(), connID, func(u *registry.ConnectionUpdate) error {
		u.WriteMappings = ms
		return nil
	})
}

func testMappingRevisions(t *testing.T, st registry.Store) {
	ctx := context.Background()
	create(t, st, "conn_a")
	create(t, st, "conn_b")
	active := registryv1.MappingState_MAPPING_STATE_ACTIVE
	suspended := registryv1.MappingState_MAPPING_STATE_REVIEW_REQUIRED
	if err := writeMappings(st, "conn_a", mapping("map_1", "conn_a", 2, active)); err == nil {
		t.Error("a new mapping at revision 2 was accepted")
	}
	if err := writeMappings(st, "conn_a", mapping("map_1", "conn_a", 1, active)); err != nil {
		t.Fatal(err)
	}
	// Replacing the current revision and appending the next are allowed,
	// even chained in one update.
	if err := writeMappings(st, "conn_a", mapping("map_1", "conn_a", 1, suspended), mapping("map_1", "conn_a", 2, active)); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []*registryv1.Mapping{
		mapping("map_1", "conn_a", 1, active), // behind the current revision
		mapping("map_1", "conn_a", 4, active), // skips a revision
	} {
		if err := writeMappings(st, "conn_a", bad); err == nil {
			t.Errorf("write of revision %d after 2 accepted", bad.GetRevision())
		}
	}
	if err := writeMappings(st, "conn_b", mapping("map_1", "conn_b", 3, active)); err == nil {
		t.Error("another connection took over map_1")
	}
	cur, err := st.GetMapping(ctx, "map_1", 0)
	if err != nil || cur.GetRevision() != 2 || cur.GetState() != active {
		t.Errorf("current = %v, %v; want revision 2 active", cur, err)
	}
	old, err := st.GetMapping(ctx, "map_1", 1)
	if err != nil || old.GetState() != suspended {
		t.Errorf("revision 1 = %v, %v; want the replaced (suspended) revision 1", old, err)
	}
	if _, err := st.GetMapping(ctx, "map_1", 9); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("revision 9: err = %v, want ErrNotFound", err)
	}
	if err := writeMappings(st, "conn_b", mapping("map_2", "conn_b", 1, active)); err != nil {
		t.Fatal(err)
	}
	all, err := st.ListMappings(ctx)
	if err != nil || len(all) != 2 {
		t.Errorf("list = %d, %v; want 2", len(all), err)
	}
	err = st.UpdateConnection(ctx, "conn_a", func(u *registry.ConnectionUpdate) error {
		if len(u.Mappings) != 1 || u.Mapping("map_1").GetRevision() != 2 {
			return fmt.Errorf("update of conn_a loaded mappings %v, want map_1 at revision 2", u.Mappings)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
}

// ReadExecution reads a mapping and a capability at their current
// revisions and a connection together; a missing part is nil, not an
// error, so a caller that guessed a name wrong reads it again by the right
// one.
func testReadExecution(t *testing.T, st registry.Store) {
	ctx := context.Background()
	create(t, st, "conn_a")
	createCapability(t, st, "notes.search")
	active := registryv1.MappingState_MAPPING_STATE_ACTIVE
	if err := writeMappings(st, "conn_a", mapping("map_1", "conn_a", 1, active)); err != nil {
		t.Fatal(err)
	}
	if err := writeMappings(st, "conn_a", mapping("map_1", "conn_a", 2, active)); err != nil {
		t.Fatal(err)
	}
	if err := writeCapability(st, "notes.search", capability("notes.search", 2)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name                      string
		mapping, capability, conn string
		want                      registry.Execution
	}{
		{"all three", "map_1", "notes.search", "conn_a",
			registry.Execution{Mapping: mapping("map_1", "conn_a", 2, active), Capability: capability("notes.search", 2), Connection: conn("conn_a")}},
		{"connection not named", "map_1", "notes.search", "",
			registry.Execution{Mapping: mapping("map_1", "conn_a", 2, active), Capability: capability("notes.search", 2)}},
		{"nothing named", "", "", "", registry.Execution{}},
		{"none exists", "map_missing", "missing.capability", "conn_missing", registry.Execution{}},
		{"only the connection exists", "map_missing", "", "conn_a", registry.Execution{Connection: conn("conn_a")}},
	} {
		got, err := st.ReadExecution(ctx, tc.mapping, tc.capability, tc.conn)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if !proto.Equal(got.Mapping, tc.want.Mapping) || !proto.Equal(got.Capability, tc.want.Capability) || !proto.Equal(got.Connection, tc.want.Connection) {
			t.Errorf("%s: ReadExecution = %v\nwant %v", tc.name, got, tc.want)
		}
		if (got.Mapping == nil) != (tc.want.Mapping == nil) || (got.Capability == nil) != (tc.want.Capability == nil) || (got.Connection == nil) != (tc.want.Connection == nil) {
			t.Errorf("%s: a missing part is not nil: %v", tc.name, got)
		}
	}
}

func testFailedUpdateWritesNothing(t *testing.T, st registry.Store) {
	ctx := context.Background()
	create(t, st, "conn_a")
	sentinel := errors.New("refused by the server")
	err := st.UpdateConnection(ctx, "conn_a", func(u *registry.ConnectionUpdate) error {
		u.Connection.DisplayName = "changed"
		u.Revision = rev("conn_a", 2)
		u.Snapshot = &registryv1.DiscoverySnapshot{Id: "snap_x", ConnectionId: "conn_a"}
		u.WriteMappings = []*registryv1.Mapping{mapping("map_x", "conn_a", 1, registryv1.MappingState_MAPPING_STATE_ACTIVE)}
		u.Events = []*registryv1.RegistryEvent{event("conn_a", "should not exist")}
		return sentinel
	})
	if err != sentinel && !errors.Is(err, sentinel) {
		t.Errorf("err = %v, want the update function's error unchanged", err)
	}
	// A write that conflicts after fn succeeded also leaves nothing.
	err = st.UpdateConnection(ctx, "conn_a", func(u *registry.ConnectionUpdate) error {
		u.Connection.DisplayName = "changed"
		u.Snapshot = &registryv1.DiscoverySnapshot{Id: "snap_y", ConnectionId: "conn_a"}
		u.Events = []*registryv1.RegistryEvent{event("conn_a", "should not exist")}
		u.WriteMappings = []*registryv1.Mapping{mapping("map_y", "conn_a", 5, registryv1.MappingState_MAPPING_STATE_ACTIVE)}
		return nil
	})
	if err == nil {
		t.Error("conflicting mapping write accepted")
	}
	c, _ := st.GetConnection(ctx, "conn_a")
	revs, _ := st.ListConfigRevisions(ctx, "conn_a")
	snaps, _ := st.ListSnapshots(ctx, "conn_a")
	maps, _ := st.ListMappings(ctx)
	evs, _ := st.ListEvents(ctx, 0, 100)
	if c.GetDisplayName() == "changed" || len(revs) != 1 || len(snaps) != 0 || len(maps) != 0 || len(evs) != 1 {
		t.Errorf("failed updates left: name %q, %d revisions, %d snapshots, %d mappings, %d events",
			c.GetDisplayName(), len(revs), len(snaps), len(maps), len(evs))
	}
}

func testEventOrder(t *testing.T, st registry.Store) {
	ctx := context.Background()
	create(t, st, "conn_a")
	for i := range 14 {
		err := st.UpdateConnection(ctx, "conn_a", func(u *registry.ConnectionUpdate) error {
			u.Events = []*registryv1.RegistryEvent{event("conn_a", fmt.Sprintf("a%d", i)), event("conn_a", fmt.Sprintf("b%d", i))}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	var all []*registryv1.RegistryEvent
	for after := int64(0); ; {
		page, err := st.ListEvents(ctx, after, 5)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) > 5 {
			t.Fatalf("page of %d events, limit 5", len(page))
		}
		if len(page) == 0 {
			break
		}
		all = append(all, page...)
		after = page[len(page)-1].GetSequence()
	}
	if len(all) != 29 {
		t.Fatalf("%d events, want 29", len(all))
	}
	for i, ev := range all {
		if ev.GetSequence() != int64(i+1) {
			t.Errorf("event %d has sequence %d, want %d", i, ev.GetSequence(), i+1)
		}
	}
	if all[1].GetDetail() != "a0" || all[2].GetDetail() != "b0" || all[28].GetDetail() != "b13" {
		t.Errorf("events out of order: %q %q %q", all[1].GetDetail(), all[2].GetDetail(), all[28].GetDetail())
	}
	tail, err := st.ListEvents(ctx, 27, 100)
	if err != nil || len(tail) != 2 || tail[0].GetSequence() != 28 {
		t.Errorf("events after 27 = %v, %v", tail, err)
	}
}

// testConcurrentUpdates runs 50 writers on one connection; each appends a
// mapping revision and an event derived from what it read. An
// implementation that lost an update would skip or repeat a revision.
func testConcurrentUpdates(t *testing.T, st registry.Store) {
	ctx := context.Background()
	create(t, st, "conn_a")
	if err := writeMappings(st, "conn_a", mapping("map_1", "conn_a", 1, registryv1.MappingState_MAPPING_STATE_ACTIVE)); err != nil {
		t.Fatal(err)
	}
	const writers = 50
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for range writers {
		wg.Go(func() {
			errs <- st.UpdateConnection(ctx, "conn_a", func(u *registry.ConnectionUpdate) error {
				next := proto.CloneOf(u.Mapping("map_1"))
				next.Revision++
				u.WriteMappings = []*registryv1.Mapping{next}
				u.Connection.ConfigRevision++
				u.Events = []*registryv1.RegistryEvent{event("conn_a", fmt.Sprintf("to %d", next.Revision))}
				return nil
			})
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	cur, err := st.GetMapping(ctx, "map_1", 0)
	if err != nil || cur.GetRevision() != writers+1 {
		t.Errorf("mapping revision = %d, %v; want %d", cur.GetRevision(), err, writers+1)
	}
	if c, _ := st.GetConnection(ctx, "conn_a"); c.GetConfigRevision() != writers+1 {
		t.Errorf("connection counter = %d, want %d", c.GetConfigRevision(), writers+1)
	}
	evs, err := st.ListEvents(ctx, 0, 1000)
	if err != nil || len(evs) != writers+1 {
		t.Fatalf("%d events, %v; want %d", len(evs), err, writers+1)
	}
	for i, ev := range evs {
		if ev.GetSequence() != int64(i+1) {
			t.Fatalf("event %d has sequence %d", i, ev.GetSequence())
		}
		if i > 0 && ev.GetDetail() != fmt.Sprintf("to %d", i+1) {
			t.Errorf("event %d = %q, want %q (events in commit order)", i, ev.GetDetail(), fmt.Sprintf("to %d", i+1))
		}
	}
}
