package registry_test

import (
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/apierror"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// readTool is a file-reading tool like server-filesystem's read_text_file:
// a path in, the content out, with an output schema.
func readTool(t *testing.T) *registryv1.ToolIdentity {
	return &registryv1.ToolIdentity{
		Name:        "read_text_file",
		Description: "Read a file.",
		InputSchema: mustStruct(t, map[string]any{
			"type":       "object",
			"properties": map[string]any{"path": map[string]any{"type": "string"}, "head": map[string]any{"type": "number"}},
			"required":   []any{"path"},
		}),
		OutputSchema: mustStruct(t, map[string]any{
			"$schema": "http://json-schema.org/draft-07/schema#",
			"type":    "object",
			"properties": map[string]any{
				"content": map[string]any{"type": "string"},
				"source":  map[string]any{"$ref": "#/$defs/source"},
				"size":    map[string]any{"type": "integer"},
			},
			"$defs": map[string]any{"source": map[string]any{"type": "object", "properties": map[string]any{"uri": map[string]any{"type": "string"}}}},
		}),
	}
}

func readProposal(snap *registryv1.DiscoverySnapshot, p *registryv1.Provenance) *registryv1.ProposeMappingRequest {
	return &registryv1.ProposeMappingRequest{
		Capability:   "retrieve_authorized_source",
		ConnectionId: snap.GetConnectionId(),
		SnapshotId:   snap.GetId(),
		Target:       &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: "read_text_file"},
		ArgumentMap:  []*registryv1.ArgumentBinding{{RemoteField: "path", ProductField: "source", FromHandle: true}},
		Limits:       &registryv1.Limits{MaxResponseBytes: 65536, MaxItems: 4, AllowedMediaTypes: []string{"text/plain"}, DropDisallowedItems: true},
		Provenance:   p,
	}
}

