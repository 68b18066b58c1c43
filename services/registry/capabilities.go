package registry

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/authz"
	"github.com/v0m3/v0m3/internal/digest"
	"github.com/v0m3/v0m3/internal/handlekind"
	"github.com/v0m3/v0m3/internal/paging"
	"github.com/v0m3/v0m3/internal/productschema"
	"github.com/v0m3/v0m3/internal/store"
	"github.com/v0m3/v0m3/internal/summary"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// namePattern is a capability or task profile name: lower snake case.
// Names are product vocabulary: a remote tool never gets to redefine a
// capability by choosing a persuasive name.
var namePattern = regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)

// Reasons a declaration is refused (beside the schema's, in schema.go).
const (
	reasonInvalidName           = "INVALID_NAME"
	reasonInvalidCapability     = "INVALID_CAPABILITY"
	reasonInvalidHandles        = "INVALID_HANDLES"
	reasonExternalEffect        = "EXTERNAL_EFFECT_REQUIREMENTS"
	reasonInvalidTemplate       = "INVALID_SUMMARY_TEMPLATE"
	reasonInvalidLimits         = "INVALID_LIMITS"
	reasonRevisionConflict      = "REVISION_CONFLICT"
	reasonCapabilityExists      = "CAPABILITY_EXISTS"
	reasonCapabilityDeprecated  = "CAPABILITY_DEPRECATED"
	reasonInvalidDeprecation    = "INVALID_DEPRECATION"
	reasonCapabilityRevisionNot = "CAPABILITY_REVISION_UNKNOWN"
)

// violations collects field violations; the first reason found is the
// error's reason, every violation is listed.
type violations struct {
	reason string
	list   []apierror.FieldViolation
}

func (v *violations) add(reason, field, desc string) {
	if v.reason == "" {
		v.reason = reason
	}
	v.list = append(v.list, apierror.FieldViolation{Field: field, Description: desc})
}

func (v *violations) err(what string) error {
	if len(v.list) == 0 {
		return nil
	}
	return apierror.InvalidArgument(v.reason, "invalid "+what+": "+violationText(v.list), v.list...)
}

func checkName(v *violations, field, name, example string) {
	switch {
	case name == "":
		v.add(reasonInvalidName, field, "a name is required, lower snake case, e.g. "+example)
	case len(name) < 3 || len(name) > 64 || !namePattern.MatchString(name):
		v.add(reasonInvalidName, field, fmt.Sprintf("%q is not a name: lower snake case (a-z, 0-9, single underscores between words), 3 to 64 characters, e.g. %s", name, example))
	}
}

// limitViolations checks limits as every mapping needs them.
func limitViolations(v *violations, reason, field string, l *registryv1.Limits) {
	if l.GetMaxResponseBytes() <= 0 {
		v.add(reason, field+".max_response_bytes", "must be > 0")
	}
	if l.GetMaxItems() <= 0 {
		v.add(reason, field+".max_items", "must be > 0")
	}
	if !knownEnum(registryv1.ElicitationPolicy_name, l.GetElicitation()) {
		v.add(reason, field+".elicitation", "unknown elicitation policy; use ELICITATION_POLICY_DECLINE or ELICITATION_POLICY_ACCEPT_DEFAULTS")
	}
}

func knownEnum[E ~int32](names map[int32]string, e E) bool {
	_, ok := names[int32(e)]
	return ok
}

