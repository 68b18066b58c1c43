package registry_test

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/identity/identitytest"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/registry"
)

func TestCapabilities(t *testing.T) {
	t.Parallel()
	r := start(t)
	list, err := r.client.ListCapabilities(t.Context(), &registryv1.ListCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		effect  registryv1.EffectClass
		retry   registryv1.RetryRule
		handles []string
		fields  []string
	}{
		"deliver_approved_artifact":  {registryv1.EffectClass_EFFECT_CLASS_EXTERNAL_EFFECT, registryv1.RetryRule_RETRY_RULE_NEVER_BLIND, []string{"artifact", "destination"}, []string{"artifact", "destination"}},
		"render_preview":             {registryv1.EffectClass_EFFECT_CLASS_LOCAL_TRANSFORMATION, registryv1.RetryRule_RETRY_RULE_CHECK_RECEIPT, nil, []string{"document_revision", "profile"}},
		"retrieve_authorized_source": {registryv1.EffectClass_EFFECT_CLASS_RETRIEVAL, registryv1.RetryRule_RETRY_RULE_RETRY, []string{"source"}, []string{"query", "source"}},
		"validate_external_link":     {registryv1.EffectClass_EFFECT_CLASS_RETRIEVAL, registryv1.RetryRule_RETRY_RULE_RETRY, []string{"link"}, []string{"link"}},
	}
	var names []string
	for _, c := range list.GetCapabilities() {
		names = append(names, c.GetName())
		w, ok := want[c.GetName()]
		if !ok {
			t.Errorf("unexpected capability %s", c.GetName())
			continue
		}
		schema := c.GetInputSchema().AsMap()
		var fields []string
		for k := range schema["properties"].(map[string]any) {
			fields = append(fields, k)
		}
		slices.Sort(fields)
		if c.GetRevision() != 1 || c.GetEffectClass() != w.effect || c.GetRetryRule() != w.retry ||
			!slices.Equal(registry.HandleFieldNames(c), w.handles) || !slices.Equal(fields, w.fields) ||
			schema["additionalProperties"] != false || c.GetDescription() == "" || c.GetRecoveryLimits() == "" {
			t.Errorf("capability %s = %v", c.GetName(), c)
		}
	}
	if !slices.IsSorted(names) || len(names) != 4 {
		t.Errorf("capabilities = %v, want the four built-ins sorted by name", names)
	}
	defaults, err := registry.DefaultCapabilities()
	if err != nil || len(defaults) != 4 {
		t.Errorf("registry.DefaultCapabilities() = %d, %v; want the four defaults", len(defaults), err)
	}
	_, err = r.client.GetCapability(t.Context(), &registryv1.GetCapabilityRequest{Name: "send_email"})
	wantErr(t, err, codes.NotFound, "CAPABILITY_UNKNOWN")
}

func TestProposeMapping(t *testing.T) {
	t.Parallel()
	r := start(t)
	conn := createHTTP(t, r.client)
	snap := record(t, r.client, conn, searchTool(t))
	m := propose(t, r.client, proposal(snap))
	if !strings.HasPrefix(m.GetId(), "map_") || m.GetRevision() != 1 ||
		m.GetState() != registryv1.MappingState_MAPPING_STATE_PENDING_REVIEW ||
		m.GetInputSchemaDigest() != snap.GetTools()[0].GetInputSchemaDigest() ||
		m.GetDescriptionDigest() != snap.GetTools()[0].GetDescriptionDigest() ||
		m.GetRemoteDescription() != searchTool(t).GetDescription() ||
		m.GetConfigRevision() != 1 || m.GetCapabilityRevision() != 1 {
		t.Errorf("proposed mapping = %v", m)
	}
	// A proposal serves nothing.
	_, err := r.client.ResolveMapping(t.Context(), &registryv1.ResolveMappingRequest{Capability: m.GetCapability(), MappingId: m.GetId()})
	wantErr(t, err, codes.FailedPrecondition, "MAPPING_PENDING_REVIEW")
	_, err = r.client.ResolveMapping(t.Context(), &registryv1.ResolveMappingRequest{Capability: m.GetCapability()})
	wantErr(t, err, codes.FailedPrecondition, "MAPPING_NOT_ACTIVE")

	active := approve(t, r.client, m)
	if active.GetState() != registryv1.MappingState_MAPPING_STATE_ACTIVE || active.GetReviewedBy() != "reviewer" || active.GetReviewTime() == nil {
		t.Errorf("approved mapping = %v", active)
	}
	got, err := r.client.ResolveMapping(t.Context(), &registryv1.ResolveMappingRequest{Capability: m.GetCapability()})
	if err != nil || got.GetId() != m.GetId() {
		t.Errorf("ResolveMapping = %v, %v", got, err)
	}
	_, err = r.client.ReviewMapping(identitytest.As(t.Context(), "again", "reviewers"), &registryv1.ReviewMappingRequest{MappingId: m.GetId(), Revision: 1, Approve: true})
	wantErr(t, err, codes.FailedPrecondition, "MAPPING_NOT_PENDING_REVIEW")
}