// TestProposeMappingProvenance: a mapping says how its tool's results are
// attributed, and records the output schema they are validated against.
func TestProposeMappingProvenance(t *testing.T) {
	t.Parallel()
	r := start(t)
	conn := createHTTP(t, r.client)
	tool := readTool(t)
	snap := record(t, r.client, conn, tool, searchTool(t))
	handle := func(field string) *registryv1.Provenance {
		return &registryv1.Provenance{Mode: registryv1.ProvenanceMode_PROVENANCE_MODE_HANDLE_TARGET, HandleField: field}
	}
	structured := func(ptr string) *registryv1.Provenance {
		return &registryv1.Provenance{Mode: registryv1.ProvenanceMode_PROVENANCE_MODE_STRUCTURED_URI, UriPointer: ptr}
	}
	// Not parallel: the refusals below count the mappings this leaves.
	t.Run("accepted", func(t *testing.T) {
		for _, p := range []*registryv1.Provenance{nil, {Mode: registryv1.ProvenanceMode_PROVENANCE_MODE_CONTENT_URI}, handle("source"), structured("/source/uri")} {
			m := propose(t, r.client, readProposal(snap, p))
			if !proto.Equal(m.GetProvenance(), p) || !m.GetLimits().GetDropDisallowedItems() {
				t.Errorf("provenance %v: mapping records %v, limits %v", p, m.GetProvenance(), m.GetLimits())
			}
			// The reviewed output schema travels with the mapping.
			if !proto.Equal(m.GetOutputSchema(), snap.GetTools()[0].GetOutputSchema()) || m.GetOutputSchemaDigest() != snap.GetTools()[0].GetOutputSchemaDigest() || m.GetOutputSchemaDigest() == "" {
				t.Errorf("output schema %v digest %q, snapshot's %q", m.GetOutputSchema(), m.GetOutputSchemaDigest(), snap.GetTools()[0].GetOutputSchemaDigest())
			}
		}
		// A tool without an output schema leaves it empty, and a structured
		// URI pointer cannot be checked against one (only its syntax).
		req := proposal(snap)
		req.Provenance = structured("/uri")
		if m := propose(t, r.client, req); m.GetOutputSchema() != nil || m.GetOutputSchemaDigest() != "" {
			t.Errorf("mapping of a tool without an output schema: %v %q", m.GetOutputSchema(), m.GetOutputSchemaDigest())
		}
	})

	resourceConn := createHTTP(t, r.client)
	resourceSnap, err := r.client.RecordSnapshot(t.Context(), &registryv1.RecordSnapshotRequest{Snapshot: &registryv1.DiscoverySnapshot{
		ConnectionId: resourceConn.GetId(), ConfigRevision: 1, ServerInfo: &registryv1.ServerInfo{Name: "s"}, ProtocolVersion: "2025-06-18",
		Resources: []*registryv1.ResourceIdentity{{Uri: "note://a", Name: "a"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	badSchema := readTool(t)
	badSchema.Name = "read_remote_schema"
	badSchema.OutputSchema = mustStruct(t, map[string]any{"type": "object", "properties": map[string]any{"x": map[string]any{"$ref": "https://example.com/x.json"}}})
	badSnap := record(t, r.client, createHTTP(t, r.client), badSchema)

	stored, err := r.client.ListMappings(t.Context(), &registryv1.ListMappingsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name  string
		req   func() *registryv1.ProposeMappingRequest
		field string
	}{
		{"content URI with a handle field", func() *registryv1.ProposeMappingRequest {
			return readProposal(snap, &registryv1.Provenance{Mode: registryv1.ProvenanceMode_PROVENANCE_MODE_CONTENT_URI, HandleField: "source"})
		}, "provenance"},
		{"handle target without a field", func() *registryv1.ProposeMappingRequest { return readProposal(snap, handle("")) }, "provenance.handle_field"},
		{"handle target on a value field", func() *registryv1.ProposeMappingRequest { return readProposal(snap, handle("query")) }, "provenance.handle_field"},
		{"handle target on an unknown field", func() *registryv1.ProposeMappingRequest { return readProposal(snap, handle("file")) }, "provenance.handle_field"},
		{"handle target the call is not about", func() *registryv1.ProposeMappingRequest {
			req := readProposal(snap, handle("source"))
			req.ArgumentMap = nil
			req.Defaults = mustStruct(t, map[string]any{"path": "/etc/motd"})
			return req
		}, "provenance.handle_field"},
		{"handle target with a pointer", func() *registryv1.ProposeMappingRequest {
			p := handle("source")
			p.UriPointer = "/uri"
			return readProposal(snap, p)
		}, "provenance.uri_pointer"},
		{"structured URI without a pointer", func() *registryv1.ProposeMappingRequest { return readProposal(snap, structured("")) }, "provenance.uri_pointer"},
		{"structured URI with a bad pointer", func() *registryv1.ProposeMappingRequest { return readProposal(snap, structured("source/uri")) }, "provenance.uri_pointer"},
		{"structured URI with a bad escape", func() *registryv1.ProposeMappingRequest { return readProposal(snap, structured("/source~2uri")) }, "provenance.uri_pointer"},
		{"structured URI outside the output schema", func() *registryv1.ProposeMappingRequest { return readProposal(snap, structured("/origin")) }, "provenance.uri_pointer"},
		{"structured URI at a number", func() *registryv1.ProposeMappingRequest { return readProposal(snap, structured("/size")) }, "provenance.uri_pointer"},
		{"structured URI with a handle field", func() *registryv1.ProposeMappingRequest {
			p := structured("/content")
			p.HandleField = "source"
			return readProposal(snap, p)
		}, "provenance.handle_field"},
		{"unknown mode", func() *registryv1.ProposeMappingRequest {
			return readProposal(snap, &registryv1.Provenance{Mode: registryv1.ProvenanceMode(42)})
		}, "provenance.mode"},
		{"a resource read", func() *registryv1.ProposeMappingRequest {
			return &registryv1.ProposeMappingRequest{
				Capability: "retrieve_authorized_source", ConnectionId: resourceConn.GetId(), SnapshotId: resourceSnap.GetId(),
				Target: &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_RESOURCE, Name: "note://a"},
				Limits: &registryv1.Limits{MaxResponseBytes: 1024, MaxItems: 1}, Provenance: handle("source"),
			}
		}, "provenance.mode"},
		{"a capability whose results are receipts", func() *registryv1.ProposeMappingRequest {
			req := readProposal(snap, structured("/content"))
			req.Capability = "deliver_approved_artifact"
			req.ArgumentMap = []*registryv1.ArgumentBinding{{RemoteField: "path", ProductField: "artifact", FromHandle: true}}
			return req
		}, "provenance.mode"},
		{"an output schema no result can be validated with", func() *registryv1.ProposeMappingRequest {
			req := readProposal(badSnap, nil)
			req.Target.Name = badSchema.GetName()
			return req
		}, "target.name"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := r.client.ProposeMapping(t.Context(), tt.req())
			wantErr(t, err, codes.InvalidArgument, "INVALID_MAPPING")
			if !slices.Contains(apierror.Fields(err), tt.field) {
				t.Errorf("violations = %v, want %s", apierror.Fields(err), tt.field)
			}
			// A refused proposal stores nothing.
			after, err := r.client.ListMappings(t.Context(), &registryv1.ListMappingsRequest{})
			if err != nil || len(after.GetMappings()) != len(stored.GetMappings()) {
				t.Errorf("%d mappings after a refused proposal, %d before (%v)", len(after.GetMappings()), len(stored.GetMappings()), err)
			}
		})
	}
}

// TestOutputSchemaDriftAfterProvenance: a mapping reviewed with a structured
// URI pointer goes to review when the tool's output schema changes.
func TestOutputSchemaDriftAfterProvenance(t *testing.T) {
	t.Parallel()
	r := start(t)
	conn := createHTTP(t, r.client)
	snap := record(t, r.client, conn, readTool(t))
	m := approve(t, r.client, propose(t, r.client, readProposal(snap,
		&registryv1.Provenance{Mode: registryv1.ProvenanceMode_PROVENANCE_MODE_STRUCTURED_URI, UriPointer: "/source/uri"})))
	changed := readTool(t)
	changed.OutputSchema = mustStruct(t, map[string]any{"type": "object", "properties": map[string]any{"content": map[string]any{"type": "string"}}})
	next := record(t, r.client, conn, changed)
	got, err := r.client.GetMapping(t.Context(), &registryv1.GetMappingRequest{Id: m.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	if got.GetState() != registryv1.MappingState_MAPPING_STATE_REVIEW_REQUIRED {
		t.Fatalf("mapping after the output schema changed: %v (%s)", got.GetState(), got.GetStateReason())
	}
	// The pointer no longer resolves in the new schema: a new revision
	// against the new snapshot is refused until it is fixed.
	req := readProposal(next, got.GetProvenance())
	req.MappingId = m.GetId()
	_, err = r.client.ProposeMapping(t.Context(), req)
	wantErr(t, err, codes.InvalidArgument, "INVALID_MAPPING")
	req.Provenance = &registryv1.Provenance{Mode: registryv1.ProvenanceMode_PROVENANCE_MODE_HANDLE_TARGET, HandleField: "source"}
	if m2 := propose(t, r.client, req); m2.GetRevision() != 2 || m2.GetOutputSchemaDigest() != next.GetTools()[0].GetOutputSchemaDigest() {
		t.Errorf("revision 2 = %v", m2)
	}
}