// validateCapability checks a declared contract and returns the contract
// to store: output-only fields cleared, local references of the input
// schema resolved and its digest computed.
func validateCapability(in *registryv1.Capability) (*registryv1.Capability, error) {
	if in == nil {
		return nil, required("capability", "the capability contract is required")
	}
	c := contractOf(in)
	v := &violations{}
	checkName(v, "capability.name", c.GetName(), "retrieve_authorized_source")
	if strings.TrimSpace(c.GetDescription()) == "" {
		v.add(reasonInvalidCapability, "capability.description", "the local description the model sees is required")
	}
	switch ec := c.GetEffectClass(); {
	case ec == registryv1.EffectClass_EFFECT_CLASS_UNSPECIFIED:
		v.add(reasonInvalidCapability, "capability.effect_class", "required: EFFECT_CLASS_RETRIEVAL, EFFECT_CLASS_LOCAL_TRANSFORMATION or EFFECT_CLASS_EXTERNAL_EFFECT")
	case !knownEnum(registryv1.EffectClass_name, ec):
		v.add(reasonInvalidCapability, "capability.effect_class", fmt.Sprintf("unknown effect class %d", ec))
	}
	switch rr := c.GetRetryRule(); {
	case rr == registryv1.RetryRule_RETRY_RULE_UNSPECIFIED:
		v.add(reasonInvalidCapability, "capability.retry_rule", "required: RETRY_RULE_RETRY, RETRY_RULE_CHECK_RECEIPT or RETRY_RULE_NEVER_BLIND")
	case !knownEnum(registryv1.RetryRule_name, rr):
		v.add(reasonInvalidCapability, "capability.retry_rule", fmt.Sprintf("unknown retry rule %d", rr))
	}
	if !knownEnum(registryv1.ResultKind_name, c.GetResultKind()) {
		v.add(reasonInvalidCapability, "capability.result_kind", fmt.Sprintf("unknown result kind %d", c.GetResultKind()))
	}
	if !knownEnum(registryv1.ApprovalRequirement_name, c.GetApproval()) {
		v.add(reasonInvalidCapability, "capability.approval", fmt.Sprintf("unknown approval requirement %d", c.GetApproval()))
	}

	var (
		props       map[string]*structpb.Value
		schemaOK    bool
		unsupported error
	)
	switch {
	case c.GetInputSchema() == nil:
		v.add(reasonInvalidSchema, "capability.input_schema", `the product input schema is required: a JSON Schema with "type": "object"`)
	default:
		resolved, serr := resolveSchema(c.GetInputSchema())
		if serr != nil {
			v.add(serr.reason, "capability.input_schema", serr.Error())
			break
		}
		d, err := digest.Struct(resolved)
		if err != nil {
			v.add(reasonInvalidSchema, "capability.input_schema", err.Error())
			break
		}
		c.InputSchema, c.InputSchemaDigest = resolved, d
		props, schemaOK = schemaProperties(resolved), true
		// The orchestrator enforces arguments by this subset only: a
		// keyword outside it is refused now, not at the first request.
		if _, err := productschema.Parse(resolved); err != nil {
			unsupported = err
			v.add(reasonUnsupportedSchemaKeyword, "capability.input_schema", err.Error()+
				"; a product input schema may use: type object, properties of type string, integer, number or boolean, required, additionalProperties, minLength, maxLength, minimum, maximum, enum, and documentation (title, description, examples, format)")
		}
	}

	// Handles, the summary template and the effect's requirements are
	// checked against the resolved schema; without one they cannot be.
	seen := map[string]bool{}
	for i, h := range c.GetHandles() {
		at := fmt.Sprintf("capability.handles[%d]", i)
		switch f := h.GetField(); {
		case f == "":
			v.add(reasonInvalidHandles, at+".field", "the product field carrying the handle is required")
		case seen[f]:
			v.add(reasonInvalidHandles, at+".field", fmt.Sprintf("field %q is listed twice", f))
		case schemaOK && !isStringProperty(props[f]):
			v.add(reasonInvalidHandles, at+".field", fmt.Sprintf("field %q must be a property of type \"string\" of the input schema (properties: %s)", f, fieldList(props)))
		}
		seen[h.GetField()] = true
		if strings.TrimSpace(h.GetRefersTo()) == "" {
			v.add(reasonInvalidHandles, at+".refers_to", `what the handle names is required, e.g. "source"`)
		}
		if !handlekind.Known(h.GetKind()) {
			v.add(reasonInvalidHandles, at+".kind", "unknown handle kind: HANDLE_KIND_SOURCE, HANDLE_KIND_ARTIFACT or HANDLE_KIND_DESTINATION")
		}
	}
	if c.GetEffectClass() == registryv1.EffectClass_EFFECT_CLASS_EXTERNAL_EFFECT {
		if !c.GetIdempotencyRequired() {
			v.add(reasonExternalEffect, "capability.idempotency_required", "an external effect must be recoverable: set idempotency_required: true")
		}
		if c.GetApproval() == registryv1.ApprovalRequirement_APPROVAL_REQUIREMENT_POLICY {
			v.add(reasonExternalEffect, "capability.approval", "an external effect always needs a person's approval: APPROVAL_REQUIREMENT_ALWAYS (or leave it unset)")
		}
	}
	if t := c.GetSummaryTemplate(); t != "" {
		fields, err := summary.Fields(t)
		switch {
		case err != nil:
			v.add(reasonInvalidTemplate, "capability.summary_template", err.Error())
		case schemaOK:
			for _, f := range fields {
				if _, ok := props[f]; !ok {
					v.add(reasonInvalidTemplate, "capability.summary_template", fmt.Sprintf("placeholder {%s} is not a property of the input schema (properties: %s)", f, fieldList(props)))
				}
			}
		}
	}
	if l := c.GetDefaultLimits(); l != nil {
		limitViolations(v, reasonInvalidLimits, "capability.default_limits", l)
	}
	if err := v.err("capability"); err != nil {
		var ue *productschema.UnsupportedError
		if errors.As(unsupported, &ue) {
			kv := []string{"keyword", ue.Keyword}
			if ue.Property != "" {
				kv = append(kv, "property", ue.Property)
			}
			err = apierror.WithMetadata(err, "", kv...)
		}
		return nil, err
	}
	return c, nil
}