func TestProposeMappingRejects(t *testing.T) {
	t.Parallel()
	r := start(t)
	conn := createHTTP(t, r.client)
	old := record(t, r.client, conn, searchTool(t))
	other := createHTTP(t, r.client)
	otherSnap := record(t, r.client, other, searchTool(t))
	// Rotate the credential of a second connection so its snapshot is stale.
	staleConn := createHTTP(t, r.client)
	staleSnap := record(t, r.client, staleConn, searchTool(t))
	if _, err := r.client.UpdateConnection(t.Context(), &registryv1.UpdateConnectionRequest{Id: staleConn.GetId(), ExpectedConfigRevision: 1,
		Transport: staleConn.GetTransport(), CredentialRef: staleConn.GetCredentialRef(), CredentialVersion: "2"}); err != nil {
		t.Fatal(err)
	}
	// A server whose search tool runs only as an MCP task, beside a
	// status tool that does too.
	taskConn := createHTTP(t, r.client)
	taskSearch, taskStatus := searchTool(t), searchTool(t)
	taskSearch.Execution = mustStruct(t, map[string]any{"taskSupport": "required"})
	taskStatus.Name, taskStatus.Execution = "status", mustStruct(t, map[string]any{"taskSupport": "required"})
	taskSnap := record(t, r.client, taskConn, taskSearch, taskStatus)

	tests := []struct {
		name   string
		edit   func(*registryv1.ProposeMappingRequest)
		code   codes.Code
		reason string
		field  string
	}{
		{"unknown remote field", func(p *registryv1.ProposeMappingRequest) {
			p.ArgumentMap[0].RemoteField = "q"
		}, codes.InvalidArgument, "INVALID_MAPPING", "argument_map[0].remote_field"},
		{"unknown product field", func(p *registryv1.ProposeMappingRequest) {
			p.ArgumentMap[0].ProductField = "filters"
		}, codes.InvalidArgument, "INVALID_MAPPING", "argument_map[0].product_field"},
		{"from_handle on a value field", func(p *registryv1.ProposeMappingRequest) {
			p.ArgumentMap[0].FromHandle = true
		}, codes.InvalidArgument, "INVALID_MAPPING", "argument_map[0].from_handle"},
		{"handle passed as a value", func(p *registryv1.ProposeMappingRequest) {
			p.ArgumentMap[1].FromHandle = false
		}, codes.InvalidArgument, "INVALID_MAPPING", "argument_map[1].from_handle"},
		{"required remote field unmapped", func(p *registryv1.ProposeMappingRequest) {
			p.ArgumentMap = p.ArgumentMap[1:]
		}, codes.InvalidArgument, "INVALID_MAPPING", "argument_map"},
		{"default for unknown remote field", func(p *registryv1.ProposeMappingRequest) {
			p.Defaults = mustStruct(t, map[string]any{"include_private": true})
		}, codes.InvalidArgument, "INVALID_MAPPING", "defaults.include_private"},
		{"no limits", func(p *registryv1.ProposeMappingRequest) {
			p.Limits = nil
		}, codes.InvalidArgument, "INVALID_MAPPING", "limits"},
		{"zero max items", func(p *registryv1.ProposeMappingRequest) {
			p.Limits.MaxItems = 0
		}, codes.InvalidArgument, "INVALID_MAPPING", "limits.max_items"},
		{"unknown elicitation policy", func(p *registryv1.ProposeMappingRequest) {
			p.Limits.Elicitation = registryv1.ElicitationPolicy(99)
		}, codes.InvalidArgument, "INVALID_MAPPING", "limits.elicitation"},
		{"tool that runs only as a task", func(p *registryv1.ProposeMappingRequest) {
			p.ConnectionId, p.SnapshotId = taskConn.GetId(), taskSnap.GetId()
		}, codes.InvalidArgument, "INVALID_MAPPING", "target.name"},
		{"status tool that runs only as a task", func(p *registryv1.ProposeMappingRequest) {
			p.StatusTool = "status"
			p.ConnectionId, p.SnapshotId = taskConn.GetId(), taskSnap.GetId()
		}, codes.InvalidArgument, "INVALID_MAPPING", "status_tool"},
		{"target not in snapshot", func(p *registryv1.ProposeMappingRequest) {
			p.Target.Name = "export"
		}, codes.InvalidArgument, "REMOTE_TARGET_UNKNOWN", "target.name"},
		{"unknown capability", func(p *registryv1.ProposeMappingRequest) {
			p.Capability = "send_email"
		}, codes.NotFound, "CAPABILITY_UNKNOWN", ""},
		{"snapshot of another connection", func(p *registryv1.ProposeMappingRequest) {
			p.SnapshotId = otherSnap.GetId()
		}, codes.InvalidArgument, "SNAPSHOT_CONNECTION_MISMATCH", "snapshot_id"},
		{"stale snapshot", func(p *registryv1.ProposeMappingRequest) {
			p.ConnectionId, p.SnapshotId = staleConn.GetId(), staleSnap.GetId()
		}, codes.FailedPrecondition, "SNAPSHOT_STALE", ""},
		{"unknown mapping to revise", func(p *registryv1.ProposeMappingRequest) {
			p.MappingId = "map_missing"
		}, codes.NotFound, "MAPPING_UNKNOWN", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			req := proposal(old)
			tt.edit(req)
			_, err := r.client.ProposeMapping(t.Context(), req)
			wantErr(t, err, tt.code, tt.reason)
			if tt.field != "" && !slices.Contains(apierror.Fields(err), tt.field) {
				t.Errorf("violations = %v, want %s", apierror.Fields(err), tt.field)
			}
		})
	}
	t.Run("tool a task may run but need not", func(t *testing.T) {
		t.Parallel()
		conn := createHTTP(t, r.client)
		tool := searchTool(t)
		tool.Execution = mustStruct(t, map[string]any{"taskSupport": "optional"})
		req := proposal(old)
		req.ConnectionId, req.SnapshotId = conn.GetId(), record(t, r.client, conn, tool).GetId()
		if _, err := r.client.ProposeMapping(t.Context(), req); err != nil {
			t.Errorf("a tool with optional task support: %v", err)
		}
	})
}

