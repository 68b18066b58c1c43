package policy

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	cedar "github.com/cedar-policy/cedar-go"
	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// Cedar entity types of the V0M3 authorization model.
const (
	typeUser       cedar.EntityType = "V0M3::User"
	typeGroup      cedar.EntityType = "V0M3::Group"
	typeAction     cedar.EntityType = "V0M3::Action"
	typeConnection cedar.EntityType = "V0M3::Connection"
	typeSource     cedar.EntityType = "V0M3::Source"
)

// effectClassName is the effect class as policies see it in
// context.effect_class.
func effectClassName(e registryv1.EffectClass) string {
	switch e {
	case registryv1.EffectClass_EFFECT_CLASS_RETRIEVAL:
		return "retrieval"
	case registryv1.EffectClass_EFFECT_CLASS_LOCAL_TRANSFORMATION:
		return "local_transformation"
	case registryv1.EffectClass_EFFECT_CLASS_EXTERNAL_EFFECT:
		return "external_effect"
	default:
		return "unspecified"
	}
}

// query is one authorization question.
type query struct {
	principal  *policyv1.Principal
	capability string
	// connectionID is the connection the resource belongs to.
	connectionID string
	// target, when set, makes the resource V0M3::Source::"<target>" in the
	// connection. It is never logged.
	target  string
	taskID  string
	purpose string
	effect  registryv1.EffectClass
	// approval is the capability's declared approval requirement.
	approval        registryv1.ApprovalRequirement
	mappingID       string
	mappingRevision int64
}

// decide evaluates q against the policy in force and logs the decision.
// It never fails: an evaluation error in one policy makes that policy not
// apply (Cedar's semantics) and is logged.
func (s *Server) decide(ctx context.Context, q query) *policyv1.AuthorizeResponse {
	pol := s.policy.Load()

	entities := cedar.EntityMap{}
	user := principalEntity(entities, q.principal)

	conn := cedar.NewEntityUID(typeConnection, cedar.String(q.connectionID))
	entities[conn] = cedar.Entity{UID: conn}
	resource := conn
	resourceKind := "connection"
	if q.target != "" {
		resource = cedar.NewEntityUID(typeSource, cedar.String(q.target))
		entities[resource] = cedar.Entity{UID: resource, Parents: cedar.NewEntityUIDSet(conn)}
		resourceKind = "source"
	}

	req := cedar.Request{
		Principal: user,
		Action:    cedar.NewEntityUID(typeAction, cedar.String(q.capability)),
		Resource:  resource,
		Context: cedar.NewRecord(cedar.RecordMap{
			"purpose":          cedar.String(q.purpose),
			"effect_class":     cedar.String(effectClassName(q.effect)),
			"task_id":          cedar.String(q.taskID),
			"mapping_revision": cedar.Long(q.mappingRevision),
		}),
	}
	dec, diag := cedar.Authorize(pol.set, entities, req)

	resp := &policyv1.AuthorizeResponse{
		Decision:         policyv1.Decision_DECISION_DENY,
		PolicyRevision:   pol.revision,
		ApprovalRequired: approvalAlways(q.effect, q.approval),
	}
	if dec == cedar.Allow {
		resp.Decision = policyv1.Decision_DECISION_ALLOW
	}
	for _, r := range diag.Reasons {
		resp.Reasons = append(resp.Reasons, string(r.PolicyID))
		// Otherwise workspace policy decides: a permit annotated
		// @approval("required") asks for a person.
		if dec == cedar.Allow && pol.approval[r.PolicyID] {
			resp.ApprovalRequired = true
		}
	}
	slices.Sort(resp.Reasons)

	for _, e := range diag.Errors {
		s.log.WarnContext(ctx, "policy evaluation error; the policy did not apply",
			"policy_id", string(e.PolicyID), "line", e.Position.Line, "column", e.Position.Column,
			"error", e.Message, "capability", q.capability, "policy_revision", pol.revision)
	}
	// An allow is the hot path's common case: Debug keeps a default
	// deployment quiet; a deny is worth a line.
	lvl := slog.LevelDebug
	if resp.Decision != policyv1.Decision_DECISION_ALLOW {
		lvl = slog.LevelInfo
	}
	s.log.Log(ctx, lvl, "policy decision",
		"capability", q.capability,
		"decision", decisionName(resp.Decision),
		"policy_ids", resp.Reasons,
		"policy_revision", pol.revision,
		"approval_required", resp.ApprovalRequired,
		"requester", q.principal.GetId(),
		"task_id", q.taskID,
		"purpose", q.purpose,
		"effect_class", effectClassName(q.effect),
		"approval", approvalName(q.approval),
		"connection_id", q.connectionID,
		"resource_kind", resourceKind,
		"mapping_id", q.mappingID,
		"mapping_revision", q.mappingRevision,
	)
	return resp
}

