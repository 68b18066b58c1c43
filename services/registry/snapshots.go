package registry

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/yosida95/uritemplate/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/authz"
	"github.com/v0m3/v0m3/internal/digest"
	"github.com/v0m3/v0m3/internal/ids"
	"github.com/v0m3/v0m3/internal/paging"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// Names of the digests (and plain fields) a diff or a drift reason can
// report.
const (
	fieldInputSchemaDigest       = "input_schema_digest"
	fieldOutputSchemaDigest      = "output_schema_digest"
	fieldAnnotationsDigest       = "annotations_digest"
	fieldDescriptionDigest       = "description_digest"
	fieldTitleDigest             = "title_digest"
	fieldExecutionDigest         = "execution_digest"
	fieldIconsDigest             = "icons_digest"
	fieldArgumentsDigest         = "arguments_digest"
	fieldResourceTemplatesDigest = "resource_templates_digest"
	fieldMimeType                = "mime_type"
	fieldName                    = "name"
)

// RecordSnapshot stores an immutable discovery snapshot taken at the
// connection's current config revision. The registry computes every digest
// itself. Active mappings whose remote tool or resource disappeared or whose
// reviewed identity changed (input schema, output schema, description, or any of the
// target digests: title, annotations, execution, icons, media type,
// matching resource templates) move to REVIEW_REQUIRED in the
// same transaction. When the server describes itself differently from the
// previous snapshot, a SURFACE_CHANGED event names what changed, whether or
// not a mapping depends on it.
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
			fmt.Sprintf("snapshot %s recorded at config revision %d: %d tools, %d resources, %d resource templates, %d prompts",
				snap.GetId(), snap.GetConfigRevision(), len(snap.GetTools()), len(snap.GetResources()), len(snap.GetResourceTemplates()), len(snap.GetPrompts()))))
		if prev := u.LatestSnapshot; prev != nil {
			if detail := surfaceChange(diffSnapshots(prev, snap)); detail != "" {
				u.Events = append(u.Events, s.event(registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_SURFACE_CHANGED, c.GetId(), "", snap.GetId(), detail))
			}
		}
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
		"digest", snap.GetDigest(), "tools", len(snap.GetTools()), "resources", len(snap.GetResources()),
		"resource_templates", len(snap.GetResourceTemplates()), "prompts", len(snap.GetPrompts()), "mappings_to_review", reviews)
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
		res, err := resourceWithDigests(r)
		if err != nil {
			v = append(v, apierror.FieldViolation{Field: fmt.Sprintf("snapshot.resources[%d]", i), Description: err.Error()})
			continue
		}
		out.Resources = append(out.Resources, res)
	}
	seen = map[string]bool{}
	for i, rt := range in.GetResourceTemplates() {
		field := fmt.Sprintf("snapshot.resource_templates[%d]", i)
		switch {
		case rt.GetUriTemplate() == "":
			v = append(v, apierror.FieldViolation{Field: field + ".uri_template", Description: "a URI template is required"})
			continue
		case seen[rt.GetUriTemplate()]:
			v = append(v, apierror.FieldViolation{Field: field + ".uri_template", Description: fmt.Sprintf("resource template %q is listed twice", rt.GetUriTemplate())})
			continue
		}
		seen[rt.GetUriTemplate()] = true
		tmpl, err := templateWithDigests(rt)
		if err != nil {
			v = append(v, apierror.FieldViolation{Field: field, Description: err.Error()})
			continue
		}
		out.ResourceTemplates = append(out.ResourceTemplates, tmpl)
	}
	seen = map[string]bool{}
	for i, p := range in.GetPrompts() {
		field := fmt.Sprintf("snapshot.prompts[%d]", i)
		switch {
		case p.GetName() == "":
			v = append(v, apierror.FieldViolation{Field: field + ".name", Description: "a prompt name is required"})
			continue
		case seen[p.GetName()]:
			v = append(v, apierror.FieldViolation{Field: field + ".name", Description: fmt.Sprintf("prompt %q is listed twice", p.GetName())})
			continue
		}
		seen[p.GetName()] = true
		prompt, err := promptWithDigests(p)
		if err != nil {
			v = append(v, apierror.FieldViolation{Field: field, Description: err.Error()})
			continue
		}
		out.Prompts = append(out.Prompts, prompt)
	}
	if len(v) > 0 {
		return nil, apierror.InvalidArgument("INVALID_SNAPSHOT", "invalid discovery snapshot: "+violationText(v), v...)
	}
	slices.SortFunc(out.Tools, func(a, b *registryv1.ToolIdentity) int { return strings.Compare(a.GetName(), b.GetName()) })
	slices.SortFunc(out.Resources, func(a, b *registryv1.ResourceIdentity) int { return strings.Compare(a.GetUri(), b.GetUri()) })
	slices.SortFunc(out.ResourceTemplates, func(a, b *registryv1.ResourceTemplateIdentity) int {
		return strings.Compare(a.GetUriTemplate(), b.GetUriTemplate())
	})
	slices.SortFunc(out.Prompts, func(a, b *registryv1.PromptIdentity) int { return strings.Compare(a.GetName(), b.GetName()) })
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
	if t.ExecutionDigest, err = digest.Struct(t.GetExecution()); err != nil {
		return nil, fmt.Errorf("execution: %w", err)
	}
	if t.IconsDigest, err = iconsDigest(t.GetIcons()); err != nil {
		return nil, fmt.Errorf("icons: %w", err)
	}
	t.DescriptionDigest = digest.String(t.GetDescription())
	t.TitleDigest = digest.String(t.GetTitle())
	return t, nil
}