// drift describes a change of the search tool in a new snapshot.
type drift struct {
	name       string
	tools      func(t *testing.T) []*registryv1.ToolIdentity
	wantReason []string // substrings of state_reason; nil: no review needed
}

func drifts() []drift {
	return []drift{
		{"input schema", func(t *testing.T) []*registryv1.ToolIdentity {
			tool := searchTool(t)
			tool.InputSchema = structuredSearchSchema(t)
			return []*registryv1.ToolIdentity{tool}
		}, []string{"input_schema_digest"}},
		{"description only", func(t *testing.T) []*registryv1.ToolIdentity {
			tool := searchTool(t)
			tool.Description = "Search the library, including private notes."
			return []*registryv1.ToolIdentity{tool}
		}, []string{"description_digest"}},
		{"tool removed", func(*testing.T) []*registryv1.ToolIdentity { return nil }, []string{"no longer listed"}},
		{"unrelated tool added", func(t *testing.T) []*registryv1.ToolIdentity {
			return []*registryv1.ToolIdentity{searchTool(t), {Name: "export", Description: "Export the workspace."}}
		}, nil},
		// Results are validated against the output schema reviewed with
		// the mapping: a new one is a new contract.
		{"output schema only", func(t *testing.T) []*registryv1.ToolIdentity {
			tool := searchTool(t)
			tool.OutputSchema = mustStruct(t, map[string]any{"type": "object"})
			return []*registryv1.ToolIdentity{tool}
		}, []string{"output_schema_digest"}},
	}
}

