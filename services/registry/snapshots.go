package registry

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/internal/apierror"
	"github.com/v0m3/v0m3/services/internal/digest"
	"github.com/v0m3/v0m3/services/internal/ids"
)

// Names of the digests a diff or a drift reason can report.
const (
	fieldInputSchemaDigest  = "input_schema_digest"
	fieldOutputSchemaDigest = "output_schema_digest"
	fieldAnnotationsDigest  = "annotations_digest"
	fieldDescriptionDigest  = "description_digest"
	fieldMimeType           = "mime_type"
)

// RecordSnapshot stores an immutable discovery snapshot taken at the
// connection's current config revision. The registry computes every digest
// itself. Active mappings whose remote tool or resource disappeared or whose
// input schema, output schema or description changed move to REVIEW_REQUIRED in the same
// transaction.
func (s *Server) RecordSnapshot(ctx context.Context, req *registryv1.RecordSnapshotRequest) (*registryv1.DiscoverySnapshot, error) {
	snap, err := normalizeSnapshot(req.GetSnapshot())
	if err != nil {
		return nil, err
	}
	snap.Id = ids.New("snap")
	if snap.RetrieveTime == nil {
		snap.RetrieveTime = s.timestamp()
	}

	var reviews int
	err = s.updateConnection(ctx, snap.GetConnectionId(), func(u *ConnectionUpdate) error {
		reviews = 0
		c := u.Connection
		if c.GetState() == registryv1.ConnectionState_CONNECTION_STATE_RETIRED {
			return connectionRetired(c)
		}
		if c.GetConfigRevision() != snap.GetConfigRevision() {
			return apierror.New(codes.FailedPrecondition, "CONFIG_REVISION_STALE",
				fmt.Sprintf("snapshot was taken at config revision %d but connection %s is at revision %d; discover again with the current configuration",
					snap.GetConfigRevision(), c.GetId(), c.GetConfigRevision()),
				map[string]string{"connection_id": c.GetId(), "config_revision": fmt.Sprint(c.GetConfigRevision())})
		}
		u.Snapshot = snap
		c.LatestSnapshotId = snap.GetId()
		c.ObservedServer = proto.CloneOf(snap.GetServerInfo())
		c.ObservedProtocolVersion = snap.GetProtocolVersion()
		c.UpdateTime = s.timestamp()
		u.Events = append(u.Events, s.event(registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_SNAPSHOT_RECORDED, c.GetId(), "", snap.GetId(),
			fmt.Sprintf("snapshot %s recorded at config revision %d: %d tools, %d resources", snap.GetId(), snap.GetConfigRevision(), len(snap.GetTools()), len(snap.GetResources()))))
		for _, m := range u.Mappings {
			if m.GetState() != registryv1.MappingState_MAPPING_STATE_ACTIVE {
				continue
			}
			reason := driftReason(m, snap)
			if reason == "" {
				continue
			}
			m.State = registryv1.MappingState_MAPPING_STATE_REVIEW_REQUIRED
			m.StateReason = reason
			u.WriteMappings = append(u.WriteMappings, m)
			u.Events = append(u.Events, s.event(registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_MAPPING_REVIEW_REQUIRED, c.GetId(), m.GetId(), snap.GetId(), reason))
			reviews++
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.log.InfoContext(ctx, "snapshot recorded", "connection_id", snap.GetConnectionId(), "snapshot_id", snap.GetId(),
		"digest", snap.GetDigest(), "tools", len(snap.GetTools()), "resources", len(snap.GetResources()), "mappings_to_review", reviews)
	return snap, nil
}

// normalizeSnapshot validates a submitted snapshot and returns a copy with
// sorted identities and every digest computed here; digests in the request
// are never trusted.
func normalizeSnapshot(in *registryv1.DiscoverySnapshot) (*registryv1.DiscoverySnapshot, error) {
	if in == nil {
		return nil, required("snapshot", "the discovery snapshot to record")
	}
	var v []apierror.FieldViolation
	if in.GetConnectionId() == "" {
		v = append(v, apierror.FieldViolation{Field: "snapshot.connection_id", Description: "the connection the snapshot was taken from is required"})
	}
	if in.GetConfigRevision() <= 0 {
		v = append(v, apierror.FieldViolation{Field: "snapshot.config_revision", Description: "the config revision in force at discovery (>= 1) is required"})
	}
	out := &registryv1.DiscoverySnapshot{
		ConnectionId:    in.GetConnectionId(),
		ConfigRevision:  in.GetConfigRevision(),
		ServerInfo:      proto.CloneOf(in.GetServerInfo()),
		ProtocolVersion: in.GetProtocolVersion(),
		RetrieveTime:    proto.CloneOf(in.GetRetrieveTime()),
	}
	seen := map[string]bool{}
	for i, t := range in.GetTools() {
		field := fmt.Sprintf("snapshot.tools[%d]", i)
		if t.GetName() == "" {
			v = append(v, apierror.FieldViolation{Field: field + ".name", Description: "a tool name is required"})
			continue
		}
		if seen[t.GetName()] {
			v = append(v, apierror.FieldViolation{Field: field + ".name", Description: fmt.Sprintf("tool %q is listed twice", t.GetName())})
			continue
		}
		seen[t.GetName()] = true
		tool, err := toolWithDigests(t)
		if err != nil {
			v = append(v, apierror.FieldViolation{Field: field, Description: err.Error()})
			continue
		}
		out.Tools = append(out.Tools, tool)
	}
	seen = map[string]bool{}
	for i, r := range in.GetResources() {
		field := fmt.Sprintf("snapshot.resources[%d].uri", i)
		switch {
		case r.GetUri() == "":
			v = append(v, apierror.FieldViolation{Field: field, Description: "a resource URI is required"})
			continue
		case seen[r.GetUri()]:
			v = append(v, apierror.FieldViolation{Field: field, Description: fmt.Sprintf("resource %q is listed twice", r.GetUri())})
			continue
		}
		seen[r.GetUri()] = true
		res := proto.CloneOf(r)
		res.DescriptionDigest = digest.String(r.GetDescription())
		out.Resources = append(out.Resources, res)
	}
	if len(v) > 0 {
		return nil, apierror.InvalidArgument("INVALID_SNAPSHOT", "invalid discovery snapshot: "+violationText(v), v...)
	}
	slices.SortFunc(out.Tools, func(a, b *registryv1.ToolIdentity) int { return strings.Compare(a.GetName(), b.GetName()) })
	slices.SortFunc(out.Resources, func(a, b *registryv1.ResourceIdentity) int { return strings.Compare(a.GetUri(), b.GetUri()) })
	d, err := snapshotDigest(out)
	if err != nil {
		return nil, apierror.InvalidArgument("INVALID_SNAPSHOT", "the snapshot cannot be digested: "+err.Error(),
			apierror.FieldViolation{Field: "snapshot", Description: err.Error()})
	}
	out.Digest = d
	return out, nil
}

func toolWithDigests(in *registryv1.ToolIdentity) (*registryv1.ToolIdentity, error) {
	t := proto.CloneOf(in)
	var err error
	if t.InputSchemaDigest, err = digest.Struct(t.GetInputSchema()); err != nil {
		return nil, fmt.Errorf("input_schema: %w", err)
	}
	if t.OutputSchemaDigest, err = digest.Struct(t.GetOutputSchema()); err != nil {
		return nil, fmt.Errorf("output_schema: %w", err)
	}
	if t.AnnotationsDigest, err = digest.Struct(t.GetAnnotations()); err != nil {
		return nil, fmt.Errorf("annotations: %w", err)
	}
	t.DescriptionDigest = digest.String(t.GetDescription())
	return t, nil
}

// snapshotDigest digests the snapshot's identities and digests: what was
// described, not when it was asked.
func snapshotDigest(s *registryv1.DiscoverySnapshot) (string, error) {
	tools := make([]any, 0, len(s.GetTools()))
	for _, t := range s.GetTools() {
		tools = append(tools, map[string]any{
			"name":                  t.GetName(),
			"title":                 t.GetTitle(),
			fieldInputSchemaDigest:  t.GetInputSchemaDigest(),
			fieldOutputSchemaDigest: t.GetOutputSchemaDigest(),
			fieldAnnotationsDigest:  t.GetAnnotationsDigest(),
			fieldDescriptionDigest:  t.GetDescriptionDigest(),
		})
	}
	resources := make([]any, 0, len(s.GetResources()))
	for _, r := range s.GetResources() {
		resources = append(resources, map[string]any{
			"uri":                  r.GetUri(),
			"name":                 r.GetName(),
			"title":                r.GetTitle(),
			fieldMimeType:          r.GetMimeType(),
			"size":                 r.GetSize(),
			fieldDescriptionDigest: r.GetDescriptionDigest(),
		})
	}
	return digest.JSON(map[string]any{
		"connection_id":   s.GetConnectionId(),
		"config_revision": s.GetConfigRevision(),
		"server_info": map[string]any{
			"name":    s.GetServerInfo().GetName(),
			"version": s.GetServerInfo().GetVersion(),
			"title":   s.GetServerInfo().GetTitle(),
		},
		"protocol_version": s.GetProtocolVersion(),
		"tools":            tools,
		"resources":        resources,
	})
}

// driftReason says why an active mapping no longer matches a snapshot of its
// connection, or "" when its target is unchanged.
func driftReason(m *registryv1.Mapping, snap *registryv1.DiscoverySnapshot) string {
	name := m.GetTarget().GetName()
	var changed []string
	switch m.GetTarget().GetKind() {
	case registryv1.RemoteKind_REMOTE_KIND_TOOL:
		t := findTool(snap, name)
		if t == nil {
			return fmt.Sprintf("tool %q is no longer listed in snapshot %s", name, snap.GetId())
		}
		if t.GetInputSchemaDigest() != m.GetInputSchemaDigest() {
			changed = append(changed, fieldInputSchemaDigest)
		}
		if t.GetDescriptionDigest() != m.GetDescriptionDigest() {
			changed = append(changed, fieldDescriptionDigest)
		}
		// Results are validated against the output schema the mapping
		// copied at review: another schema is another contract.
		if t.GetOutputSchemaDigest() != m.GetOutputSchemaDigest() {
			changed = append(changed, fieldOutputSchemaDigest)
		}
	case registryv1.RemoteKind_REMOTE_KIND_RESOURCE:
		r := findResource(snap, name)
		if r == nil {
			return fmt.Sprintf("resource %q is no longer listed in snapshot %s", name, snap.GetId())
		}
		if r.GetDescriptionDigest() != m.GetDescriptionDigest() {
			changed = append(changed, fieldDescriptionDigest)
		}
	default:
		return fmt.Sprintf("mapping has no valid remote target kind (%v)", m.GetTarget().GetKind())
	}
	if len(changed) == 0 {
		return ""
	}
	return fmt.Sprintf("%s of %q changed in snapshot %s", strings.Join(changed, " and "), name, snap.GetId())
}

func findTool(s *registryv1.DiscoverySnapshot, name string) *registryv1.ToolIdentity {
	for _, t := range s.GetTools() {
		if t.GetName() == name {
			return t
		}
	}
	return nil
}

func findResource(s *registryv1.DiscoverySnapshot, uri string) *registryv1.ResourceIdentity {
	for _, r := range s.GetResources() {
		if r.GetUri() == uri {
			return r
		}
	}
	return nil
}

// GetSnapshot returns one discovery snapshot.
func (s *Server) GetSnapshot(ctx context.Context, req *registryv1.GetSnapshotRequest) (*registryv1.DiscoverySnapshot, error) {
	if req.GetId() == "" {
		return nil, required("id", "the snapshot id, e.g. snap_...")
	}
	return s.getSnapshot(ctx, req.GetId())
}

func (s *Server) getSnapshot(ctx context.Context, id string) (*registryv1.DiscoverySnapshot, error) {
	snap, err := s.st.GetSnapshot(ctx, id)
	if err != nil {
		return nil, s.storeError(ctx, err, "get snapshot", func() error {
			return apierror.New(codes.NotFound, "SNAPSHOT_UNKNOWN", fmt.Sprintf("snapshot %q does not exist", id), map[string]string{"snapshot_id": id})
		})
	}
	return snap, nil
}

// ListSnapshots returns a connection's snapshots, oldest first.
func (s *Server) ListSnapshots(ctx context.Context, req *registryv1.ListSnapshotsRequest) (*registryv1.ListSnapshotsResponse, error) {
	if req.GetConnectionId() == "" {
		return nil, required("connection_id", "the connection whose snapshots to list")
	}
	if _, err := s.getConnection(ctx, req.GetConnectionId()); err != nil {
		return nil, err
	}
	snaps, err := s.st.ListSnapshots(ctx, req.GetConnectionId())
	if err != nil {
		return nil, s.storeError(ctx, err, "list snapshots", nil)
	}
	return &registryv1.ListSnapshotsResponse{Snapshots: snaps}, nil
}

// DiffSnapshots says which tools and resources were added, removed or
// changed between two snapshots, and which digests changed.
func (s *Server) DiffSnapshots(ctx context.Context, req *registryv1.DiffSnapshotsRequest) (*registryv1.SnapshotDiff, error) {
	var v []apierror.FieldViolation
	if req.GetBaseSnapshotId() == "" {
		v = append(v, apierror.FieldViolation{Field: "base_snapshot_id", Description: "the older snapshot is required"})
	}
	if req.GetTargetSnapshotId() == "" {
		v = append(v, apierror.FieldViolation{Field: "target_snapshot_id", Description: "the newer snapshot is required"})
	}
	if len(v) > 0 {
		return nil, apierror.InvalidArgument("FIELD_REQUIRED", "both snapshots are required", v...)
	}
	base, err := s.getSnapshot(ctx, req.GetBaseSnapshotId())
	if err != nil {
		return nil, err
	}
	target, err := s.getSnapshot(ctx, req.GetTargetSnapshotId())
	if err != nil {
		return nil, err
	}
	return diffSnapshots(base, target), nil
}

func diffSnapshots(base, target *registryv1.DiscoverySnapshot) *registryv1.SnapshotDiff {
	d := &registryv1.SnapshotDiff{
		BaseSnapshotId:   base.GetId(),
		TargetSnapshotId: target.GetId(),
		ServerChanged: !proto.Equal(base.GetServerInfo(), target.GetServerInfo()) ||
			base.GetProtocolVersion() != target.GetProtocolVersion(),
	}
	d.Tools = diffItems(base.GetTools(), target.GetTools(), (*registryv1.ToolIdentity).GetName,
		func(a, b *registryv1.ToolIdentity) []string {
			var c []string
			if a.GetInputSchemaDigest() != b.GetInputSchemaDigest() {
				c = append(c, fieldInputSchemaDigest)
			}
			if a.GetOutputSchemaDigest() != b.GetOutputSchemaDigest() {
				c = append(c, fieldOutputSchemaDigest)
			}
			if a.GetAnnotationsDigest() != b.GetAnnotationsDigest() {
				c = append(c, fieldAnnotationsDigest)
			}
			if a.GetDescriptionDigest() != b.GetDescriptionDigest() {
				c = append(c, fieldDescriptionDigest)
			}
			return c
		})
	d.Resources = diffItems(base.GetResources(), target.GetResources(), (*registryv1.ResourceIdentity).GetUri,
		func(a, b *registryv1.ResourceIdentity) []string {
			var c []string
			if a.GetDescriptionDigest() != b.GetDescriptionDigest() {
				c = append(c, fieldDescriptionDigest)
			}
			if a.GetMimeType() != b.GetMimeType() {
				c = append(c, fieldMimeType)
			}
			return c
		})
	return d
}

// diffItems compares two lists keyed by key, returning changes sorted by key.
func diffItems[T any](base, target []T, key func(T) string, changed func(a, b T) []string) []*registryv1.ItemChange {
	old := make(map[string]T, len(base))
	for _, b := range base {
		old[key(b)] = b
	}
	var out []*registryv1.ItemChange
	seen := make(map[string]bool, len(target))
	for _, t := range target {
		k := key(t)
		seen[k] = true
		b, ok := old[k]
		if !ok {
			out = append(out, &registryv1.ItemChange{Name: k, Kind: registryv1.ChangeKind_CHANGE_KIND_ADDED})
			continue
		}
		if c := changed(b, t); len(c) > 0 {
			out = append(out, &registryv1.ItemChange{Name: k, Kind: registryv1.ChangeKind_CHANGE_KIND_CHANGED, ChangedDigests: c})
		}
	}
	for _, b := range base {
		if k := key(b); !seen[k] {
			out = append(out, &registryv1.ItemChange{Name: k, Kind: registryv1.ChangeKind_CHANGE_KIND_REMOVED})
		}
	}
	slices.SortFunc(out, func(a, b *registryv1.ItemChange) int { return strings.Compare(a.GetName(), b.GetName()) })
	return out
}

func violationText(v []apierror.FieldViolation) string {
	parts := make([]string, 0, len(v))
	for _, f := range v {
		parts = append(parts, f.Field+": "+f.Description)
	}
	return strings.Join(parts, "; ")
}
