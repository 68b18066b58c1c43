package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/store"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/registry"
)

// definitionTests are the conformance tests of declared capabilities and
// task profiles.
var definitionTests = []struct {
	name string
	fn   func(t *testing.T, st registry.Store)
}{
	{"CapabilityRevisions", testCapabilityRevisions},
	{"CapabilityUpdateMovesMappings", testCapabilityUpdateMovesMappings},
	{"FailedCapabilityUpdateWritesNothing", testFailedCapabilityUpdate},
	{"CapabilityUpdateWithoutWritesIsSilent", testCapabilityNoop},
	{"ConnectionUpdateReadsCapability", testConnectionUpdateReadsCapability},
	{"ConcurrentCapabilityRevisions", testConcurrentCapabilityRevisions},
	{"RevisionAndReviewNeverInterleave", testRevisionAndReviewRace},
	{"ProfileRevisions", testProfileRevisions},
}

func capability(name string, rev int64) *registryv1.Capability {
	return &registryv1.Capability{
		Name: name, Revision: rev, EffectClass: registryv1.EffectClass_EFFECT_CLASS_RETRIEVAL,
		Description: fmt.Sprintf("%s at revision %d", name, rev), State: registryv1.DefinitionState_DEFINITION_STATE_ACTIVE,
	}
}

func defEvent(t registryv1.RegistryEventType, name, detail string) *registryv1.RegistryEvent {
	return &registryv1.RegistryEvent{Type: t, Definition: name, Detail: detail}
}

func createCapability(t *testing.T, st registry.Store, name string) {
	t.Helper()
	ev := defEvent(registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_CAPABILITY_REVISED, name, "declared")
	if err := st.CreateCapability(context.Background(), capability(name, 1), []*registryv1.RegistryEvent{ev}); err != nil {
		t.Fatalf("create capability %s: %v", name, err)
	}
	if ev.GetSequence() == 0 {
		t.Errorf("create capability %s: the event was given no sequence", name)
	}
}

func writeCapability(st registry.Store, name string, next *registryv1.Capability) error {
	return st.UpdateCapability(context.Background(), name, func(u *registry.CapabilityUpdate) error {
		u.Write = next
		return nil
	})
}

func testCapabilityRevisions(t *testing.T, st registry.Store) {
	ctx := context.Background()
	if _, err := st.GetCapability(ctx, "notes_search", 0); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("get missing: err = %v, want ErrNotFound", err)
	}
	if err := writeCapability(st, "notes_search", capability("notes_search", 1)); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("update missing: err = %v, want ErrNotFound", err)
	}
	if err := st.CreateCapability(ctx, capability("notes_search", 2), nil); err == nil {
		t.Error("a new capability at revision 2 was accepted")
	}
	createCapability(t, st, "notes_search")
	createCapability(t, st, "notes_search_extended") // a name that extends another's
	if err := st.CreateCapability(ctx, capability("notes_search", 1), nil); !errors.Is(err, store.ErrExists) {
		t.Errorf("create twice: err = %v, want ErrExists", err)
	}
	if err := writeCapability(st, "notes_search", capability("notes_search", 2)); err != nil {
		t.Fatal(err)
	}
	deprecated := capability("notes_search", 2)
	deprecated.State = registryv1.DefinitionState_DEFINITION_STATE_DEPRECATED
	if err := writeCapability(st, "notes_search", deprecated); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []*registryv1.Capability{
		capability("notes_search", 1),          // behind the current revision
		capability("notes_search", 4),          // skips a revision
		capability("notes_search_extended", 3), // another capability
	} {
		if err := writeCapability(st, "notes_search", bad); err == nil {
			t.Errorf("write of %s revision %d through notes_search at 2 accepted", bad.GetName(), bad.GetRevision())
		}
	}
	cur, err := st.GetCapability(ctx, "notes_search", 0)
	if err != nil || !proto.Equal(cur, deprecated) {
		t.Errorf("current = %v, %v; want revision 2 deprecated", cur, err)
	}
	if old, err := st.GetCapability(ctx, "notes_search", 1); err != nil || !proto.Equal(old, capability("notes_search", 1)) {
		t.Errorf("revision 1 = %v, %v; want it kept as it was", old, err)
	}
	if r2, err := st.GetCapability(ctx, "notes_search", 2); err != nil || !proto.Equal(r2, deprecated) {
		t.Errorf("revision 2 = %v, %v; want the replaced (deprecated) revision", r2, err)
	}
	if _, err := st.GetCapability(ctx, "notes_search", 3); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("revision 3: err = %v, want ErrNotFound", err)
	}
	all, err := st.ListCapabilities(ctx)
	if err != nil || len(all) != 2 {
		t.Fatalf("list = %d, %v; want 2", len(all), err)
	}
	for _, c := range all {
		if c.GetName() == "notes_search" && c.GetRevision() != 2 {
			t.Errorf("list shows notes_search at revision %d, want the current 2", c.GetRevision())
		}
	}
}

