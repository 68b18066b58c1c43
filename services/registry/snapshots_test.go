package registry_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/v0m3/v0m3/internal/digest"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

func TestRecordSnapshotComputesDigests(t *testing.T) {
	t.Parallel()
	r := start(t)
	conn := createHTTP(t, r.client)

	tampered := searchTool(t)
	tampered.InputSchemaDigest = "sha256:0000"
	tampered.DescriptionDigest = "sha256:1111"
	tampered.OutputSchemaDigest = "sha256:2222"
	tampered.Annotations = mustStruct(t, map[string]any{"readOnlyHint": true})
	other := &registryv1.ToolIdentity{Name: "fetch", Description: "Fetch a note.", InputSchema: mustStruct(t, map[string]any{"type": "object"})}
	snap, err := r.client.RecordSnapshot(t.Context(), &registryv1.RecordSnapshotRequest{Snapshot: &registryv1.DiscoverySnapshot{
		Id:             "snap_chosen_by_client",
		Digest:         "sha256:client",
		ConnectionId:   conn.GetId(),
		ConfigRevision: 1,
		ServerInfo:     &registryv1.ServerInfo{Name: "V0M3 Sources", Version: "1.0.0"},
		Tools:          []*registryv1.ToolIdentity{tampered, other},
		Resources: []*registryv1.ResourceIdentity{
			{Uri: "notes://b", Description: "B", DescriptionDigest: "sha256:bad"},
			{Uri: "notes://a", Description: "A", MimeType: "text/markdown"},
		},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(snap.GetId(), "snap_") || snap.GetId() == "snap_chosen_by_client" {
		t.Errorf("snapshot id %q was not assigned by the registry", snap.GetId())
	}
	if !strings.HasPrefix(snap.GetDigest(), "sha256:") || snap.GetDigest() == "sha256:client" {
		t.Errorf("snapshot digest %q was not computed", snap.GetDigest())
	}
	if snap.GetRetrieveTime() == nil {
		t.Error("retrieve_time not set")
	}
	var names []string
	for _, tool := range snap.GetTools() {
		names = append(names, tool.GetName())
	}
	if !slices.Equal(names, []string{"fetch", "search"}) {
		t.Errorf("tools = %v, want sorted by name", names)
	}
	if u := []string{snap.GetResources()[0].GetUri(), snap.GetResources()[1].GetUri()}; !slices.Equal(u, []string{"notes://a", "notes://b"}) {
		t.Errorf("resources = %v, want sorted by URI", u)
	}

	search := snap.GetTools()[1]
	wantInput, _ := digest.Struct(searchSchema(t))
	wantAnn, _ := digest.Struct(tampered.GetAnnotations())
	checks := []struct{ field, got, want string }{
		{"input_schema_digest", search.GetInputSchemaDigest(), wantInput},
		{"output_schema_digest", search.GetOutputSchemaDigest(), ""},
		{"annotations_digest", search.GetAnnotationsDigest(), wantAnn},
		{"description_digest", search.GetDescriptionDigest(), digest.String(tampered.GetDescription())},
		{"resource description_digest", snap.GetResources()[1].GetDescriptionDigest(), digest.String("B")},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q", c.field, c.got, c.want)
		}
	}

	got, err := r.client.GetSnapshot(t.Context(), &registryv1.GetSnapshotRequest{Id: snap.GetId()})
	if err != nil || !proto.Equal(got, snap) {
		t.Errorf("GetSnapshot = %v, %v", got, err)
	}
	c, err := r.client.GetConnection(t.Context(), &registryv1.GetConnectionRequest{Id: conn.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	if c.GetLatestSnapshotId() != snap.GetId() || c.GetObservedServer().GetName() != "V0M3 Sources" {
		t.Errorf("connection after snapshot = %v", c)
	}
}

func TestSnapshotDigestIgnoresKeyOrderAndTime(t *testing.T) {
	t.Parallel()
	r := start(t)
	conn := createHTTP(t, r.client)
	a := searchTool(t)
	// The same schema spelled with its keys in another order.
	b := searchTool(t)
	b.InputSchema = mustStruct(t, map[string]any{
		"required":   []any{"query"},
		"properties": map[string]any{"source_id": map[string]any{"type": "string"}, "query": map[string]any{"type": "string"}},
		"type":       "object",
	})
	snaps := make([]*registryv1.DiscoverySnapshot, 0, 2)
	for i, tool := range []*registryv1.ToolIdentity{a, b} {
		s, err := r.client.RecordSnapshot(t.Context(), &registryv1.RecordSnapshotRequest{Snapshot: &registryv1.DiscoverySnapshot{
			ConnectionId: conn.GetId(), ConfigRevision: 1, Tools: []*registryv1.ToolIdentity{tool},
			RetrieveTime: timestamppb.New(time.Date(2025, 1, 1+i, 0, 0, 0, 0, time.UTC)),
		}})
		if err != nil {
			t.Fatal(err)
		}
		snaps = append(snaps, s)
	}
	if snaps[0].GetTools()[0].GetInputSchemaDigest() != snaps[1].GetTools()[0].GetInputSchemaDigest() {
		t.Error("reordered schema keys changed the input schema digest")
	}
	if snaps[0].GetDigest() != snaps[1].GetDigest() {
		t.Error("same identities at another retrieval time changed the snapshot digest")
	}
	list, err := r.client.ListSnapshots(t.Context(), &registryv1.ListSnapshotsRequest{ConnectionId: conn.GetId()})
	if err != nil || len(list.GetSnapshots()) != 2 || list.GetSnapshots()[0].GetId() != snaps[0].GetId() {
		t.Errorf("ListSnapshots = %v, %v; want oldest first", list, err)
	}
}

func TestRecordSnapshotRejects(t *testing.T) {
	t.Parallel()
	r := start(t)
	conn := createHTTP(t, r.client)
	if _, err := r.client.UpdateConnection(t.Context(), &registryv1.UpdateConnectionRequest{
		Id: conn.GetId(), ExpectedConfigRevision: 1, Transport: conn.GetTransport(), CredentialVersion: "2"}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		snap   *registryv1.DiscoverySnapshot
		code   codes.Code
		reason string
	}{
		{"missing", nil, codes.InvalidArgument, "FIELD_REQUIRED"},
		{"stale config revision", &registryv1.DiscoverySnapshot{ConnectionId: conn.GetId(), ConfigRevision: 1}, codes.FailedPrecondition, "CONFIG_REVISION_STALE"},
		{"unknown connection", &registryv1.DiscoverySnapshot{ConnectionId: "conn_missing", ConfigRevision: 1}, codes.NotFound, "CONNECTION_UNKNOWN"},
		{"duplicate tool", &registryv1.DiscoverySnapshot{ConnectionId: conn.GetId(), ConfigRevision: 2,
			Tools: []*registryv1.ToolIdentity{{Name: "search"}, {Name: "search"}}}, codes.InvalidArgument, "INVALID_SNAPSHOT"},
		{"no config revision", &registryv1.DiscoverySnapshot{ConnectionId: conn.GetId()}, codes.InvalidArgument, "INVALID_SNAPSHOT"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := r.client.RecordSnapshot(t.Context(), &registryv1.RecordSnapshotRequest{Snapshot: tt.snap})
			wantErr(t, err, tt.code, tt.reason)
		})
	}
}

func TestDiffSnapshots(t *testing.T) {
	t.Parallel()
	r := start(t)
	conn := createHTTP(t, r.client)
	tool := func(name, desc string) *registryv1.ToolIdentity {
		return &registryv1.ToolIdentity{Name: name, Description: desc, InputSchema: searchSchema(t)}
	}
	base := record(t, r.client, conn, tool("alpha", "a"), tool("bravo", "b"), tool("charlie", "c"), tool("delta", "d"))

	bravo := tool("bravo", "b")
	bravo.InputSchema = structuredSearchSchema(t)
	charlie := tool("charlie", "c, now with private notes")
	delta := tool("delta", "d")
	delta.OutputSchema = mustStruct(t, map[string]any{"type": "object"})
	delta.Annotations = mustStruct(t, map[string]any{"readOnlyHint": true})
	target, err := r.client.RecordSnapshot(t.Context(), &registryv1.RecordSnapshotRequest{Snapshot: &registryv1.DiscoverySnapshot{
		ConnectionId: conn.GetId(), ConfigRevision: 1,
		ServerInfo:      &registryv1.ServerInfo{Name: "V0M3 Sources", Version: "1.1.0"},
		ProtocolVersion: "2025-06-18",
		Tools:           []*registryv1.ToolIdentity{bravo, charlie, delta, tool("echo", "e")},
	}})
	if err != nil {
		t.Fatal(err)
	}
	diff, err := r.client.DiffSnapshots(t.Context(), &registryv1.DiffSnapshotsRequest{BaseSnapshotId: base.GetId(), TargetSnapshotId: target.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	want := []*registryv1.ItemChange{
		{Name: "alpha", Kind: registryv1.ChangeKind_CHANGE_KIND_REMOVED},
		{Name: "bravo", Kind: registryv1.ChangeKind_CHANGE_KIND_CHANGED, ChangedDigests: []string{"input_schema_digest"}},
		{Name: "charlie", Kind: registryv1.ChangeKind_CHANGE_KIND_CHANGED, ChangedDigests: []string{"description_digest"}},
		{Name: "delta", Kind: registryv1.ChangeKind_CHANGE_KIND_CHANGED, ChangedDigests: []string{"output_schema_digest", "annotations_digest"}},
		{Name: "echo", Kind: registryv1.ChangeKind_CHANGE_KIND_ADDED},
	}
	if len(diff.GetTools()) != len(want) {
		t.Fatalf("tool changes = %v, want %v", diff.GetTools(), want)
	}
	for i := range want {
		if !proto.Equal(diff.GetTools()[i], want[i]) {
			t.Errorf("tool change %d = %v, want %v", i, diff.GetTools()[i], want[i])
		}
	}
	if !diff.GetServerChanged() {
		t.Error("server_changed = false after a version change")
	}

	same, err := r.client.DiffSnapshots(t.Context(), &registryv1.DiffSnapshotsRequest{BaseSnapshotId: target.GetId(), TargetSnapshotId: target.GetId()})
	if err != nil || len(same.GetTools()) != 0 || same.GetServerChanged() {
		t.Errorf("diff of a snapshot with itself = %v, %v", same, err)
	}
	_, err = r.client.DiffSnapshots(t.Context(), &registryv1.DiffSnapshotsRequest{BaseSnapshotId: "snap_missing", TargetSnapshotId: target.GetId()})
	wantErr(t, err, codes.NotFound, "SNAPSHOT_UNKNOWN")
}

func TestDiffSnapshotsResources(t *testing.T) {
	t.Parallel()
	r := start(t)
	conn := createHTTP(t, r.client)
	rec := func(res ...*registryv1.ResourceIdentity) *registryv1.DiscoverySnapshot {
		s, err := r.client.RecordSnapshot(t.Context(), &registryv1.RecordSnapshotRequest{Snapshot: &registryv1.DiscoverySnapshot{
			ConnectionId: conn.GetId(), ConfigRevision: 1, Resources: res}})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	base := rec(&registryv1.ResourceIdentity{Uri: "notes://1", MimeType: "text/plain"}, &registryv1.ResourceIdentity{Uri: "notes://2", Description: "two"})
	target := rec(&registryv1.ResourceIdentity{Uri: "notes://1", MimeType: "text/html"}, &registryv1.ResourceIdentity{Uri: "notes://3"})
	diff, err := r.client.DiffSnapshots(t.Context(), &registryv1.DiffSnapshotsRequest{BaseSnapshotId: base.GetId(), TargetSnapshotId: target.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	want := []*registryv1.ItemChange{
		{Name: "notes://1", Kind: registryv1.ChangeKind_CHANGE_KIND_CHANGED, ChangedDigests: []string{"mime_type"}},
		{Name: "notes://2", Kind: registryv1.ChangeKind_CHANGE_KIND_REMOVED},
		{Name: "notes://3", Kind: registryv1.ChangeKind_CHANGE_KIND_ADDED},
	}
	if len(diff.GetResources()) != len(want) {
		t.Fatalf("resource changes = %v, want %v", diff.GetResources(), want)
	}
	for i := range want {
		if !proto.Equal(diff.GetResources()[i], want[i]) {
			t.Errorf("resource change %d = %v, want %v", i, diff.GetResources()[i], want[i])
		}
	}
}