func resourceWithDigests(in *registryv1.ResourceIdentity) (*registryv1.ResourceIdentity, error) {
	r := proto.CloneOf(in)
	var err error
	if r.AnnotationsDigest, err = contentAnnotationsDigest(r.GetAnnotations()); err != nil {
		return nil, fmt.Errorf("annotations: %w", err)
	}
	if r.IconsDigest, err = iconsDigest(r.GetIcons()); err != nil {
		return nil, fmt.Errorf("icons: %w", err)
	}
	r.DescriptionDigest = digest.String(r.GetDescription())
	r.TitleDigest = digest.String(r.GetTitle())
	return r, nil
}

func templateWithDigests(in *registryv1.ResourceTemplateIdentity) (*registryv1.ResourceTemplateIdentity, error) {
	rt := proto.CloneOf(in)
	var err error
	if rt.AnnotationsDigest, err = contentAnnotationsDigest(rt.GetAnnotations()); err != nil {
		return nil, fmt.Errorf("annotations: %w", err)
	}
	if rt.IconsDigest, err = iconsDigest(rt.GetIcons()); err != nil {
		return nil, fmt.Errorf("icons: %w", err)
	}
	rt.DescriptionDigest = digest.String(rt.GetDescription())
	rt.TitleDigest = digest.String(rt.GetTitle())
	return rt, nil
}

func promptWithDigests(in *registryv1.PromptIdentity) (*registryv1.PromptIdentity, error) {
	p := proto.CloneOf(in)
	var err error
	if p.ArgumentsDigest, err = argumentsDigest(p.GetArguments()); err != nil {
		return nil, fmt.Errorf("arguments: %w", err)
	}
	if p.IconsDigest, err = iconsDigest(p.GetIcons()); err != nil {
		return nil, fmt.Errorf("icons: %w", err)
	}
	p.DescriptionDigest = digest.String(p.GetDescription())
	p.TitleDigest = digest.String(p.GetTitle())
	return p, nil
}

// iconsDigest digests an icon list in the server's order, in MCP's own
// JSON shape, or "" when there is none.
func iconsDigest(icons []*registryv1.Icon) (string, error) {
	if len(icons) == 0 {
		return "", nil
	}
	list := make([]any, 0, len(icons))
	for _, ic := range icons {
		m := map[string]any{"src": ic.GetSrc()}
		if ic.GetMimeType() != "" {
			m["mimeType"] = ic.GetMimeType()
		}
		if len(ic.GetSizes()) > 0 {
			m["sizes"] = ic.GetSizes()
		}
		if ic.GetTheme() != "" {
			m["theme"] = ic.GetTheme()
		}
		list = append(list, m)
	}
	return digest.JSON(list)
}

// argumentsDigest digests a prompt's argument list in the server's order,
// or "" when there is none.
func argumentsDigest(args []*registryv1.PromptArgument) (string, error) {
	if len(args) == 0 {
		return "", nil
	}
	list := make([]any, 0, len(args))
	for _, a := range args {
		list = append(list, map[string]any{
			"name": a.GetName(), "title": a.GetTitle(), "description": a.GetDescription(), "required": a.GetRequired(),
		})
	}
	return digest.JSON(list)
}