func TestDriftRequiresReview(t *testing.T) {
	t.Parallel()
	for _, tt := range drifts() {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := start(t)
			conn, _, m := activeSetup(t, r.client)
			next := record(t, r.client, conn, tt.tools(t)...)
			got, err := r.client.GetMapping(t.Context(), &registryv1.GetMappingRequest{Id: m.GetId()})
			if err != nil {
				t.Fatal(err)
			}
			resolveByID := &registryv1.ResolveMappingRequest{Capability: m.GetCapability(), MappingId: m.GetId(), Revision: m.GetRevision()}
			resolveByCap := &registryv1.ResolveMappingRequest{Capability: m.GetCapability(), ConnectionId: conn.GetId()}
			if tt.wantReason == nil {
				if got.GetState() != registryv1.MappingState_MAPPING_STATE_ACTIVE {
					t.Errorf("mapping = %v, want it still active", got)
				}
				if _, err := r.client.ResolveMapping(t.Context(), resolveByID); err != nil {
					t.Errorf("ResolveMapping: %v", err)
				}
				return
			}
			if got.GetState() != registryv1.MappingState_MAPPING_STATE_REVIEW_REQUIRED {
				t.Fatalf("mapping state = %v, want REVIEW_REQUIRED", got.GetState())
			}
			for _, want := range append(tt.wantReason, next.GetId()) {
				if !strings.Contains(got.GetStateReason(), want) {
					t.Errorf("state_reason %q does not mention %q", got.GetStateReason(), want)
				}
			}
			for _, req := range []*registryv1.ResolveMappingRequest{resolveByID, resolveByCap} {
				_, err := r.client.ResolveMapping(t.Context(), req)
				wantErr(t, err, codes.FailedPrecondition, "MAPPING_REVIEW_REQUIRED")
				if !strings.Contains(err.Error(), tt.wantReason[0]) {
					t.Errorf("error %q does not say what changed", err)
				}
				info := apierror.Info(err)
				if info.GetMetadata()["mapping_id"] != m.GetId() || info.GetMetadata()["revision"] != "1" || info.GetMetadata()["capability"] != m.GetCapability() {
					t.Errorf("error metadata = %v", info.GetMetadata())
				}
			}
		})
	}
}

func TestNewRevisionAfterDrift(t *testing.T) {
	t.Parallel()
	r := start(t)
	ctx := t.Context()
	conn, _, m := activeSetup(t, r.client)
	tool := searchTool(t)
	tool.InputSchema = structuredSearchSchema(t)
	next := record(t, r.client, conn, tool)

	// The query is now an object: the new revision binds its text field.
	req := proposal(next)
	req.MappingId = m.GetId()
	req.ArgumentMap[0].RemoteField = "/query/text"
	rev2 := propose(t, r.client, req)
	if rev2.GetId() != m.GetId() || rev2.GetRevision() != 2 || rev2.GetState() != registryv1.MappingState_MAPPING_STATE_PENDING_REVIEW ||
		rev2.GetInputSchemaDigest() != next.GetTools()[0].GetInputSchemaDigest() {
		t.Fatalf("revision 2 = %v", rev2)
	}
	_, err := r.client.ResolveMapping(ctx, &registryv1.ResolveMappingRequest{Capability: m.GetCapability(), MappingId: m.GetId()})
	wantErr(t, err, codes.FailedPrecondition, "MAPPING_PENDING_REVIEW")

	// Reviewing the old revision is a conflict, not an approval.
	_, err = r.client.ReviewMapping(identitytest.As(ctx, "reviewer", "reviewers"), &registryv1.ReviewMappingRequest{MappingId: m.GetId(), Revision: 1, Approve: true})
	wantErr(t, err, codes.Aborted, "MAPPING_REVISION_CONFLICT")

	approve(t, r.client, rev2)
	got, err := r.client.ResolveMapping(ctx, &registryv1.ResolveMappingRequest{Capability: m.GetCapability()})
	if err != nil || got.GetRevision() != 2 || got.GetState() != registryv1.MappingState_MAPPING_STATE_ACTIVE {
		t.Fatalf("ResolveMapping = %v, %v; want revision 2 active", got, err)
	}
	if _, err := r.client.ResolveMapping(ctx, &registryv1.ResolveMappingRequest{Capability: m.GetCapability(), MappingId: m.GetId(), Revision: 2}); err != nil {
		t.Errorf("ResolveMapping revision 2: %v", err)
	}
	_, err = r.client.ResolveMapping(ctx, &registryv1.ResolveMappingRequest{Capability: m.GetCapability(), MappingId: m.GetId(), Revision: 1})
	wantErr(t, err, codes.FailedPrecondition, "MAPPING_SUPERSEDED")

	// The old revision stays readable as history.
	old, err := r.client.GetMapping(ctx, &registryv1.GetMappingRequest{Id: m.GetId(), Revision: 1})
	if err != nil {
		t.Fatal(err)
	}
	if old.GetRevision() != 1 || old.GetInputSchemaDigest() != m.GetInputSchemaDigest() ||
		old.GetState() != registryv1.MappingState_MAPPING_STATE_RETIRED || !strings.Contains(old.GetStateReason(), "input_schema_digest") {
		t.Errorf("revision 1 = %v", old)
	}
	_, err = r.client.GetMapping(ctx, &registryv1.GetMappingRequest{Id: m.GetId(), Revision: 3})
	wantErr(t, err, codes.NotFound, "MAPPING_REVISION_UNKNOWN")
}

