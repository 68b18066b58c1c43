package policy

import (
	"context"
	"maps"
	"slices"
	"strings"

	cedar "github.com/cedar-policy/cedar-go"
	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/authz"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
)

// Cedar entity type of resources of administrative and product actions
// (V0M3::Resource::"<type>:<id>").
const typeResource cedar.EntityType = "V0M3::Resource"

// refusalNoGrant is the reason of a refusal no forbid policy named: nothing
// permits the action.
const refusalNoGrant = "ROLE_NOT_GRANTED"

// AuthorizeAction decides whether an authenticated principal may take an
// administrative or product action. The principal entity carries its id as
// principal.id, so policies can compare it with context attributes such as
// context.proposed_by (separation of duties).
func (s *Server) AuthorizeAction(ctx context.Context, req *policyv1.AuthorizeActionRequest) (*policyv1.AuthorizeResponse, error) {
	var bad []apierror.FieldViolation
	if req.GetPrincipal().GetId() == "" {
		bad = append(bad, apierror.FieldViolation{Field: "principal.id", Description: "required"})
	}
	if !strings.Contains(req.GetAction(), ".") {
		// Dotted names keep these actions apart from capability names, so
		// a capability's permit never grants an administrative action.
		bad = append(bad, apierror.FieldViolation{Field: "action", Description: "an administrative or product action, e.g. mapping.review"})
	}
	if req.GetResourceType() == "" {
		bad = append(bad, apierror.FieldViolation{Field: "resource_type", Description: "required"})
	}
	if len(bad) > 0 {
		return nil, apierror.InvalidArgument(apierror.ReasonFieldInvalid, "the authorization request is incomplete", bad...)
	}
	pol := s.policy.Load()
	entities := cedar.EntityMap{}
	user := principalEntity(entities, req.GetPrincipal())
	resource := cedar.NewEntityUID(typeResource, cedar.String(req.GetResourceType()+":"+req.GetResourceId()))
	entities[resource] = cedar.Entity{UID: resource, Attributes: cedar.NewRecord(cedar.RecordMap{
		"type": cedar.String(req.GetResourceType()),
		"id":   cedar.String(req.GetResourceId()),
	})}
	attrs := cedar.RecordMap{}
	for _, k := range slices.Sorted(maps.Keys(req.GetAttributes())) {
		attrs[cedar.String(k)] = cedar.String(req.GetAttributes()[k])
	}
	dec, diag := cedar.Authorize(pol.set, entities, cedar.Request{
		Principal: user,
		Action:    cedar.NewEntityUID(typeAction, cedar.String(req.GetAction())),
		Resource:  resource,
		Context:   cedar.NewRecord(attrs),
	})
	resp := &policyv1.AuthorizeResponse{Decision: policyv1.Decision_DECISION_DENY, PolicyRevision: pol.revision}
	if dec == cedar.Allow {
		resp.Decision = policyv1.Decision_DECISION_ALLOW
	}
	for _, r := range diag.Reasons {
		resp.Reasons = append(resp.Reasons, string(r.PolicyID))
		if dec == cedar.Deny && resp.RefusalReason == "" {
			resp.RefusalReason = pol.refusal[r.PolicyID]
		}
	}
	slices.Sort(resp.Reasons)
	if dec == cedar.Deny && resp.RefusalReason == "" {
		resp.RefusalReason = refusalNoGrant
	}
	for _, e := range diag.Errors {
		s.log.WarnContext(ctx, "policy evaluation error; the policy did not apply",
			"policy_id", string(e.PolicyID), "error", e.Message, "action", req.GetAction(), "policy_revision", pol.revision)
	}
	s.log.InfoContext(ctx, "action decision", "principal", req.GetPrincipal().GetId(), "action", req.GetAction(),
		"resource_type", req.GetResourceType(), "resource_id", req.GetResourceId(),
		"decision", decisionName(resp.Decision), "policy_ids", resp.Reasons, "policy_revision", pol.revision)
	return resp, nil
}

// principalEntity adds the principal and its groups to entities and
// returns its uid. The entity's "id" attribute lets policies compare the
// principal with ids in the context.
func principalEntity(entities cedar.EntityMap, p *policyv1.Principal) cedar.EntityUID {
	groups := make([]cedar.EntityUID, 0, len(p.GetGroups()))
	for _, g := range p.GetGroups() {
		uid := cedar.NewEntityUID(typeGroup, cedar.String(g))
		groups = append(groups, uid)
		entities[uid] = cedar.Entity{UID: uid}
	}
	user := cedar.NewEntityUID(typeUser, cedar.String(p.GetId()))
	entities[user] = cedar.Entity{UID: user, Parents: cedar.NewEntityUIDSet(groups...),
		Attributes: cedar.NewRecord(cedar.RecordMap{"id": cedar.String(p.GetId())})}
	return user
}

// ReloadPolicy re-reads the policy file now.
func (s *Server) ReloadPolicy(ctx context.Context, _ *policyv1.ReloadPolicyRequest) (*policyv1.PolicyRevision, error) {
	if _, err := authz.Decider(s.AuthorizeAction).Require(ctx, authz.PolicyReload, authz.Resource{Type: "policy"}, nil); err != nil {
		return nil, err
	}
	if err := s.Reload(ctx); err != nil {
		if pe, ok := asParseError(err); ok {
			return nil, apierror.New(codes.FailedPrecondition, "POLICY_INVALID", pe.Error(), map[string]string{"file": pe.File})
		}
		return nil, apierror.Propagate(err, "policy: reload")
	}
	return s.GetPolicyRevision(ctx, nil)
}