// contentAnnotationsDigest digests resource or template annotations
// without lastModified: it dates the content, and a resource whose content
// changes is a new source revision, not a new contract. "" when there is
// nothing else.
func contentAnnotationsDigest(a *structpb.Struct) (string, error) {
	if a == nil {
		return "", nil
	}
	m := a.AsMap()
	delete(m, "lastModified")
	if len(m) == 0 {
		return "", nil
	}
	return digest.JSON(m)
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
			fieldExecutionDigest:    t.GetExecutionDigest(),
			fieldIconsDigest:        t.GetIconsDigest(),
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
			fieldAnnotationsDigest: r.GetAnnotationsDigest(),
			fieldIconsDigest:       r.GetIconsDigest(),
		})
	}
	templates := make([]any, 0, len(s.GetResourceTemplates()))
	for _, rt := range s.GetResourceTemplates() {
		templates = append(templates, templateKey(rt))
	}
	prompts := make([]any, 0, len(s.GetPrompts()))
	for _, p := range s.GetPrompts() {
		prompts = append(prompts, map[string]any{
			"name":                 p.GetName(),
			"title":                p.GetTitle(),
			fieldDescriptionDigest: p.GetDescriptionDigest(),
			fieldArgumentsDigest:   p.GetArgumentsDigest(),
			fieldIconsDigest:       p.GetIconsDigest(),
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
		"protocol_version":   s.GetProtocolVersion(),
		"tools":              tools,
		"resources":          resources,
		"resource_templates": templates,
		"prompts":            prompts,
	})
}

// templateKey is what identifies a resource template in the snapshot
// digest and in the digest of the templates a resource mapping matched.
func templateKey(rt *registryv1.ResourceTemplateIdentity) map[string]any {
	return map[string]any{
		"uri_template":         rt.GetUriTemplate(),
		"name":                 rt.GetName(),
		"title":                rt.GetTitle(),
		fieldMimeType:          rt.GetMimeType(),
		fieldDescriptionDigest: rt.GetDescriptionDigest(),
		fieldAnnotationsDigest: rt.GetAnnotationsDigest(),
		fieldIconsDigest:       rt.GetIconsDigest(),
	}
}

// targetDigests returns the digests of target's identity in snap beyond its
// input schema and description, or nil when snap does not list it. A
// mapping records them at proposal; driftReason compares them.
func targetDigests(snap *registryv1.DiscoverySnapshot, target *registryv1.RemoteTarget) *registryv1.TargetDigests {
	switch target.GetKind() {
	case registryv1.RemoteKind_REMOTE_KIND_TOOL:
		t := findTool(snap, target.GetName())
		if t == nil {
			return nil
		}
		return &registryv1.TargetDigests{
			TitleDigest:       t.GetTitleDigest(),
			AnnotationsDigest: t.GetAnnotationsDigest(),
			ExecutionDigest:   t.GetExecutionDigest(),
			IconsDigest:       t.GetIconsDigest(),
		}
	case registryv1.RemoteKind_REMOTE_KIND_RESOURCE:
		r := findResource(snap, target.GetName())
		if r == nil {
			return nil
		}
		return &registryv1.TargetDigests{
			TitleDigest:             r.GetTitleDigest(),
			AnnotationsDigest:       r.GetAnnotationsDigest(),
			IconsDigest:             r.GetIconsDigest(),
			MimeType:                r.GetMimeType(),
			ResourceTemplatesDigest: matchingTemplatesDigest(snap, r.GetUri()),
		}
	}
	return nil
}

// matchingTemplatesDigest digests the resource templates of snap whose URI
// template matches uri (RFC 6570), or "" when none does: a server that
// redescribes the family a resource belongs to changes what a reviewer
// judged about it. A template that does not parse matches nothing.
func matchingTemplatesDigest(snap *registryv1.DiscoverySnapshot, uri string) string {
	var matched []any
	for _, rt := range snap.GetResourceTemplates() {
		tmpl, err := uritemplate.New(rt.GetUriTemplate())
		if err != nil || !tmpl.Regexp().MatchString(uri) {
			continue
		}
		matched = append(matched, templateKey(rt))
	}
	if len(matched) == 0 {
		return ""
	}
	d, _ := digest.JSON(matched) // strings only: it cannot fail
	return d
}