func TestReviewRefusesStaleEvidence(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		change func(t *testing.T, r *running, conn *registryv1.Connection)
	}{
		{"config revised", func(t *testing.T, r *running, conn *registryv1.Connection) {
			if _, err := r.client.UpdateConnection(t.Context(), &registryv1.UpdateConnectionRequest{Id: conn.GetId(), ExpectedConfigRevision: 1,
				Transport: conn.GetTransport(), CredentialRef: conn.GetCredentialRef(), CredentialVersion: "2"}); err != nil {
				t.Fatal(err)
			}
		}},
		{"schema drifted", func(t *testing.T, r *running, conn *registryv1.Connection) {
			tool := searchTool(t)
			tool.InputSchema = structuredSearchSchema(t)
			record(t, r.client, conn, tool)
		}},
		{"description drifted", func(t *testing.T, r *running, conn *registryv1.Connection) {
			tool := searchTool(t)
			tool.Description = "Now searches private notes."
			record(t, r.client, conn, tool)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := start(t)
			conn := createHTTP(t, r.client)
			m := propose(t, r.client, proposal(record(t, r.client, conn, searchTool(t))))
			tt.change(t, r, conn)
			_, err := r.client.ReviewMapping(identitytest.As(t.Context(), "reviewer", "reviewers"), &registryv1.ReviewMappingRequest{MappingId: m.GetId(), Revision: 1, Approve: true})
			wantErr(t, err, codes.FailedPrecondition, "MAPPING_STALE")
			got, err := r.client.GetMapping(t.Context(), &registryv1.GetMappingRequest{Id: m.GetId()})
			if err != nil || got.GetState() != registryv1.MappingState_MAPPING_STATE_PENDING_REVIEW {
				t.Errorf("mapping after refused approval = %v, %v", got, err)
			}
		})
	}
}