func isStringProperty(p *structpb.Value) bool {
	return p.GetStructValue().GetFields()["type"].GetStringValue() == "string"
}

// contractOf returns a copy of c without its output-only fields: what a
// caller declares.
func contractOf(c *registryv1.Capability) *registryv1.Capability {
	out := proto.CloneOf(c)
	out.Revision, out.State, out.InputSchemaDigest = 0, registryv1.DefinitionState_DEFINITION_STATE_UNSPECIFIED, ""
	out.CreateTime, out.CreatedBy, out.DeprecationReason = nil, "", ""
	return out
}

// sameContract says whether two capabilities declare the same contract.
// Who manages a definition is informational, not part of it.
func sameContract(a, b *registryv1.Capability) bool {
	x, y := contractOf(a), contractOf(b)
	x.ManagedBy, y.ManagedBy = "", ""
	return proto.Equal(x, y)
}

// CreateCapability declares a new capability at revision 1.
func (s *Server) CreateCapability(ctx context.Context, req *registryv1.CreateCapabilityRequest) (*registryv1.Capability, error) {
	creator, err := s.authz.Require(ctx, authz.CapabilityWrite, authz.Resource{Type: "capability", ID: req.GetCapability().GetName()}, nil)
	if err != nil {
		return nil, err
	}
	c, err := validateCapability(req.GetCapability())
	if err != nil {
		return nil, err
	}
	return s.createCapability(ctx, c, actor(creator))
}

