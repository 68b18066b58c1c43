package orchestrator

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/identity"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// Cedar actions a task's requested scope is authorized with: each entry,
// for the requester and (when a product service starts the task for a
// user) the actor, on resource "<kind>:<uri>" (V0M3::Resource, whose id
// attribute is the URI). Handles are bound to the task's scope, so the
// scope must be what these people may read or reach, not what they asked.
const (
	sourceRead       = "source.read"
	artifactUse      = "artifact.use"
	destinationReach = "destination.reach"
)

// scopeChecks bounds the policy questions one StartTask asks at once.
const scopeChecks = 8

// scopeQuestion is one entry of a requested scope asked for one principal.
type scopeQuestion struct {
	field, action, kind, uri string
	principal                *policyv1.Principal
}

// authorizeScope asks policy whether the requester, and the actor (the
// caller) of a delegated start, may use every entry of the requested
// scope, and refuses the first entry (in request order) either may not:
// PERMISSION_DENIED SCOPE_NOT_AUTHORIZED naming the entry as a field
// violation. It runs before anything is stored.
func (s *Server) authorizeScope(ctx context.Context, req *orchestratorv1.StartTaskRequest, profile *registryv1.TaskProfile, requester *policyv1.Principal, actor string) error {
	c, err := caller(ctx)
	if err != nil {
		return err
	}
	// A V0M3 service is no principal of these policies (see authz.Check).
	var principals []*policyv1.Principal
	if c.Kind != identity.KindService || actor != "" {
		principals = append(principals, requester)
	}
	if actor != "" && c.Kind != identity.KindService {
		principals = append(principals, &policyv1.Principal{Id: c.ID, Groups: c.Groups})
	}
	var qs []scopeQuestion
	for _, sc := range []struct {
		field, action, kind string
		refs                []*orchestratorv1.SourceRef
	}{
		{"source_scope", sourceRead, "source", req.GetSourceScope()},
		{"artifact_scope", artifactUse, "artifact", req.GetArtifactScope()},
		{"destination_scope", destinationReach, "destination", req.GetDestinationScope()},
	} {
		for i, ref := range sc.refs {
			for _, p := range principals {
				qs = append(qs, scopeQuestion{field: fmt.Sprintf("%s[%d].uri", sc.field, i), action: sc.action, kind: sc.kind, uri: ref.GetUri(), principal: p})
			}
		}
	}
	if len(qs) == 0 {
		return nil
	}
	if s.authz == nil {
		return apierror.New(codes.FailedPrecondition, "AUTHORIZATION_NOT_CONFIGURED",
			"no policy service is configured to decide which sources, artifacts and destinations a task may use", nil)
	}
	attrs := map[string]string{"requester": requester.GetId(), "actor": actor, "purpose": profilePurpose(profile), "profile": profile.GetName()}
	answers := make([]*policyv1.AuthorizeResponse, len(qs))
	errs := make([]error, len(qs))
	var (
		wg  sync.WaitGroup
		sem = make(chan struct{}, scopeChecks)
	)
	for i, q := range qs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			answers[i], errs[i] = s.authz(ctx, &policyv1.AuthorizeActionRequest{
				Principal: q.principal, Action: q.action, ResourceType: q.kind, ResourceId: q.uri, Attributes: attrs,
			})
		})
	}
	wg.Wait()
	for i, q := range qs {
		if errs[i] != nil {
			return apierror.Propagate(errs[i], "authorize "+q.action)
		}
		if a := answers[i]; a.GetDecision() != policyv1.Decision_DECISION_ALLOW {
			s.log.InfoContext(ctx, "task scope refused", "principal", q.principal.GetId(), "action", q.action, "field", q.field,
				"policy_ids", a.GetReasons(), "policy_revision", a.GetPolicyRevision())
			return scopeRefused(q, a)
		}
	}
	return nil
}

// scopeRefused is the refusal of one scope entry.
func scopeRefused(q scopeQuestion, a *policyv1.AuthorizeResponse) error {
	verb := map[string]string{sourceRead: "read", artifactUse: "use", destinationReach: "reach"}[q.action]
	why := "no policy grants " + q.action + " on it; ask a policy administrator to scope it to one of your groups"
	if len(a.GetReasons()) > 0 {
		why = "refused by policy " + strings.Join(a.GetReasons(), ", ")
	}
	msg := fmt.Sprintf("%s may not %s %s %s (%s): %s", q.principal.GetId(), verb, q.kind, apierror.Truncate(q.uri, 256), q.field, why)
	err := apierror.New(codes.PermissionDenied, "SCOPE_NOT_AUTHORIZED", msg, map[string]string{
		"field": q.field, "action": q.action, "principal": q.principal.GetId(),
		"policy_reason": a.GetRefusalReason(), "policy_ids": strings.Join(a.GetReasons(), ","), "policy_revision": a.GetPolicyRevision(),
	})
	return apierror.WithFieldViolations(err, apierror.FieldViolation{Field: q.field, Description: "not authorized for " + q.principal.GetId()})
}