// targetDigestChanges names the target digests that differ between what a
// mapping recorded and what a snapshot says now.
func targetDigestChanges(was, now *registryv1.TargetDigests) []string {
	var c []string
	for _, f := range []struct {
		name     string
		was, now string
	}{
		{fieldTitleDigest, was.GetTitleDigest(), now.GetTitleDigest()},
		{fieldAnnotationsDigest, was.GetAnnotationsDigest(), now.GetAnnotationsDigest()},
		{fieldExecutionDigest, was.GetExecutionDigest(), now.GetExecutionDigest()},
		{fieldIconsDigest, was.GetIconsDigest(), now.GetIconsDigest()},
		{fieldMimeType, was.GetMimeType(), now.GetMimeType()},
		{fieldResourceTemplatesDigest, was.GetResourceTemplatesDigest(), now.GetResourceTemplatesDigest()},
	} {
		if f.was != f.now {
			c = append(c, f.name)
		}
	}
	return c
}

// driftReason says why an active mapping no longer matches a snapshot of its
// connection, or "" when its target is unchanged. A mapping proposed before
// target digests were recorded is checked on its input schema and
// description only.
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
	if was := m.GetTargetDigests(); was != nil {
		changed = append(changed, targetDigestChanges(was, targetDigests(snap, m.GetTarget()))...)
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
	if err := s.requireRead(ctx, authz.SnapshotRead, "snapshot", req.GetId()); err != nil {
		return nil, err
	}
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
	if err := s.requireRead(ctx, authz.SnapshotRead, "snapshot", ""); err != nil {
		return nil, err
	}
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
	page, next, err := paging.Page(req, paging.Filter("connection_id", req.GetConnectionId()), snaps,
		func(s *registryv1.DiscoverySnapshot) string { return paging.TimeKey(s.GetRetrieveTime(), s.GetId()) })
	if err != nil {
		return nil, err
	}
	return &registryv1.ListSnapshotsResponse{Snapshots: page, NextPageToken: next}, nil
}

// DiffSnapshots says which tools, resources, resource templates and prompts
// were added, removed or changed between two snapshots, and which digests
// changed.
func (s *Server) DiffSnapshots(ctx context.Context, req *registryv1.DiffSnapshotsRequest) (*registryv1.SnapshotDiff, error) {
	if err := s.requireRead(ctx, authz.SnapshotRead, "snapshot", req.GetTargetSnapshotId()); err != nil {
		return nil, err
	}
	var v []apierror.FieldViolation
	if req.GetBaseSnapshotId() == "" {
		v = append(v, apierror.FieldViolation{Field: "base_snapshot_id", Description: "the older snapshot is required"})
	}
	if req.GetTargetSnapshotId() == "" {
		v = append(v, apierror.FieldViolation{Field: "target_snapshot_id", Description: "the newer snapshot is required"})
	}
	if len(v) > 0 {
		return nil, apierror.InvalidArgument(apierror.ReasonFieldRequired, "both snapshots are required", v...)
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
			return changes(
				change{fieldInputSchemaDigest, a.GetInputSchemaDigest(), b.GetInputSchemaDigest()},
				change{fieldOutputSchemaDigest, a.GetOutputSchemaDigest(), b.GetOutputSchemaDigest()},
				change{fieldAnnotationsDigest, a.GetAnnotationsDigest(), b.GetAnnotationsDigest()},
				change{fieldDescriptionDigest, a.GetDescriptionDigest(), b.GetDescriptionDigest()},
				titleChange(a.GetTitleDigest(), b.GetTitleDigest()),
				change{fieldExecutionDigest, a.GetExecutionDigest(), b.GetExecutionDigest()},
				change{fieldIconsDigest, a.GetIconsDigest(), b.GetIconsDigest()},
			)
		})
	d.Resources = diffItems(base.GetResources(), target.GetResources(), (*registryv1.ResourceIdentity).GetUri,
		func(a, b *registryv1.ResourceIdentity) []string {
			return changes(
				change{fieldDescriptionDigest, a.GetDescriptionDigest(), b.GetDescriptionDigest()},
				change{fieldMimeType, a.GetMimeType(), b.GetMimeType()},
				change{fieldName, a.GetName(), b.GetName()},
				titleChange(a.GetTitleDigest(), b.GetTitleDigest()),
				change{fieldAnnotationsDigest, a.GetAnnotationsDigest(), b.GetAnnotationsDigest()},
				change{fieldIconsDigest, a.GetIconsDigest(), b.GetIconsDigest()},
			)
		})
	d.ResourceTemplates = diffItems(base.GetResourceTemplates(), target.GetResourceTemplates(), (*registryv1.ResourceTemplateIdentity).GetUriTemplate,
		func(a, b *registryv1.ResourceTemplateIdentity) []string {
			return changes(
				change{fieldDescriptionDigest, a.GetDescriptionDigest(), b.GetDescriptionDigest()},
				change{fieldMimeType, a.GetMimeType(), b.GetMimeType()},
				change{fieldName, a.GetName(), b.GetName()},
				titleChange(a.GetTitleDigest(), b.GetTitleDigest()),
				change{fieldAnnotationsDigest, a.GetAnnotationsDigest(), b.GetAnnotationsDigest()},
				change{fieldIconsDigest, a.GetIconsDigest(), b.GetIconsDigest()},
			)
		})
	d.Prompts = diffItems(base.GetPrompts(), target.GetPrompts(), (*registryv1.PromptIdentity).GetName,
		func(a, b *registryv1.PromptIdentity) []string {
			return changes(
				change{fieldDescriptionDigest, a.GetDescriptionDigest(), b.GetDescriptionDigest()},
				titleChange(a.GetTitleDigest(), b.GetTitleDigest()),
				change{fieldArgumentsDigest, a.GetArgumentsDigest(), b.GetArgumentsDigest()},
				change{fieldIconsDigest, a.GetIconsDigest(), b.GetIconsDigest()},
			)
		})
	return d
}