// createCapability stores a validated contract as revision 1.
func (s *Server) createCapability(ctx context.Context, c *registryv1.Capability, by string) (*registryv1.Capability, error) {
	c = s.stamp(c, by)
	ev := s.definitionEvent(registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_CAPABILITY_REVISED, c.GetName(),
		fmt.Sprintf("capability %s declared at revision 1 by %s (input schema %s)", c.GetName(), by, c.GetInputSchemaDigest()))
	if err := s.st.CreateCapability(ctx, c, []*registryv1.RegistryEvent{ev}); err != nil {
		if errors.Is(err, store.ErrExists) {
			return nil, apierror.New(codes.AlreadyExists, reasonCapabilityExists,
				fmt.Sprintf("capability %s already exists; declare a new revision with UpdateCapability", c.GetName()),
				map[string]string{"capability": c.GetName()})
		}
		return nil, s.storeError(ctx, err, "create capability", nil)
	}
	s.notify()
	s.log.InfoContext(ctx, "capability declared", "capability", c.GetName(), "revision", 1, "created_by", by, "input_schema_digest", c.GetInputSchemaDigest())
	return c, nil
}

// UpdateCapability declares a new revision of a capability, unless the
// contract is the current one, and moves every active mapping of it to
// REVIEW_REQUIRED in the same transaction.
func (s *Server) UpdateCapability(ctx context.Context, req *registryv1.UpdateCapabilityRequest) (*registryv1.Capability, error) {
	name := req.GetCapability().GetName()
	caller, err := s.authz.Require(ctx, authz.CapabilityWrite, authz.Resource{Type: "capability", ID: name}, nil)
	if err != nil {
		return nil, err
	}
	if req.GetExpectedRevision() < 0 {
		return nil, apierror.InvalidArgument(apierror.ReasonFieldInvalid, "expected_revision must be >= 0 (0: whatever is current)",
			apierror.FieldViolation{Field: "expected_revision", Description: "must be >= 0"})
	}
	next, err := validateCapability(req.GetCapability())
	if err != nil {
		return nil, err
	}
	by := actor(caller)
	var out *registryv1.Capability
	var moved int
	err = s.st.UpdateCapability(ctx, name, func(u *CapabilityUpdate) error {
		cur := u.Current
		moved = 0
		if r := req.GetExpectedRevision(); r != 0 && r != cur.GetRevision() {
			return revisionConflict("capability", name, r, cur.GetRevision())
		}
		active := cur.GetState() == registryv1.DefinitionState_DEFINITION_STATE_ACTIVE
		if active && sameContract(cur, next) {
			out = cur
			if cur.GetManagedBy() != next.GetManagedBy() {
				// Only who manages it changed: not a new contract, so
				// nothing goes to review.
				out = proto.CloneOf(cur)
				out.ManagedBy = next.GetManagedBy()
				u.Write = out
				u.Events = append(u.Events, s.definitionEvent(registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_CAPABILITY_REVISED, name,
					fmt.Sprintf("capability %s revision %d is now managed by %q (contract unchanged)", name, cur.GetRevision(), out.GetManagedBy())))
			}
			return nil
		}
		n := proto.CloneOf(next)
		n.Revision, n.State, n.CreateTime, n.CreatedBy = cur.GetRevision()+1, registryv1.DefinitionState_DEFINITION_STATE_ACTIVE, s.timestamp(), by
		u.Write, out = n, n
		why := fmt.Sprintf("capability %s was revised to revision %d by %s; review the mapping against the new contract", name, n.GetRevision(), by)
		var review []*registryv1.RegistryEvent
		for _, m := range u.Mappings {
			if m.GetState() != registryv1.MappingState_MAPPING_STATE_ACTIVE {
				continue
			}
			m.State, m.StateReason = registryv1.MappingState_MAPPING_STATE_REVIEW_REQUIRED, why
			u.WriteMappings = append(u.WriteMappings, m)
			ev := s.event(registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_MAPPING_REVIEW_REQUIRED, m.GetConnectionId(), m.GetId(), "",
				fmt.Sprintf("revision %d needs review: %s", m.GetRevision(), why))
			ev.Definition = name
			review = append(review, ev)
			moved++
		}
		detail := fmt.Sprintf("capability %s revised to revision %d by %s (input schema %s); %d active mapping(s) sent to review", name, n.GetRevision(), by, n.GetInputSchemaDigest(), moved)
		if !active {
			detail += "; no longer deprecated"
		}
		u.Events = append([]*registryv1.RegistryEvent{s.definitionEvent(registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_CAPABILITY_REVISED, name, detail)}, review...)
		return nil
	})
	if err != nil {
		return nil, s.storeError(ctx, err, "update capability", func() error { return capabilityUnknown(name, 0) })
	}
	s.notify()
	s.log.InfoContext(ctx, "capability updated", "capability", name, "revision", out.GetRevision(), "by", by, "mappings_to_review", moved)
	return out, nil
}