func TestApprovalSupersedesAndRejection(t *testing.T) {
	t.Parallel()
	r := start(t)
	ctx := t.Context()
	conn, snap, first := activeSetup(t, r.client)

	second := approve(t, r.client, propose(t, r.client, proposal(snap)))
	old, err := r.client.GetMapping(ctx, &registryv1.GetMappingRequest{Id: first.GetId()})
	if err != nil || old.GetState() != registryv1.MappingState_MAPPING_STATE_RETIRED || !strings.Contains(old.GetStateReason(), second.GetId()) {
		t.Errorf("first mapping after second approved = %v, %v", old, err)
	}
	got, err := r.client.ResolveMapping(ctx, &registryv1.ResolveMappingRequest{Capability: "retrieve_authorized_source", ConnectionId: conn.GetId()})
	if err != nil || got.GetId() != second.GetId() {
		t.Errorf("ResolveMapping = %v, %v; want %s", got, err, second.GetId())
	}

	third := propose(t, r.client, proposal(snap))
	rejected, err := r.client.ReviewMapping(identitytest.As(ctx, "reviewer", "reviewers"), &registryv1.ReviewMappingRequest{MappingId: third.GetId(), Revision: 1, Approve: false, Note: "duplicate"})
	if err != nil || rejected.GetState() != registryv1.MappingState_MAPPING_STATE_RETIRED || rejected.GetReviewNote() != "duplicate" {
		t.Errorf("rejected mapping = %v, %v", rejected, err)
	}
	_, err = r.client.ResolveMapping(ctx, &registryv1.ResolveMappingRequest{Capability: third.GetCapability(), MappingId: third.GetId()})
	wantErr(t, err, codes.FailedPrecondition, "MAPPING_RETIRED")

	list, err := r.client.ListMappings(ctx, &registryv1.ListMappingsRequest{ConnectionId: conn.GetId(), State: registryv1.MappingState_MAPPING_STATE_RETIRED})
	if err != nil || len(list.GetMappings()) != 2 {
		t.Errorf("retired mappings = %v, %v; want 2", list, err)
	}
	list, err = r.client.ListMappings(ctx, &registryv1.ListMappingsRequest{Capability: "render_preview"})
	if err != nil || len(list.GetMappings()) != 0 {
		t.Errorf("render_preview mappings = %v, %v; want none", list, err)
	}
}

func TestResourceMapping(t *testing.T) {
	t.Parallel()
	r := start(t)
	conn := createHTTP(t, r.client)
	res := func(desc string) *registryv1.DiscoverySnapshot {
		s, err := r.client.RecordSnapshot(t.Context(), &registryv1.RecordSnapshotRequest{Snapshot: &registryv1.DiscoverySnapshot{
			ConnectionId: conn.GetId(), ConfigRevision: 1,
			Resources: []*registryv1.ResourceIdentity{{Uri: "notes://migration", Description: desc, MimeType: "text/markdown"}}}})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	snap := res("API migration notes")
	m := approve(t, r.client, propose(t, r.client, &registryv1.ProposeMappingRequest{
		Capability: "retrieve_authorized_source", ConnectionId: conn.GetId(), SnapshotId: snap.GetId(),
		Target:      &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_RESOURCE, Name: "notes://migration"},
		ArgumentMap: []*registryv1.ArgumentBinding{{RemoteField: "uri", ProductField: "source", FromHandle: true}},
		Limits:      &registryv1.Limits{MaxResponseBytes: 1 << 16, MaxItems: 1},
	}))
	if m.GetInputSchemaDigest() != "" || m.GetDescriptionDigest() != snap.GetResources()[0].GetDescriptionDigest() {
		t.Errorf("resource mapping = %v", m)
	}
	res("API migration notes, now including private notes")
	_, err := r.client.ResolveMapping(t.Context(), &registryv1.ResolveMappingRequest{Capability: m.GetCapability(), MappingId: m.GetId()})
	wantErr(t, err, codes.FailedPrecondition, "MAPPING_REVIEW_REQUIRED")
}

// ResolveExecution answers what ResolveMapping answers for a held mapping
// revision and returns the connection it runs on with it, as GetConnection
// reads it; every refusal of ResolveMapping is its refusal too.
func TestResolveExecution(t *testing.T) {
	t.Parallel()
	r := start(t)
	ctx := t.Context()
	_, _, m := activeSetup(t, r.client)
	conn, err := r.client.GetConnection(ctx, &registryv1.GetConnectionRequest{Id: m.GetConnectionId()})
	if err != nil {
		t.Fatal(err)
	}
	got, err := r.client.ResolveExecution(ctx, &registryv1.ResolveExecutionRequest{Capability: m.GetCapability(), MappingId: m.GetId(), Revision: m.GetRevision()})
	if err != nil {
		t.Fatalf("ResolveExecution: %v", err)
	}
	if !proto.Equal(got.GetMapping(), m) || !proto.Equal(got.GetConnection(), conn) {
		t.Errorf("ResolveExecution = %v\nwant mapping %v\nand connection %v", got, m, conn)
	}
	for _, tc := range []struct {
		name   string
		req    *registryv1.ResolveExecutionRequest
		code   codes.Code
		reason string
	}{
		{"no mapping", &registryv1.ResolveExecutionRequest{Capability: m.GetCapability()}, codes.InvalidArgument, "FIELD_REQUIRED"},
		{"unknown mapping", &registryv1.ResolveExecutionRequest{Capability: m.GetCapability(), MappingId: "map_unknown"}, codes.NotFound, "MAPPING_UNKNOWN"},
		{"another capability", &registryv1.ResolveExecutionRequest{Capability: "render_preview", MappingId: m.GetId()}, codes.InvalidArgument, "MAPPING_CAPABILITY_MISMATCH"},
		{"superseded revision", &registryv1.ResolveExecutionRequest{Capability: m.GetCapability(), MappingId: m.GetId(), Revision: m.GetRevision() + 1}, codes.FailedPrecondition, "MAPPING_SUPERSEDED"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := r.client.ResolveExecution(ctx, tc.req)
			wantErr(t, err, tc.code, tc.reason)
		})
	}
}