// approvalAlways reports whether every request for a capability needs a
// person's approval, whatever the Cedar policy says: when its contract
// declares APPROVAL_REQUIREMENT_ALWAYS, and for every effect outside V0M3
// (and an unspecified effect class, treated as the most dangerous one)
// whatever the contract declares. Otherwise (POLICY, or nothing declared)
// the permitting Cedar policies decide.
func approvalAlways(effect registryv1.EffectClass, approval registryv1.ApprovalRequirement) bool {
	switch effect {
	case registryv1.EffectClass_EFFECT_CLASS_EXTERNAL_EFFECT, registryv1.EffectClass_EFFECT_CLASS_UNSPECIFIED:
		return true
	}
	return approval == registryv1.ApprovalRequirement_APPROVAL_REQUIREMENT_ALWAYS
}

// approvalName is an approval requirement as logs show it, e.g. "always".
func approvalName(a registryv1.ApprovalRequirement) string {
	return strings.ToLower(strings.TrimPrefix(a.String(), "APPROVAL_REQUIREMENT_"))
}

func decisionName(d policyv1.Decision) string {
	return strings.ToLower(strings.TrimPrefix(d.String(), "DECISION_"))
}

// Authorize evaluates the current policy for one request. The effect class
// is the registry's, never the caller's: a request claiming a milder class
// than the capability's contract fails. With a mapping id, the resource is
// the mapping's connection, or a source target inside it.
func (s *Server) Authorize(ctx context.Context, req *policyv1.AuthorizeRequest) (*policyv1.AuthorizeResponse, error) {
	var bad []apierror.FieldViolation
	if req.GetPrincipal().GetId() == "" {
		bad = append(bad, apierror.FieldViolation{Field: "principal.id", Description: "required"})
	}
	if req.GetCapability() == "" {
		bad = append(bad, apierror.FieldViolation{Field: "capability", Description: "required"})
	}
	if req.GetResource() == "" {
		bad = append(bad, apierror.FieldViolation{Field: "resource", Description: "required"})
	}
	if req.GetMappingRevision() < 0 {
		bad = append(bad, apierror.FieldViolation{Field: "mapping_revision", Description: "must not be negative"})
	}
	if len(bad) > 0 {
		return nil, apierror.InvalidArgument(apierror.ReasonFieldInvalid, "the authorization request is incomplete", bad...)
	}

	c, err := s.capability(ctx, req.GetCapability(), req.GetEffectClass())
	if err != nil {
		return nil, err
	}
	q := query{
		principal:       req.GetPrincipal(),
		capability:      req.GetCapability(),
		connectionID:    req.GetResource(),
		taskID:          req.GetTaskId(),
		purpose:         req.GetPurpose(),
		effect:          c.GetEffectClass(),
		approval:        c.GetApproval(),
		mappingID:       req.GetMappingId(),
		mappingRevision: req.GetMappingRevision(),
	}
	if req.GetMappingId() != "" {
		m, err := s.mapping(ctx, req.GetMappingId(), req.GetCapability())
		if err != nil {
			return nil, err
		}
		q.connectionID = m.connectionID
		if req.GetResource() != m.connectionID {
			q.target = req.GetResource()
		}
	}
	return s.decide(ctx, q), nil
}

// capability returns the capability's current contract from the registry:
// its effect class and approval requirement decide, never the caller's. A
// caller that names a different effect class is refused rather than
// trusted.
func (s *Server) capability(ctx context.Context, capability string, claimed registryv1.EffectClass) (*registryv1.Capability, error) {
	return s.capabilityAt(ctx, capability, 0, claimed)
}

// capabilityAt is capability for a caller that knows the current revision
// from an authoritative read (0 when it does not): the contract at a
// revision never changes, so it is read from the cache.
func (s *Server) capabilityAt(ctx context.Context, capability string, revision int64, claimed registryv1.EffectClass) (*registryv1.Capability, error) {
	var (
		c   *registryv1.Capability
		err error
	)
	if revision > 0 {
		c, err = s.caps.Get(ctx, s.deps.Registry, capability, revision)
	} else {
		c, err = s.deps.Registry.GetCapability(ctx, &registryv1.GetCapabilityRequest{Name: capability})
	}
	if err != nil {
		return nil, apierror.Propagate(err, "policy: look up capability")
	}
	if claimed != registryv1.EffectClass_EFFECT_CLASS_UNSPECIFIED && claimed != c.GetEffectClass() {
		return nil, apierror.New(codes.FailedPrecondition, "EFFECT_CLASS_MISMATCH",
			fmt.Sprintf("capability %s has effect class %s, not %s; the registry's contract decides", capability,
				effectClassName(c.GetEffectClass()), effectClassName(claimed)),
			map[string]string{"capability": capability, "effect_class": effectClassName(c.GetEffectClass())})
	}
	return c, nil
}