// DeprecateCapability stops a capability from being offered to new tasks
// and from new mappings. Deprecating a deprecated capability changes
// nothing.
func (s *Server) DeprecateCapability(ctx context.Context, req *registryv1.DeprecateCapabilityRequest) (*registryv1.Capability, error) {
	name := req.GetName()
	caller, err := s.authz.Require(ctx, authz.CapabilityWrite, authz.Resource{Type: "capability", ID: name}, nil)
	if err != nil {
		return nil, err
	}
	if err := deprecationViolations(req.GetName(), req.GetReason(), req.GetExpectedRevision()); err != nil {
		return nil, err
	}
	by := actor(caller)
	var out *registryv1.Capability
	err = s.st.UpdateCapability(ctx, name, func(u *CapabilityUpdate) error {
		out = u.Current
		if r := req.GetExpectedRevision(); r != 0 && r != out.GetRevision() {
			return revisionConflict("capability", name, r, out.GetRevision())
		}
		if out.GetState() == registryv1.DefinitionState_DEFINITION_STATE_DEPRECATED {
			return nil
		}
		out = proto.CloneOf(u.Current)
		out.State, out.DeprecationReason = registryv1.DefinitionState_DEFINITION_STATE_DEPRECATED, req.GetReason()
		u.Write = out
		u.Events = []*registryv1.RegistryEvent{s.definitionEvent(registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_CAPABILITY_DEPRECATED, name,
			fmt.Sprintf("capability %s revision %d deprecated by %s: %s", name, out.GetRevision(), by, req.GetReason()))}
		return nil
	})
	if err != nil {
		return nil, s.storeError(ctx, err, "deprecate capability", func() error { return capabilityUnknown(name, 0) })
	}
	s.notify()
	s.log.InfoContext(ctx, "capability deprecated", "capability", name, "revision", out.GetRevision(), "by", by)
	return out, nil
}

func deprecationViolations(name, reason string, expectedRevision int64) error {
	v := &violations{}
	if name == "" {
		v.add(reasonInvalidDeprecation, "name", "the name to deprecate is required")
	}
	if strings.TrimSpace(reason) == "" {
		v.add(reasonInvalidDeprecation, "reason", "say why, for reviewers and task owners")
	}
	if expectedRevision < 0 {
		v.add(reasonInvalidDeprecation, "expected_revision", "must be >= 0 (0: whatever is current)")
	}
	return v.err("deprecation")
}

// GetCapability returns a capability at its current or a past revision.
func (s *Server) GetCapability(ctx context.Context, req *registryv1.GetCapabilityRequest) (*registryv1.Capability, error) {
	if err := s.requireRead(ctx, authz.CapabilityRead, "capability", req.GetName()); err != nil {
		return nil, err
	}
	if req.GetName() == "" {
		return nil, apierror.InvalidArgument(apierror.ReasonFieldRequired, "name is required",
			apierror.FieldViolation{Field: "name", Description: "the capability name, e.g. retrieve_authorized_source"})
	}
	if req.GetRevision() < 0 {
		return nil, apierror.InvalidArgument(apierror.ReasonFieldInvalid, "revision must be >= 0 (0 means current)",
			apierror.FieldViolation{Field: "revision", Description: "must be >= 0"})
	}
	return s.capability(ctx, req.GetName(), req.GetRevision())
}

