package registry_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// watchContext bounds a watch so that a missing event fails the test
// instead of hanging it; it is a guard, not a timing assertion.
func watchContext(t *testing.T) (context.Context, context.CancelFunc) {
	return context.WithTimeout(t.Context(), time.Minute)
}

func TestWatchEventsInOrderThenFollows(t *testing.T) {
	t.Parallel()
	r := start(t)
	conn, _, m := activeSetup(t, r.client)
	tool := searchTool(t)
	tool.Description = "changed"
	snap := record(t, r.client, conn, tool)

	want := []struct {
		typ     registryv1.RegistryEventType
		mapping string
	}{
		{registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_CONNECTION_CREATED, ""},
		{registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_SNAPSHOT_RECORDED, ""},
		{registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_MAPPING_PROPOSED, m.GetId()},
		{registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_MAPPING_ACTIVATED, m.GetId()},
		{registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_SNAPSHOT_RECORDED, ""},
		{registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_SURFACE_CHANGED, ""},
		{registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_MAPPING_REVIEW_REQUIRED, m.GetId()},
		{registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_CONNECTION_RETIRED, ""},
		{registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_MAPPING_RETIRED, m.GetId()},
	}

	ctx, cancel := watchContext(t)
	defer cancel()
	stream, err := r.client.WatchEvents(ctx, &registryv1.WatchEventsRequest{AfterSequence: r.base})
	if err != nil {
		t.Fatal(err)
	}
	recv := func(i int) *registryv1.RegistryEvent {
		t.Helper()
		ev, err := stream.Recv()
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if ev.GetSequence() != r.base+int64(i+1) || ev.GetType() != want[i].typ || ev.GetConnectionId() != conn.GetId() ||
			ev.GetMappingId() != want[i].mapping || ev.GetTime() == nil {
			t.Errorf("event %d = %v, want sequence %d type %v", i, ev, r.base+int64(i+1), want[i].typ)
		}
		return ev
	}
	for i := range 7 {
		ev := recv(i)
		if i >= 5 && ev.GetSnapshotId() != snap.GetId() {
			t.Errorf("event %d (%v) names snapshot %q, want %q", i, ev.GetType(), ev.GetSnapshotId(), snap.GetId())
		}
	}
	// The stream follows changes made after it caught up.
	if _, err := r.client.RetireConnection(t.Context(), &registryv1.RetireConnectionRequest{Id: conn.GetId()}); err != nil {
		t.Fatal(err)
	}
	recv(7)
	recv(8)
	cancel()
	if _, err := stream.Recv(); err == nil {
		t.Error("stream still open after cancel")
	}

	// after_sequence skips what the watcher already has.
	ctx2, cancel2 := watchContext(t)
	defer cancel2()
	stream, err = r.client.WatchEvents(ctx2, &registryv1.WatchEventsRequest{AfterSequence: r.base + 7})
	if err != nil {
		t.Fatal(err)
	}
	recv(7)
}

func TestStateSurvivesReopen(t *testing.T) {
	t.Parallel()
	first := start(t)
	conn, snap, m := activeSetup(t, first.client)
	revs, err := first.client.ListConfigRevisions(t.Context(), &registryv1.ListConfigRevisionsRequest{ConnectionId: conn.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	first.stop()

	second := startAt(t, first.path)
	ctx := t.Context()
	if got, err := second.client.GetConnection(ctx, &registryv1.GetConnectionRequest{Id: conn.GetId()}); err != nil || !proto.Equal(got, conn) {
		t.Errorf("connection after reopen = %v, %v; want %v", got, err, conn)
	}
	if got, err := second.client.GetSnapshot(ctx, &registryv1.GetSnapshotRequest{Id: snap.GetId()}); err != nil || !proto.Equal(got, snap) {
		t.Errorf("snapshot after reopen = %v, %v", got, err)
	}
	if got, err := second.client.ListConfigRevisions(ctx, &registryv1.ListConfigRevisionsRequest{ConnectionId: conn.GetId()}); err != nil || !proto.Equal(got, revs) {
		t.Errorf("config revisions after reopen = %v, %v", got, err)
	}
	got, err := second.client.ResolveMapping(ctx, &registryv1.ResolveMappingRequest{Capability: "retrieve_authorized_source"})
	if err != nil || !proto.Equal(got, m) {
		t.Errorf("ResolveMapping after reopen = %v, %v; want %v", got, err, m)
	}
	// The CAS and the event sequence continue where they were.
	_, err = second.client.UpdateConnection(ctx, &registryv1.UpdateConnectionRequest{Id: conn.GetId(), ExpectedConfigRevision: 2, DisplayName: "x"})
	wantErr(t, err, codes.Aborted, "CONFIG_REVISION_CONFLICT")
	if _, err := second.client.RetireConnection(ctx, &registryv1.RetireConnectionRequest{Id: conn.GetId()}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := watchContext(t)
	defer cancel()
	// Reopening declared no default again: the sequence continues from
	// the connection's four events.
	stream, err := second.client.WatchEvents(wctx, &registryv1.WatchEventsRequest{AfterSequence: first.base + 4})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := stream.Recv()
	if err != nil || ev.GetSequence() != first.base+5 || ev.GetType() != registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_CONNECTION_RETIRED {
		t.Errorf("first event after reopen = %v, %v; want sequence %d CONNECTION_RETIRED", ev, err, first.base+5)
	}
}
