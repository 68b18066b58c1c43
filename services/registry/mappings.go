package registry

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/authz"
	"github.com/v0m3/v0m3/internal/ids"
	"github.com/v0m3/v0m3/internal/paging"
	"github.com/v0m3/v0m3/internal/store"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// ProposeMapping proposes a binding of a capability onto one remote tool or
// resource observed in a snapshot of the connection at its current config
// revision. A new mapping starts at revision 1; a proposal naming
// mapping_id appends revision n+1 and retires revision n (kept as history).
// Either way the proposal is PENDING_REVIEW and serves nothing until
// reviewed.
func (s *Server) ProposeMapping(ctx context.Context, req *registryv1.ProposeMappingRequest) (*registryv1.Mapping, error) {
	proposer, err := s.authz.Require(ctx, authz.MappingPropose, authz.Resource{Type: "mapping", ID: req.GetMappingId()},
		map[string]string{"capability": req.GetCapability(), "connection_id": req.GetConnectionId()})
	if err != nil {
		return nil, err
	}
	if err := validateProposalShape(req); err != nil {
		return nil, err
	}
	cp, err := s.capability(ctx, req.GetCapability(), 0)
	if err != nil {
		return nil, err
	}
	if cp.GetState() == registryv1.DefinitionState_DEFINITION_STATE_DEPRECATED {
		return nil, capabilityDeprecated(cp)
	}
	limits := req.GetLimits()
	if limits == nil {
		// The capability's default limits are where a proposal starts.
		limits = cp.GetDefaultLimits()
	}
	if limits == nil {
		return nil, apierror.InvalidArgument("INVALID_MAPPING", "invalid mapping: limits are required: capability "+cp.GetName()+" declares no default_limits",
			apierror.FieldViolation{Field: "limits", Description: "limits are required: max_response_bytes and max_items"})
	}
	if id := req.GetMappingId(); id != "" {
		prev, err := s.getMapping(ctx, id, 0)
		if err != nil {
			return nil, err
		}
		if prev.GetCapability() != req.GetCapability() || prev.GetConnectionId() != req.GetConnectionId() {
			return nil, apierror.InvalidArgument("MAPPING_MISMATCH",
				fmt.Sprintf("mapping %s binds %s on connection %s; a revision cannot change its capability or connection, propose a new mapping instead",
					id, prev.GetCapability(), prev.GetConnectionId()),
				apierror.FieldViolation{Field: "mapping_id", Description: "must name a mapping of the same capability and connection"})
		}
	}
	snap, err := s.getSnapshot(ctx, req.GetSnapshotId())
	if err != nil {
		return nil, err
	}
	if snap.GetConnectionId() != req.GetConnectionId() {
		return nil, apierror.InvalidArgument("SNAPSHOT_CONNECTION_MISMATCH",
			fmt.Sprintf("snapshot %s was taken from connection %s, not %s", snap.GetId(), snap.GetConnectionId(), req.GetConnectionId()),
			apierror.FieldViolation{Field: "snapshot_id", Description: "must be a snapshot of connection " + req.GetConnectionId()})
	}
	m := &registryv1.Mapping{
		Capability:          cp.GetName(),
		CapabilityRevision:  cp.GetRevision(),
		ConnectionId:        req.GetConnectionId(),
		SnapshotId:          snap.GetId(),
		Target:              proto.CloneOf(req.GetTarget()),
		ArgumentMap:         cloneBindings(req.GetArgumentMap()),
		Defaults:            proto.CloneOf(req.GetDefaults()),
		Limits:              proto.CloneOf(limits),
		State:               registryv1.MappingState_MAPPING_STATE_PENDING_REVIEW,
		ProposedBy:          proposer.ID,
		IdempotencyKeyField: req.GetIdempotencyKeyField(),
		StatusTool:          req.GetStatusTool(),
	}
	var tool *registryv1.ToolIdentity
	switch req.GetTarget().GetKind() {
	case registryv1.RemoteKind_REMOTE_KIND_TOOL:
		if tool = findTool(snap, req.GetTarget().GetName()); tool == nil {
			return nil, targetUnknown("tool", req.GetTarget().GetName(), snap)
		}
		m.InputSchemaDigest = tool.GetInputSchemaDigest()
		m.DescriptionDigest = tool.GetDescriptionDigest()
		m.RemoteDescription = tool.GetDescription()
	case registryv1.RemoteKind_REMOTE_KIND_RESOURCE:
		r := findResource(snap, req.GetTarget().GetName())
		if r == nil {
			return nil, targetUnknown("resource", req.GetTarget().GetName(), snap)
		}
		m.DescriptionDigest = r.GetDescriptionDigest()
		m.RemoteDescription = r.GetDescription()
	}
	m.TargetDigests = targetDigests(snap, m.GetTarget())
	if st := req.GetStatusTool(); st != "" && findTool(snap, st) == nil {
		return nil, apierror.InvalidArgument("INVALID_MAPPING", fmt.Sprintf("status tool %q is not in snapshot %s", st, snap.GetId()),
			apierror.FieldViolation{Field: "status_tool", Description: "must name a tool of the snapshot"})
	}
	v := validateArgumentMap(req, cp, tool)
	v = append(v, taskOnly("target.name", tool)...)
	if st := req.GetStatusTool(); st != "" {
		v = append(v, taskOnly("status_tool", findTool(snap, st))...)
	}
	v = append(v, reviewResults(m, req, cp, tool)...)
	if len(v) > 0 {
		return nil, apierror.InvalidArgument("INVALID_MAPPING", "invalid mapping: "+violationText(v), v...)
	}

	err = s.updateConnection(ctx, req.GetConnectionId(), func(u *ConnectionUpdate) error {
		c := u.Connection
		if c.GetState() == registryv1.ConnectionState_CONNECTION_STATE_RETIRED {
			return connectionRetired(c)
		}
		// The contract validated against must still be current: a
		// concurrent revision or deprecation makes this proposal stale.
		latestCap, err := u.Capability(cp.GetName())
		if errors.Is(err, store.ErrNotFound) {
			return capabilityUnknown(cp.GetName(), 0)
		}
		if err != nil {
			return err
		}
		if latestCap.GetRevision() != cp.GetRevision() || latestCap.GetState() != cp.GetState() {
			return apierror.New(codes.Aborted, "CAPABILITY_REVISED",
				fmt.Sprintf("capability %s changed to revision %d while the mapping was proposed; propose again against the current contract", cp.GetName(), latestCap.GetRevision()),
				map[string]string{"capability": cp.GetName()})
		}
		if snap.GetConfigRevision() != c.GetConfigRevision() {
			return snapshotStale(snap, fmt.Sprintf("snapshot %s was taken at config revision %d but connection %s is at revision %d; discover again and propose against the new snapshot",
				snap.GetId(), snap.GetConfigRevision(), c.GetId(), c.GetConfigRevision()))
		}
		if latest := u.LatestSnapshot; latest != nil && latest.GetId() != snap.GetId() {
			if why := driftReason(m, latest); why != "" {
				return snapshotStale(snap, fmt.Sprintf("the target changed since snapshot %s: %s; propose against snapshot %s", snap.GetId(), why, latest.GetId()))
			}
		}
		now := s.timestamp()
		m.ConfigRevision = c.GetConfigRevision()
		m.CreateTime = now
		if id := req.GetMappingId(); id != "" {
			prev := u.Mapping(id)
			if prev == nil {
				return mappingUnknown(id, 0)
			}
			m.Id, m.Revision = id, prev.GetRevision()+1
			if prev.GetState() != registryv1.MappingState_MAPPING_STATE_RETIRED {
				prev.StateReason = fmt.Sprintf("superseded by revision %d proposed by %s (was %s: %s)",
					m.GetRevision(), proposer.ID, stateName(prev.GetState()), prev.GetStateReason())
				prev.State = registryv1.MappingState_MAPPING_STATE_RETIRED
				u.WriteMappings = append(u.WriteMappings, prev)
				u.Events = append(u.Events, s.event(registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_MAPPING_RETIRED, c.GetId(), id, "",
					fmt.Sprintf("revision %d %s", prev.GetRevision(), prev.GetStateReason())))
			}
		} else {
			m.Id, m.Revision = ids.New("map"), 1
		}
		m.StateReason = "proposed by " + proposer.ID
		u.WriteMappings = append(u.WriteMappings, m)
		u.Events = append(u.Events, s.event(registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_MAPPING_PROPOSED, c.GetId(), m.GetId(), snap.GetId(),
			fmt.Sprintf("revision %d of %s onto %s %q proposed by %s", m.GetRevision(), m.GetCapability(), kindName(m.GetTarget().GetKind()), m.GetTarget().GetName(), m.GetProposedBy())))
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.log.InfoContext(ctx, "mapping proposed", "mapping_id", m.GetId(), "revision", m.GetRevision(), "capability", m.GetCapability(), "connection_id", m.GetConnectionId())
	return m, nil
}

func validateProposalShape(req *registryv1.ProposeMappingRequest) error {
	var v []apierror.FieldViolation
	add := func(field, desc string) { v = append(v, apierror.FieldViolation{Field: field, Description: desc}) }
	if req.GetCapability() == "" {
		add("capability", "the capability name is required")
	}
	if req.GetConnectionId() == "" {
		add("connection_id", "the connection implementing the capability is required")
	}
	if req.GetSnapshotId() == "" {
		add("snapshot_id", "the snapshot the target was observed in is required")
	}
	switch k := req.GetTarget().GetKind(); {
	case req.GetTarget() == nil:
		add("target", "the remote tool or resource is required")
	case k != registryv1.RemoteKind_REMOTE_KIND_TOOL && k != registryv1.RemoteKind_REMOTE_KIND_RESOURCE:
		add("target.kind", "must be REMOTE_KIND_TOOL or REMOTE_KIND_RESOURCE")
	}
	if req.GetTarget() != nil && req.GetTarget().GetName() == "" {
		add("target.name", "the tool name or resource URI is required")
	}
	if l := req.GetLimits(); l != nil {
		// Without limits the capability's default limits apply.
		lv := &violations{}
		limitViolations(lv, "INVALID_MAPPING", "limits", l)
		v = append(v, lv.list...)
	}
	v = append(v, bindingShapeViolations(req.GetArgumentMap())...)
	if len(v) > 0 {
		return apierror.InvalidArgument("INVALID_MAPPING", "invalid mapping: "+violationText(v), v...)
	}
	return nil
}

// ReviewMapping approves or rejects the current revision of a mapping.
// Approval makes it ACTIVE and retires any other active mapping of the same
// capability on the same connection; it is refused when the evidence
// reviewed is stale, so a review of yesterday's tool never activates
// today's.
func (s *Server) ReviewMapping(ctx context.Context, req *registryv1.ReviewMappingRequest) (*registryv1.Mapping, error) {
	var v []apierror.FieldViolation
	if req.GetMappingId() == "" {
		v = append(v, apierror.FieldViolation{Field: "mapping_id", Description: "the mapping to review is required"})
	}
	if req.GetRevision() <= 0 {
		v = append(v, apierror.FieldViolation{Field: "revision", Description: "the revision you reviewed (>= 1) is required"})
	}
	if len(v) > 0 {
		return nil, apierror.InvalidArgument("INVALID_REVIEW", "invalid review: "+violationText(v), v...)
	}
	cur, err := s.getMapping(ctx, req.GetMappingId(), 0)
	if err != nil {
		return nil, err
	}
	// The revision reviewed must be the current one (checked again below);
	// its proposer is who separation of duties compares the reviewer with.
	reviewer, err := s.authz.Require(ctx, authz.MappingReview, authz.Resource{Type: "mapping", ID: cur.GetId()},
		map[string]string{"proposed_by": cur.GetProposedBy(), "capability": cur.GetCapability(), "connection_id": cur.GetConnectionId()})
	if err != nil {
		return nil, err
	}
	var out *registryv1.Mapping
	err = s.updateConnection(ctx, cur.GetConnectionId(), func(u *ConnectionUpdate) error {
		m := u.Mapping(req.GetMappingId())
		if m == nil {
			return mappingUnknown(req.GetMappingId(), 0)
		}
		if m.GetRevision() != req.GetRevision() {
			return apierror.New(codes.Aborted, "MAPPING_REVISION_CONFLICT",
				fmt.Sprintf("mapping %s is at revision %d, not %d; review the current revision", m.GetId(), m.GetRevision(), req.GetRevision()),
				mappingMeta(m))
		}
		if m.GetState() != registryv1.MappingState_MAPPING_STATE_PENDING_REVIEW {
			return apierror.New(codes.FailedPrecondition, "MAPPING_NOT_PENDING_REVIEW",
				fmt.Sprintf("mapping %s revision %d is %s, only a pending proposal can be reviewed; propose a new revision", m.GetId(), m.GetRevision(), stateName(m.GetState())),
				mappingMeta(m))
		}
		now := s.timestamp()
		if m.GetProposedBy() != cur.GetProposedBy() {
			return apierror.New(codes.Aborted, "MAPPING_REVISION_CONFLICT",
				fmt.Sprintf("mapping %s changed while it was reviewed; review the current revision", m.GetId()), mappingMeta(m))
		}
		m.ReviewedBy, m.ReviewNote, m.ReviewTime = reviewer.ID, req.GetNote(), now
		if !req.GetApprove() {
			m.State = registryv1.MappingState_MAPPING_STATE_RETIRED
			m.StateReason = "rejected by " + reviewer.ID
			u.WriteMappings = append(u.WriteMappings, m)
			u.Events = append(u.Events, s.event(registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_MAPPING_RETIRED, m.GetConnectionId(), m.GetId(), "",
				fmt.Sprintf("revision %d %s", m.GetRevision(), m.GetStateReason())))
			out = m
			return nil
		}
		cp, err := u.Capability(m.GetCapability())
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		if why := staleness(m, u, cp); why != "" {
			return apierror.New(codes.FailedPrecondition, "MAPPING_STALE",
				fmt.Sprintf("mapping %s revision %d cannot be approved: %s; propose a new revision against the latest snapshot", m.GetId(), m.GetRevision(), why),
				mappingMeta(m))
		}
		m.State = registryv1.MappingState_MAPPING_STATE_ACTIVE
		m.StateReason = "approved by " + reviewer.ID
		u.WriteMappings = append(u.WriteMappings, m)
		u.Events = append(u.Events, s.event(registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_MAPPING_ACTIVATED, m.GetConnectionId(), m.GetId(), m.GetSnapshotId(),
			fmt.Sprintf("revision %d of %s activated by %s", m.GetRevision(), m.GetCapability(), reviewer.ID)))
		for _, o := range u.Mappings {
			if o.GetId() == m.GetId() || o.GetCapability() != m.GetCapability() || o.GetState() != registryv1.MappingState_MAPPING_STATE_ACTIVE {
				continue
			}
			o.State = registryv1.MappingState_MAPPING_STATE_RETIRED
			o.StateReason = fmt.Sprintf("superseded by mapping %s revision %d", m.GetId(), m.GetRevision())
			u.WriteMappings = append(u.WriteMappings, o)
			u.Events = append(u.Events, s.event(registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_MAPPING_RETIRED, o.GetConnectionId(), o.GetId(), "", o.GetStateReason()))
		}
		out = m
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.log.InfoContext(ctx, "mapping reviewed", "mapping_id", out.GetId(), "revision", out.GetRevision(), "state", stateName(out.GetState()))
	return out, nil
}

// staleness says why a mapping's reviewed evidence no longer describes the
// connection or its capability (cp, the current revision; nil if absent),
// or "".
func staleness(m *registryv1.Mapping, u *ConnectionUpdate, cp *registryv1.Capability) string {
	c := u.Connection
	if c.GetState() == registryv1.ConnectionState_CONNECTION_STATE_RETIRED {
		return "connection " + c.GetId() + " is retired"
	}
	if m.GetConfigRevision() != c.GetConfigRevision() {
		return fmt.Sprintf("it was proposed at config revision %d and the connection is at revision %d", m.GetConfigRevision(), c.GetConfigRevision())
	}
	if cp == nil || cp.GetRevision() != m.GetCapabilityRevision() {
		return fmt.Sprintf("capability %s revision %d is no longer current", m.GetCapability(), m.GetCapabilityRevision())
	}
	if cp.GetState() == registryv1.DefinitionState_DEFINITION_STATE_DEPRECATED {
		return fmt.Sprintf("capability %s is deprecated", m.GetCapability())
	}
	if u.LatestSnapshot == nil {
		return "the connection has no discovery snapshot"
	}
	return driftReason(m, u.LatestSnapshot)
}

// GetMapping returns one mapping at its current revision, or at a past
// revision kept as history.
func (s *Server) GetMapping(ctx context.Context, req *registryv1.GetMappingRequest) (*registryv1.Mapping, error) {
	if err := s.requireRead(ctx, authz.MappingRead, "mapping", req.GetId()); err != nil {
		return nil, err
	}
	if req.GetId() == "" {
		return nil, required("id", "the mapping id, e.g. map_...")
	}
	if req.GetRevision() < 0 {
		return nil, apierror.InvalidArgument(apierror.ReasonFieldInvalid, "revision must be >= 0 (0 means current)",
			apierror.FieldViolation{Field: "revision", Description: "must be >= 0"})
	}
	return s.getMapping(ctx, req.GetId(), req.GetRevision())
}

func (s *Server) getMapping(ctx context.Context, id string, revision int64) (*registryv1.Mapping, error) {
	m, err := s.st.GetMapping(ctx, id, revision)
	if err != nil {
		return nil, s.storeError(ctx, err, "get mapping", func() error { return mappingUnknown(id, revision) })
	}
	return m, nil
}

// ListMappings returns mappings at their current revision, filtered by
// capability, connection and state, sorted by capability then id.
func (s *Server) ListMappings(ctx context.Context, req *registryv1.ListMappingsRequest) (*registryv1.ListMappingsResponse, error) {
	if err := s.requireRead(ctx, authz.MappingRead, "mapping", ""); err != nil {
		return nil, err
	}
	all, err := s.st.ListMappings(ctx)
	if err != nil {
		return nil, s.storeError(ctx, err, "list mappings", nil)
	}
	out := slices.DeleteFunc(all, func(m *registryv1.Mapping) bool {
		return (req.GetCapability() != "" && m.GetCapability() != req.GetCapability()) ||
			(req.GetConnectionId() != "" && m.GetConnectionId() != req.GetConnectionId()) ||
			(req.GetState() != registryv1.MappingState_MAPPING_STATE_UNSPECIFIED && m.GetState() != req.GetState())
	})
	page, next, err := paging.Page(req, paging.Filter("capability", req.GetCapability(), "connection_id", req.GetConnectionId(), "state", req.GetState().String()),
		out, func(m *registryv1.Mapping) string { return m.GetCapability() + "\x00" + m.GetId() })
	if err != nil {
		return nil, err
	}
	return &registryv1.ListMappingsResponse{Mappings: page, NextPageToken: next}, nil
}

// ResolveMapping answers "is this still current?": it returns the active
// mapping for a capability, or checks that a given mapping revision is the
// active one. Anything else fails with FAILED_PRECONDITION and a reason
// saying why (MAPPING_REVIEW_REQUIRED, MAPPING_PENDING_REVIEW,
// MAPPING_RETIRED, MAPPING_SUPERSEDED, MAPPING_NOT_ACTIVE).
func (s *Server) ResolveMapping(ctx context.Context, req *registryv1.ResolveMappingRequest) (*registryv1.Mapping, error) {
	if req.GetMappingId() == "" {
		return s.resolveByCapability(ctx, req)
	}
	if err := validRevision(req.GetRevision()); err != nil {
		return nil, err
	}
	m, err := s.getMapping(ctx, req.GetMappingId(), 0)
	if err != nil {
		return nil, err
	}
	if err := mappingCurrent(m, req); err != nil {
		return nil, err
	}
	cp, err := s.capability(ctx, m.GetCapability(), 0)
	if err != nil {
		return nil, err
	}
	if err := contractCurrent(m, cp); err != nil {
		return nil, err
	}
	return m, nil
}

// validRevision refuses a negative mapping revision (0 means current).
func validRevision(r int64) error {
	if r < 0 {
		return apierror.InvalidArgument(apierror.ReasonFieldInvalid, "revision must be >= 0",
			apierror.FieldViolation{Field: "revision", Description: "must be >= 0"})
	}
	return nil
}

// mappingCurrent checks that m, read at its current revision, is what req
// names and holds, and is usable: the answer to "is this still current?"
// short of the capability's contract (contractCurrent).
func mappingCurrent(m *registryv1.Mapping, req *registryv1.ResolveMappingRequest) error {
	if c := req.GetCapability(); c != "" && c != m.GetCapability() {
		return apierror.InvalidArgument("MAPPING_CAPABILITY_MISMATCH",
			fmt.Sprintf("mapping %s implements %s, not %s", m.GetId(), m.GetCapability(), c),
			apierror.FieldViolation{Field: "capability", Description: "must be the mapping's capability " + m.GetCapability()})
	}
	if c := req.GetConnectionId(); c != "" && c != m.GetConnectionId() {
		return apierror.InvalidArgument("MAPPING_CONNECTION_MISMATCH",
			fmt.Sprintf("mapping %s is on connection %s, not %s", m.GetId(), m.GetConnectionId(), c),
			apierror.FieldViolation{Field: "connection_id", Description: "must be the mapping's connection " + m.GetConnectionId()})
	}
	if r := req.GetRevision(); r != 0 && r != m.GetRevision() {
		meta := mappingMeta(m)
		meta["revision"] = strconv.FormatInt(r, 10)
		meta["current_revision"] = strconv.FormatInt(m.GetRevision(), 10)
		return apierror.New(codes.FailedPrecondition, "MAPPING_SUPERSEDED",
			fmt.Sprintf("mapping %s revision %d was superseded by revision %d (%s)", m.GetId(), r, m.GetRevision(), stateName(m.GetState())), meta)
	}
	return usable(m)
}

// ResolveExecution is ResolveMapping for a mapping the caller holds, with
// the connection it runs on read in the same call: the governed call's
// one registry round trip before it is authorized. The mapping, the
// capability's current contract and the connection are read together, in
// one store read, once the mapping's connection is known (a mapping's
// connection never changes; the server keeps it once read).
func (s *Server) ResolveExecution(ctx context.Context, req *registryv1.ResolveExecutionRequest) (*registryv1.ResolvedExecution, error) {
	if req.GetMappingId() == "" {
		return nil, required("mapping_id", "the mapping the call was offered, e.g. map_...")
	}
	if err := validRevision(req.GetRevision()); err != nil {
		return nil, err
	}
	connID, _ := s.mappingConnections.Get(req.GetMappingId())
	x, err := s.st.ReadExecution(ctx, req.GetMappingId(), req.GetCapability(), connID)
	if err != nil {
		return nil, s.storeError(ctx, err, "read execution", nil)
	}
	m := x.Mapping
	if m == nil {
		return nil, mappingUnknown(req.GetMappingId(), 0)
	}
	s.mappingConnections.Add(m.GetId(), m.GetConnectionId())
	if err := mappingCurrent(m, &registryv1.ResolveMappingRequest{Capability: req.GetCapability(), MappingId: m.GetId(), Revision: req.GetRevision()}); err != nil {
		return nil, err
	}
	// A part read under another name (a caller naming no capability) is
	// read again by the mapping's.
	cp := x.Capability
	if cp.GetName() != m.GetCapability() {
		if cp, err = s.capability(ctx, m.GetCapability(), 0); err != nil {
			return nil, err
		}
	}
	if err := contractCurrent(m, cp); err != nil {
		return nil, err
	}
	c := x.Connection
	if c.GetId() != m.GetConnectionId() {
		if c, err = s.getConnection(ctx, m.GetConnectionId()); err != nil {
			return nil, err
		}
	} else {
		withServing(c)
	}
	return &registryv1.ResolvedExecution{Mapping: m, Connection: c}, nil
}

// contractCurrent refuses an active mapping reviewed against a capability
// revision that is no longer current. A capability revision moves its
// active mappings to review in the same transaction, so this holds
// already; checking it here keeps "is this still current?" answered from
// the contract itself, not only from the state it left.
func contractCurrent(m *registryv1.Mapping, cp *registryv1.Capability) error {
	if m.GetCapabilityRevision() == cp.GetRevision() {
		return nil
	}
	meta := mappingMeta(m)
	meta["capability_revision"] = strconv.FormatInt(m.GetCapabilityRevision(), 10)
	meta["current_capability_revision"] = strconv.FormatInt(cp.GetRevision(), 10)
	return apierror.New(codes.FailedPrecondition, "MAPPING_REVIEW_REQUIRED",
		fmt.Sprintf("mapping %s revision %d was reviewed against capability %s revision %d, and revision %d is current; review it again",
			m.GetId(), m.GetRevision(), m.GetCapability(), m.GetCapabilityRevision(), cp.GetRevision()), meta)
}

func (s *Server) resolveByCapability(ctx context.Context, req *registryv1.ResolveMappingRequest) (*registryv1.Mapping, error) {
	if req.GetCapability() == "" {
		return nil, required("capability", "the capability to resolve, or mapping_id to check one mapping")
	}
	cp, err := s.capability(ctx, req.GetCapability(), 0)
	if err != nil {
		return nil, err
	}
	list, err := paging.Collect(ctx, func(ctx context.Context, tok string) ([]*registryv1.Mapping, string, error) {
		r, err := s.ListMappings(ctx, &registryv1.ListMappingsRequest{Capability: req.GetCapability(), ConnectionId: req.GetConnectionId(), PageSize: paging.MaxSize, PageToken: tok})
		return r.GetMappings(), r.GetNextPageToken(), err
	})
	if err != nil {
		return nil, err
	}
	var active []*registryv1.Mapping
	var review *registryv1.Mapping
	for _, m := range list {
		switch m.GetState() {
		case registryv1.MappingState_MAPPING_STATE_ACTIVE:
			active = append(active, m)
		case registryv1.MappingState_MAPPING_STATE_REVIEW_REQUIRED:
			review = m
		}
	}
	where := ""
	if req.GetConnectionId() != "" {
		where = " on connection " + req.GetConnectionId()
	}
	switch {
	case len(active) == 1:
		if err := contractCurrent(active[0], cp); err != nil {
			return nil, err
		}
		return active[0], nil
	case len(active) > 1:
		idsList := make([]string, 0, len(active))
		for _, m := range active {
			idsList = append(idsList, m.GetId())
		}
		return nil, apierror.New(codes.FailedPrecondition, "MAPPING_AMBIGUOUS",
			fmt.Sprintf("capability %s has active mappings on several connections (%s); name the connection or the mapping", req.GetCapability(), strings.Join(idsList, ", ")),
			map[string]string{"capability": req.GetCapability(), "mapping_ids": strings.Join(idsList, ",")})
	case review != nil:
		return nil, usable(review)
	}
	return nil, apierror.New(codes.FailedPrecondition, "MAPPING_NOT_ACTIVE",
		fmt.Sprintf("capability %s has no active mapping%s; propose and review one", req.GetCapability(), where),
		map[string]string{"capability": req.GetCapability(), "connection_id": req.GetConnectionId()})
}

// usable returns nil for an active mapping and otherwise the error saying
// why it cannot serve.
func usable(m *registryv1.Mapping) error {
	meta := mappingMeta(m)
	switch m.GetState() {
	case registryv1.MappingState_MAPPING_STATE_ACTIVE:
		return nil
	case registryv1.MappingState_MAPPING_STATE_REVIEW_REQUIRED:
		return apierror.New(codes.FailedPrecondition, "MAPPING_REVIEW_REQUIRED",
			fmt.Sprintf("mapping %s revision %d needs review: %s", m.GetId(), m.GetRevision(), m.GetStateReason()), meta)
	case registryv1.MappingState_MAPPING_STATE_PENDING_REVIEW:
		return apierror.New(codes.FailedPrecondition, "MAPPING_PENDING_REVIEW",
			fmt.Sprintf("mapping %s revision %d is proposed and not yet reviewed", m.GetId(), m.GetRevision()), meta)
	case registryv1.MappingState_MAPPING_STATE_RETIRED:
		return apierror.New(codes.FailedPrecondition, "MAPPING_RETIRED",
			fmt.Sprintf("mapping %s revision %d is retired: %s", m.GetId(), m.GetRevision(), m.GetStateReason()), meta)
	}
	return apierror.New(codes.FailedPrecondition, "MAPPING_NOT_ACTIVE",
		fmt.Sprintf("mapping %s revision %d is not active", m.GetId(), m.GetRevision()), meta)
}

func mappingMeta(m *registryv1.Mapping) map[string]string {
	return map[string]string{
		"mapping_id": m.GetId(),
		"revision":   strconv.FormatInt(m.GetRevision(), 10),
		"capability": m.GetCapability(),
	}
}

func mappingUnknown(id string, revision int64) error {
	if revision != 0 {
		return apierror.New(codes.NotFound, "MAPPING_REVISION_UNKNOWN",
			fmt.Sprintf("mapping %q has no revision %d", id, revision),
			map[string]string{"mapping_id": id, "revision": strconv.FormatInt(revision, 10)})
	}
	return apierror.New(codes.NotFound, "MAPPING_UNKNOWN", fmt.Sprintf("mapping %q does not exist", id), map[string]string{"mapping_id": id})
}

func snapshotStale(snap *registryv1.DiscoverySnapshot, msg string) error {
	return apierror.New(codes.FailedPrecondition, "SNAPSHOT_STALE", msg,
		map[string]string{"snapshot_id": snap.GetId(), "connection_id": snap.GetConnectionId()})
}

// taskOnly refuses a tool the server runs only as an MCP task
// (execution.taskSupport "required", MCP 2025-11-25): the adapter calls
// tools with a plain tools/call, which such a server refuses every time,
// so a mapping onto it could only fail (and spend budget) once active.
func taskOnly(field string, tool *registryv1.ToolIdentity) []apierror.FieldViolation {
	if tool.GetExecution().GetFields()["taskSupport"].GetStringValue() != "required" {
		return nil
	}
	return []apierror.FieldViolation{{Field: field, Description: fmt.Sprintf(
		"tool %q runs only as an MCP task (execution.taskSupport \"required\"), and V0M3 calls tools without task augmentation: the server would refuse every call; map a tool it lets clients call directly", tool.GetName())}}
}

func targetUnknown(kind, name string, snap *registryv1.DiscoverySnapshot) error {
	return apierror.InvalidArgument("REMOTE_TARGET_UNKNOWN",
		fmt.Sprintf("%s %q is not in snapshot %s", kind, name, snap.GetId()),
		apierror.FieldViolation{Field: "target.name", Description: fmt.Sprintf("must name a %s listed in snapshot %s", kind, snap.GetId())})
}

func cloneBindings(in []*registryv1.ArgumentBinding) []*registryv1.ArgumentBinding {
	out := make([]*registryv1.ArgumentBinding, 0, len(in))
	for _, b := range in {
		out = append(out, proto.CloneOf(b))
	}
	return out
}

func stateName(s registryv1.MappingState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "MAPPING_STATE_"))
}

func kindName(k registryv1.RemoteKind) string {
	return strings.ToLower(strings.TrimPrefix(k.String(), "REMOTE_KIND_"))
}