// capMappings creates two connections holding mappings of notes_search in
// several states, and one mapping of another capability.
func capMappings(t *testing.T, st registry.Store) {
	t.Helper()
	create(t, st, "conn_a")
	create(t, st, "conn_b")
	active := registryv1.MappingState_MAPPING_STATE_ACTIVE
	m := func(id, conn, capName string, rev int64, s registryv1.MappingState) *registryv1.Mapping {
		return &registryv1.Mapping{Id: id, Revision: rev, ConnectionId: conn, Capability: capName, CapabilityRevision: 1, State: s}
	}
	if err := writeMappings(st, "conn_a",
		m("map_a1", "conn_a", "notes_search", 1, active),
		m("map_a2", "conn_a", "notes_search", 1, registryv1.MappingState_MAPPING_STATE_PENDING_REVIEW),
		m("map_other", "conn_a", "render_preview", 1, active)); err != nil {
		t.Fatal(err)
	}
	if err := writeMappings(st, "conn_b", m("map_b1", "conn_b", "notes_search", 1, active), m("map_b1", "conn_b", "notes_search", 2, active)); err != nil {
		t.Fatal(err)
	}
}

func testCapabilityUpdateMovesMappings(t *testing.T, st registry.Store) {
	ctx := context.Background()
	createCapability(t, st, "notes_search")
	capMappings(t, st)
	before, _ := st.ListEvents(ctx, 0, 1000)
	var events []*registryv1.RegistryEvent
	err := st.UpdateCapability(ctx, "notes_search", func(u *registry.CapabilityUpdate) error {
		var loaded []string
		for _, m := range u.Mappings {
			loaded = append(loaded, fmt.Sprintf("%s@%d", m.GetId(), m.GetRevision()))
		}
		slices.Sort(loaded)
		if want := []string{"map_a1@1", "map_a2@1", "map_b1@2"}; !slices.Equal(loaded, want) {
			return fmt.Errorf("loaded mappings %v, want %v (every mapping of the capability, on every connection, at its current revision)", loaded, want)
		}
		if u.Current.GetRevision() != 1 {
			return fmt.Errorf("current revision %d, want 1", u.Current.GetRevision())
		}
		u.Write = capability("notes_search", 2)
		events = append(events, defEvent(registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_CAPABILITY_REVISED, "notes_search", "revision 2"))
		for _, m := range u.Mappings {
			if m.GetState() != registryv1.MappingState_MAPPING_STATE_ACTIVE {
				continue
			}
			m.State = registryv1.MappingState_MAPPING_STATE_REVIEW_REQUIRED
			m.StateReason = "capability notes_search revision 2"
			u.WriteMappings = append(u.WriteMappings, m)
			events = append(events, &registryv1.RegistryEvent{Type: registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_MAPPING_REVIEW_REQUIRED,
				ConnectionId: m.GetConnectionId(), MappingId: m.GetId(), Definition: "notes_search"})
		}
		u.Events = events
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, ev := range events {
		if ev.GetSequence() != int64(len(before)+i+1) {
			t.Errorf("event %d was given sequence %d, want %d", i, ev.GetSequence(), len(before)+i+1)
		}
	}
	for id, want := range map[string]registryv1.MappingState{
		"map_a1":    registryv1.MappingState_MAPPING_STATE_REVIEW_REQUIRED,
		"map_b1":    registryv1.MappingState_MAPPING_STATE_REVIEW_REQUIRED,
		"map_a2":    registryv1.MappingState_MAPPING_STATE_PENDING_REVIEW,
		"map_other": registryv1.MappingState_MAPPING_STATE_ACTIVE,
	} {
		m, err := st.GetMapping(ctx, id, 0)
		if err != nil || m.GetState() != want {
			t.Errorf("%s = %v, %v; want state %v", id, m.GetState(), err, want)
		}
	}
	// The state change replaced the current revision; history stays.
	if m, _ := st.GetMapping(ctx, "map_b1", 2); m.GetStateReason() != "capability notes_search revision 2" {
		t.Errorf("map_b1 revision 2 reason %q", m.GetStateReason())
	}
	if m, _ := st.GetMapping(ctx, "map_b1", 1); m.GetState() != registryv1.MappingState_MAPPING_STATE_ACTIVE {
		t.Errorf("map_b1 revision 1 changed to %v", m.GetState())
	}
	// The connection's own view agrees.
	err = st.UpdateConnection(ctx, "conn_b", func(u *registry.ConnectionUpdate) error {
		if got := u.Mapping("map_b1").GetState(); got != registryv1.MappingState_MAPPING_STATE_REVIEW_REQUIRED {
			return fmt.Errorf("conn_b sees map_b1 %v", got)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
	after, _ := st.ListEvents(ctx, 0, 1000)
	if len(after) != len(before)+3 {
		t.Errorf("%d events appended, want 3", len(after)-len(before))
	}
}

func testFailedCapabilityUpdate(t *testing.T, st registry.Store) {
	ctx := context.Background()
	createCapability(t, st, "notes_search")
	capMappings(t, st)
	before, _ := st.ListEvents(ctx, 0, 1000)
	sentinel := errors.New("refused by the server")
	review := func(u *registry.CapabilityUpdate) {
		u.Write = capability("notes_search", 2)
		for _, m := range u.Mappings {
			m.State = registryv1.MappingState_MAPPING_STATE_REVIEW_REQUIRED
			u.WriteMappings = append(u.WriteMappings, m)
		}
		u.Events = []*registryv1.RegistryEvent{defEvent(registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_CAPABILITY_REVISED, "notes_search", "should not exist")}
	}
	err := st.UpdateCapability(ctx, "notes_search", func(u *registry.CapabilityUpdate) error {
		review(u)
		return sentinel
	})
	if !errors.Is(err, sentinel) {
		t.Errorf("err = %v, want the update function's error", err)
	}
	// Writes the store must refuse after fn succeeded: a mapping of
	// another capability, a mapping revision that is not current, a new
	// mapping. Each leaves nothing behind.
	for name, bad := range map[string]*registryv1.Mapping{
		"another capability's mapping": {Id: "map_other", Revision: 1, ConnectionId: "conn_a", Capability: "render_preview"},
		"a past revision":              {Id: "map_b1", Revision: 1, ConnectionId: "conn_b", Capability: "notes_search"},
		"a new mapping":                {Id: "map_new", Revision: 1, ConnectionId: "conn_a", Capability: "notes_search"},
	} {
		err := st.UpdateCapability(ctx, "notes_search", func(u *registry.CapabilityUpdate) error {
			review(u)
			u.WriteMappings = append(u.WriteMappings, proto.CloneOf(bad))
			return nil
		})
		if err == nil {
			t.Errorf("%s written through a capability update", name)
		}
	}
	if c, _ := st.GetCapability(ctx, "notes_search", 0); c.GetRevision() != 1 {
		t.Errorf("failed updates left capability revision %d", c.GetRevision())
	}
	maps, _ := st.ListMappings(ctx)
	for _, m := range maps {
		if m.GetState() == registryv1.MappingState_MAPPING_STATE_REVIEW_REQUIRED || m.GetId() == "map_new" {
			t.Errorf("failed updates left mapping %s %v", m.GetId(), m.GetState())
		}
	}
	if after, _ := st.ListEvents(ctx, 0, 1000); len(after) != len(before) {
		t.Errorf("failed updates appended %d events", len(after)-len(before))
	}
}

func testCapabilityNoop(t *testing.T, st registry.Store) {
	ctx := context.Background()
	createCapability(t, st, "notes_search")
	before, _ := st.ListEvents(ctx, 0, 1000)
	calls := 0
	if err := st.UpdateCapability(ctx, "notes_search", func(*registry.CapabilityUpdate) error { calls++; return nil }); err != nil {
		t.Fatal(err)
	}
	if calls == 0 {
		t.Error("the update function was not called")
	}
	after, _ := st.ListEvents(ctx, 0, 1000)
	c, _ := st.GetCapability(ctx, "notes_search", 0)
	if len(after) != len(before) || !proto.Equal(c, capability("notes_search", 1)) {
		t.Errorf("an update writing nothing changed something: %d events, capability %v", len(after)-len(before), c)
	}
}

func testConnectionUpdateReadsCapability(t *testing.T, st registry.Store) {
	ctx := context.Background()
	create(t, st, "conn_a")
	createCapability(t, st, "notes_search")
	if err := writeCapability(st, "notes_search", capability("notes_search", 2)); err != nil {
		t.Fatal(err)
	}
	err := st.UpdateConnection(ctx, "conn_a", func(u *registry.ConnectionUpdate) error {
		c, err := u.Capability("notes_search")
		if err != nil || c.GetRevision() != 2 {
			return fmt.Errorf("capability in a connection update = %v, %v; want revision 2", c, err)
		}
		if _, err := u.Capability("absent_capability"); !errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("absent capability: err = %v, want ErrNotFound", err)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
}

// testConcurrentCapabilityRevisions runs 30 writers each appending the
// next revision of one capability; none may be lost or repeated.
func testConcurrentCapabilityRevisions(t *testing.T, st registry.Store) {
	ctx := context.Background()
	createCapability(t, st, "notes_search")
	const writers = 30
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for range writers {
		wg.Go(func() {
			errs <- st.UpdateCapability(ctx, "notes_search", func(u *registry.CapabilityUpdate) error {
				u.Write = capability("notes_search", u.Current.GetRevision()+1)
				u.Events = []*registryv1.RegistryEvent{defEvent(registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_CAPABILITY_REVISED, "notes_search", fmt.Sprintf("to %d", u.Write.GetRevision()))}
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
	if c, err := st.GetCapability(ctx, "notes_search", 0); err != nil || c.GetRevision() != writers+1 {
		t.Errorf("current revision = %d, %v; want %d", c.GetRevision(), err, writers+1)
	}
	for r := int64(1); r <= writers+1; r++ {
		if c, err := st.GetCapability(ctx, "notes_search", r); err != nil || c.GetRevision() != r {
			t.Errorf("revision %d = %v, %v", r, c, err)
		}
	}
	evs, _ := st.ListEvents(ctx, 0, 1000)
	for i, ev := range evs[1:] {
		if want := fmt.Sprintf("to %d", i+2); ev.GetDetail() != want {
			t.Errorf("event %d = %q, want %q (events in commit order)", i+1, ev.GetDetail(), want)
		}
	}
}

// testRevisionAndReviewRace races a capability revision (which sends the
// active mappings of the capability to review) against a review on the
// connection (which activates a mapping only if it was proposed against
// the current capability revision). Whatever the order, no mapping may end
// up active against a revision that is no longer current: that is the
// attack a reviewer racing a contract change would otherwise win.
func testRevisionAndReviewRace(t *testing.T, st registry.Store) {
	ctx := context.Background()
	create(t, st, "conn_a")
	createCapability(t, st, "notes_search")
	for i := range 15 {
		cur, err := st.GetCapability(ctx, "notes_search", 0)
		if err != nil {
			t.Fatal(err)
		}
		id := fmt.Sprintf("map_%02d", i)
		if err := writeMappings(st, "conn_a", &registryv1.Mapping{Id: id, Revision: 1, ConnectionId: "conn_a", Capability: "notes_search",
			CapabilityRevision: cur.GetRevision(), State: registryv1.MappingState_MAPPING_STATE_PENDING_REVIEW}); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make(chan error, 2)
		wg.Go(func() {
			errs <- st.UpdateCapability(ctx, "notes_search", func(u *registry.CapabilityUpdate) error {
				u.Write = capability("notes_search", u.Current.GetRevision()+1)
				for _, m := range u.Mappings {
					if m.GetState() == registryv1.MappingState_MAPPING_STATE_ACTIVE {
						m.State = registryv1.MappingState_MAPPING_STATE_REVIEW_REQUIRED
						u.WriteMappings = append(u.WriteMappings, m)
					}
				}
				return nil
			})
		})
		wg.Go(func() {
			errs <- st.UpdateConnection(ctx, "conn_a", func(u *registry.ConnectionUpdate) error {
				m := u.Mapping(id)
				c, err := u.Capability("notes_search")
				if err != nil {
					return err
				}
				if c.GetRevision() == m.GetCapabilityRevision() {
					m.State = registryv1.MappingState_MAPPING_STATE_ACTIVE
					u.WriteMappings = append(u.WriteMappings, m)
				}
				return nil
			})
		})
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		cur, _ = st.GetCapability(ctx, "notes_search", 0)
		maps, _ := st.ListMappings(ctx)
		for _, m := range maps {
			if m.GetState() == registryv1.MappingState_MAPPING_STATE_ACTIVE && m.GetCapabilityRevision() != cur.GetRevision() {
				t.Fatalf("round %d: mapping %s is active against capability revision %d while %d is current", i, m.GetId(), m.GetCapabilityRevision(), cur.GetRevision())
			}
		}
	}
}

func profile(name string, rev int64) *registryv1.TaskProfile {
	return &registryv1.TaskProfile{
		Name: name, Revision: rev, Purpose: name,
		Needs: []*registryv1.ProfileNeed{{Capability: "notes_search", When: registryv1.NeedCondition_NEED_CONDITION_ALWAYS}},
		State: registryv1.DefinitionState_DEFINITION_STATE_ACTIVE, Description: fmt.Sprintf("revision %d", rev),
	}
}

func testProfileRevisions(t *testing.T, st registry.Store) {
	ctx := context.Background()
	write := func(name string, p *registryv1.TaskProfile, ev ...*registryv1.RegistryEvent) error {
		return st.UpdateTaskProfile(ctx, name, func(u *registry.ProfileUpdate) error {
			u.Write, u.Events = p, ev
			return nil
		})
	}
	if _, err := st.GetTaskProfile(ctx, "review", 0); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("get missing: err = %v", err)
	}
	if err := write("review", profile("review", 1)); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("update missing: err = %v", err)
	}
	ev := defEvent(registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_PROFILE_REVISED, "review", "declared")
	if err := st.CreateTaskProfile(ctx, profile("review", 1), []*registryv1.RegistryEvent{ev}); err != nil {
		t.Fatal(err)
	}
	if ev.GetSequence() == 0 {
		t.Error("the create event was given no sequence")
	}
	if err := st.CreateTaskProfile(ctx, profile("review_long", 1), nil); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateTaskProfile(ctx, profile("review", 1), nil); !errors.Is(err, store.ErrExists) {
		t.Errorf("create twice: err = %v, want ErrExists", err)
	}
	if err := write("review", profile("review", 2), defEvent(registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_PROFILE_REVISED, "review", "revision 2")); err != nil {
		t.Fatal(err)
	}
	deprecated := profile("review", 2)
	deprecated.State = registryv1.DefinitionState_DEFINITION_STATE_DEPRECATED
	if err := write("review", deprecated); err != nil {
		t.Fatal(err)
	}
	before, _ := st.ListEvents(ctx, 0, 1000)
	for _, bad := range []*registryv1.TaskProfile{profile("review", 1), profile("review", 4), profile("review_long", 3)} {
		if err := write("review", bad, defEvent(registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_PROFILE_REVISED, "review", "should not exist")); err == nil {
			t.Errorf("write of %s revision %d accepted", bad.GetName(), bad.GetRevision())
		}
	}
	sentinel := errors.New("refused")
	if err := st.UpdateTaskProfile(ctx, "review", func(u *registry.ProfileUpdate) error {
		u.Write = profile("review", 3)
		return sentinel
	}); !errors.Is(err, sentinel) {
		t.Errorf("err = %v, want the update function's error", err)
	}
	if after, _ := st.ListEvents(ctx, 0, 1000); len(after) != len(before) {
		t.Errorf("refused writes appended %d events", len(after)-len(before))
	}
	if cur, err := st.GetTaskProfile(ctx, "review", 0); err != nil || !proto.Equal(cur, deprecated) {
		t.Errorf("current = %v, %v; want revision 2 deprecated", cur, err)
	}
	if old, err := st.GetTaskProfile(ctx, "review", 1); err != nil || !proto.Equal(old, profile("review", 1)) {
		t.Errorf("revision 1 = %v, %v", old, err)
	}
	all, err := st.ListTaskProfiles(ctx)
	if err != nil || len(all) != 2 {
		t.Errorf("list = %d, %v; want 2", len(all), err)
	}
}
