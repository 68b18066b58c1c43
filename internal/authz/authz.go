// Package authz asks the policy service whether the authenticated caller
// of an RPC may take an administrative or product action (create a
// connection, review a mapping, approve a request, read a trace, act for a
// user). Who holds which role, delegation and separation of duties are
// Cedar policy; this package only carries the question and turns a "no"
// into the one refusal every service returns.
package authz

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/identity"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
)

// Actions a caller can be granted: the Cedar action ids
// (V0M3::Action::"<id>") of the default policy.
const (
	ConnectionCreate   = "connection.create"
	ConnectionUpdate   = "connection.update"
	ConnectionRetire   = "connection.retire"
	ConnectionReview   = "connection.review"
	ConnectionDiscover = "connection.discover"
	MappingPropose     = "mapping.propose"
	MappingReview      = "mapping.review"
	CapabilityWrite    = "capability.write"
	ProfileWrite       = "profile.write"
	RequestApprove     = "request.approve"
	RequestDeny        = "request.deny"
	RequestSettle      = "request.settle"
	TaskActFor         = "task.act_for"
	TaskRead           = "task.read"
	TraceRead          = "trace.read"
	AuditRead          = "audit.read"
	EvidencePrune      = "evidence.prune"
	PolicyReload       = "policy.reload"
	// ClaimLink links a claim to an observation of a task's evidence.
	ClaimLink = "claim.link"

	// Reads of registry records, authorized like writes: a connection's
	// configuration (command, arguments, environment, owner, reviewer,
	// credential reference) and its config revisions and events are
	// reconnaissance to an attacker.
	ConnectionRead = "connection.read"
	SnapshotRead   = "snapshot.read"
	MappingRead    = "mapping.read"
	// CapabilityRead and ProfileRead read the declared product contracts
	// (capabilities and task profiles) products start tasks with.
	CapabilityRead = "capability.read"
	ProfileRead    = "profile.read"
)

// Decider evaluates one action question (the policy service's
// AuthorizeAction, remote or in process).
type Decider func(ctx context.Context, req *policyv1.AuthorizeActionRequest) (*policyv1.AuthorizeResponse, error)

// Remote returns a Decider asking the policy service over gRPC; nil for a
// nil client.
func Remote(c policyv1.PolicyServiceClient) Decider {
	if c == nil {
		return nil
	}
	return func(ctx context.Context, req *policyv1.AuthorizeActionRequest) (*policyv1.AuthorizeResponse, error) {
		return c.AuthorizeAction(ctx, req)
	}
}

// Resource is what an action acts on.
type Resource struct {
	// Type, e.g. "mapping".
	Type string
	// ID, "" for a collection.
	ID string
}

// Refusal is a denied action: who, what, and the policies that decided.
type Refusal struct {
	Caller   string
	Action   string
	Resource Resource
	Reason   string
	Policies []string
	Revision string
}

// Err returns the refusal as PERMISSION_DENIED with its reason.
func (r *Refusal) Err() error {
	msg := fmt.Sprintf("%s may not %s %s %s", r.Caller, r.Action, r.Resource.Type, r.Resource.ID)
	switch r.Reason {
	case "ROLE_NOT_GRANTED":
		msg += ": no policy grants it; ask a policy administrator for the role"
	default:
		msg += ": refused by policy " + strings.Join(r.Policies, ", ")
	}
	return apierror.New(codes.PermissionDenied, r.Reason, msg, map[string]string{
		"action": r.Action, "resource_type": r.Resource.Type, "resource_id": r.Resource.ID,
		"policy_ids": strings.Join(r.Policies, ","), "policy_revision": r.Revision,
	})
}

// Check returns the authenticated caller of ctx when it may take action on
// res, a *Refusal when policy says no, and another error when the question
// could not be asked. A V0M3 service (a peer the access table admitted) is
// not a principal of these policies: the table already decided. A nil
// Decider (no policy service configured) refuses every other caller.
func (d Decider) Check(ctx context.Context, action string, res Resource, attrs map[string]string) (identity.Caller, *Refusal, error) {
	c, ok := identity.CallerFrom(ctx)
	if !ok {
		return identity.Caller{}, nil, apierror.New(codes.Unauthenticated, "CREDENTIALS_MISSING", "no authenticated caller", nil)
	}
	if c.Kind == identity.KindService {
		return c, nil, nil
	}
	if d == nil {
		return c, nil, apierror.New(codes.FailedPrecondition, "AUTHORIZATION_NOT_CONFIGURED",
			"no policy service is configured to decide what people and product services may do here", nil)
	}
	resp, err := d(ctx, &policyv1.AuthorizeActionRequest{
		Principal: &policyv1.Principal{Id: c.ID, Groups: c.Groups}, Action: action,
		ResourceType: res.Type, ResourceId: res.ID, Attributes: attrs,
	})
	if err != nil {
		return c, nil, apierror.Propagate(err, "authorize "+action)
	}
	if resp.GetDecision() != policyv1.Decision_DECISION_ALLOW {
		return c, &Refusal{Caller: c.ID, Action: action, Resource: res, Reason: resp.GetRefusalReason(),
			Policies: resp.GetReasons(), Revision: resp.GetPolicyRevision()}, nil
	}
	return c, nil, nil
}

// Require is Check with the refusal as its error.
func (d Decider) Require(ctx context.Context, action string, res Resource, attrs map[string]string) (identity.Caller, error) {
	c, ref, err := d.Check(ctx, action, res, attrs)
	if err != nil {
		return c, err
	}
	if ref != nil {
		return c, ref.Err()
	}
	return c, nil
}