// capability reads a capability from the store; absent is NOT_FOUND.
func (s *Server) capability(ctx context.Context, name string, revision int64) (*registryv1.Capability, error) {
	c, err := s.st.GetCapability(ctx, name, revision)
	if err != nil {
		return nil, s.storeError(ctx, err, "get capability", func() error { return capabilityUnknown(name, revision) })
	}
	return c, nil
}

// ListCapabilities returns capabilities at their current revisions, sorted
// by name; deprecated ones only when asked for.
func (s *Server) ListCapabilities(ctx context.Context, req *registryv1.ListCapabilitiesRequest) (*registryv1.ListCapabilitiesResponse, error) {
	if err := s.requireRead(ctx, authz.CapabilityRead, "capability", ""); err != nil {
		return nil, err
	}
	all, err := s.st.ListCapabilities(ctx)
	if err != nil {
		return nil, s.storeError(ctx, err, "list capabilities", nil)
	}
	out := slices.DeleteFunc(all, func(c *registryv1.Capability) bool {
		return !req.GetShowDeprecated() && c.GetState() == registryv1.DefinitionState_DEFINITION_STATE_DEPRECATED
	})
	page, next, err := paging.Page(req, paging.Filter("show_deprecated", strconv.FormatBool(req.GetShowDeprecated())), out,
		func(c *registryv1.Capability) string { return c.GetName() })
	if err != nil {
		return nil, err
	}
	return &registryv1.ListCapabilitiesResponse{Capabilities: page, NextPageToken: next}, nil
}

func capabilityUnknown(name string, revision int64) error {
	if revision != 0 {
		return apierror.New(codes.NotFound, reasonCapabilityRevisionNot,
			fmt.Sprintf("capability %q has no revision %d", name, revision),
			map[string]string{"capability": name, "revision": strconv.FormatInt(revision, 10)})
	}
	return apierror.New(codes.NotFound, "CAPABILITY_UNKNOWN",
		fmt.Sprintf("capability %q is not declared; declare it with CreateCapability (v0m3 capability apply) or a Capability resource", name),
		map[string]string{"capability": name})
}

func capabilityDeprecated(c *registryv1.Capability) error {
	return apierror.New(codes.FailedPrecondition, reasonCapabilityDeprecated,
		fmt.Sprintf("capability %s is deprecated (%s); update it to use it again", c.GetName(), c.GetDeprecationReason()),
		map[string]string{"capability": c.GetName(), "revision": strconv.FormatInt(c.GetRevision(), 10)})
}

func revisionConflict(kind, name string, expected, current int64) error {
	return apierror.New(codes.Aborted, reasonRevisionConflict,
		fmt.Sprintf("%s %s is at revision %d, not %d; read it again and apply your change to the current revision", kind, name, current, expected),
		map[string]string{kind: name, "expected_revision": strconv.FormatInt(expected, 10), "current_revision": strconv.FormatInt(current, 10)})
}

// definitionEvent builds an event about a capability or task profile.
func (s *Server) definitionEvent(t registryv1.RegistryEventType, name, detail string) *registryv1.RegistryEvent {
	ev := s.event(t, "", "", "", detail)
	ev.Definition = name
	return ev
}

// handleFieldNames returns the product fields of a capability that carry
// handles.
func handleFieldNames(c *registryv1.Capability) []string {
	out := make([]string, 0, len(c.GetHandles()))
	for _, h := range c.GetHandles() {
		out = append(out, h.GetField())
	}
	return out
}

// schemaProperties returns the "properties" object of a JSON Schema, or nil.
func schemaProperties(schema *structpb.Struct) map[string]*structpb.Value {
	return schema.GetFields()["properties"].GetStructValue().GetFields()
}

// fieldList names a schema's fields for an error message, sorted.
func fieldList[V any](m map[string]V) string {
	if len(m) == 0 {
		return "none"
	}
	return strings.Join(slices.Sorted(maps.Keys(m)), ", ")
}