// executionReads counts the store reads ResolveExecution can make.
type executionReads struct {
	registry.Store
	n atomic.Int64
}

func (e *executionReads) ReadExecution(ctx context.Context, mappingID, capability, connectionID string) (registry.Execution, error) {
	e.n.Add(1)
	return e.Store.ReadExecution(ctx, mappingID, capability, connectionID)
}

func (e *executionReads) GetMapping(ctx context.Context, id string, revision int64) (*registryv1.Mapping, error) {
	e.n.Add(1)
	return e.Store.GetMapping(ctx, id, revision)
}

func (e *executionReads) GetCapability(ctx context.Context, name string, revision int64) (*registryv1.Capability, error) {
	e.n.Add(1)
	return e.Store.GetCapability(ctx, name, revision)
}

func (e *executionReads) GetConnection(ctx context.Context, id string) (*registryv1.Connection, error) {
	e.n.Add(1)
	return e.Store.GetConnection(ctx, id)
}

// Once a mapping's connection is known, ResolveExecution reads the
// mapping, the capability's contract and the connection in one store
// read, and still sees every change to any of them.
func TestResolveExecutionReadsOnce(t *testing.T) {
	t.Parallel()
	reads := &executionReads{}
	r := startWith(t, filepath.Join(t.TempDir(), "registry.db"), func(s *registry.Server) *registry.Server {
		return s.WrapStore(func(st registry.Store) registry.Store { reads.Store = st; return reads })
	})
	ctx := t.Context()
	_, _, m := activeSetup(t, r.client)
	resolve := func() (*registryv1.ResolvedExecution, int64, error) {
		before := reads.n.Load()
		got, err := r.client.ResolveExecution(ctx, &registryv1.ResolveExecutionRequest{Capability: m.GetCapability(), MappingId: m.GetId()})
		return got, reads.n.Load() - before, err
	}
	if _, _, err := resolve(); err != nil {
		t.Fatal(err)
	}
	if _, n, err := resolve(); err != nil || n != 1 {
		t.Errorf("ResolveExecution of a known mapping: %d store reads, %v; want 1", n, err)
	}

	// The connection is read afresh each time: a change shows at once.
	if _, err := r.client.UpdateConnection(ctx, &registryv1.UpdateConnectionRequest{Id: m.GetConnectionId(), ExpectedConfigRevision: 1, DisplayName: "renamed"}); err != nil {
		t.Fatal(err)
	}
	got, n, err := resolve()
	if err != nil || n != 1 || got.GetConnection().GetDisplayName() != "renamed" {
		t.Errorf("after a rename: connection %q, %d store reads, %v; want \"renamed\" in 1", got.GetConnection().GetDisplayName(), n, err)
	}

	// So is the mapping: one sent to review is refused.
	if _, err := r.client.UpdateConnection(ctx, &registryv1.UpdateConnectionRequest{
		Id: m.GetConnectionId(), ExpectedConfigRevision: got.GetConnection().GetConfigRevision(), Reason: "moved",
		Transport: &registryv1.Transport{Kind: &registryv1.Transport_StreamableHttp{
			StreamableHttp: &registryv1.StreamableHTTPTransport{Url: "http://sources.mcp.svc:8080/mcp/v2"}}}}); err != nil {
		t.Fatal(err)
	}
	_, _, err = resolve()
	wantErr(t, err, codes.FailedPrecondition, "MAPPING_REVIEW_REQUIRED")
}