// change is one compared field of an item in two snapshots.
type change struct{ name, base, target string }

// changes names the fields whose values differ, in the order given.
func changes(cs ...change) []string {
	var out []string
	for _, c := range cs {
		if c.base != c.target {
			out = append(out, c.name)
		}
	}
	return out
}

// titleChange compares title digests. A snapshot recorded before titles
// were digested has none; its titles are not reported as changed.
func titleChange(base, target string) change {
	if base == "" || target == "" {
		return change{name: fieldTitleDigest}
	}
	return change{fieldTitleDigest, base, target}
}

// Bounds of a SURFACE_CHANGED event's detail.
const (
	maxNamesPerChange = 5
	maxNameInDetail   = 128
)

// surfaceChange describes a snapshot diff for reviewers, or "" when
// nothing changed. It names items and digests only: remote descriptions
// and other free text never enter an event, and names are quoted and
// bounded.
func surfaceChange(d *registryv1.SnapshotDiff) string {
	var parts []string
	for _, k := range []struct {
		kind    string
		changes []*registryv1.ItemChange
	}{
		{"tools", d.GetTools()},
		{"resources", d.GetResources()},
		{"resource templates", d.GetResourceTemplates()},
		{"prompts", d.GetPrompts()},
	} {
		by := map[registryv1.ChangeKind][]string{}
		for _, c := range k.changes {
			name := strconv.Quote(truncateName(c.GetName()))
			if c.GetKind() == registryv1.ChangeKind_CHANGE_KIND_CHANGED {
				name += " (" + strings.Join(c.GetChangedDigests(), ", ") + ")"
			}
			by[c.GetKind()] = append(by[c.GetKind()], name)
		}
		for _, ck := range []struct {
			kind registryv1.ChangeKind
			verb string
		}{
			{registryv1.ChangeKind_CHANGE_KIND_ADDED, "added"},
			{registryv1.ChangeKind_CHANGE_KIND_REMOVED, "removed"},
			{registryv1.ChangeKind_CHANGE_KIND_CHANGED, "changed"},
		} {
			names := by[ck.kind]
			if len(names) == 0 {
				continue
			}
			more := ""
			if len(names) > maxNamesPerChange {
				more = fmt.Sprintf(" and %d more", len(names)-maxNamesPerChange)
				names = names[:maxNamesPerChange]
			}
			parts = append(parts, fmt.Sprintf("%s %s: %s%s", k.kind, ck.verb, strings.Join(names, ", "), more))
		}
	}
	if d.GetServerChanged() {
		parts = append(parts, "server info or protocol version changed")
	}
	if len(parts) == 0 {
		return ""
	}
	return fmt.Sprintf("snapshot %s differs from %s: %s; see DiffSnapshots", d.GetTargetSnapshotId(), d.GetBaseSnapshotId(), strings.Join(parts, "; "))
}

// truncateName bounds a remote name quoted in an event, on a rune boundary.
func truncateName(s string) string {
	if len(s) <= maxNameInDetail {
		return s
	}
	cut := maxNameInDetail
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
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
