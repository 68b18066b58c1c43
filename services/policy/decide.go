package policy

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/v0m3/v0m3/internal/apierror"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
)

// Decider is what Decide is made of: the three decisions of a governed
// call, each with its own rules (the server's RPCs of the same names).
type Decider interface {
	ResolveHandle(context.Context, *policyv1.ResolveHandleRequest) (*policyv1.ResolveHandleResponse, error)
	Authorize(context.Context, *policyv1.AuthorizeRequest) (*policyv1.AuthorizeResponse, error)
	Charge(context.Context, *policyv1.ChargeRequest) (*policyv1.ChargeResponse, error)
}

// Decide resolves a call's handles, or authorizes it on its connection,
// and charges it when every decision allows, in one round trip (see the
// RPC's contract in policy.proto).
func (s *Server) Decide(ctx context.Context, in *policyv1.DecideRequest) (*policyv1.DecideResponse, error) {
	return DecideWith(ctx, s, in)
}

// DecideWith is Decide on d's decisions: each step runs exactly as its own
// RPC would, so the rules stay in one place.
func DecideWith(ctx context.Context, d Decider, in *policyv1.DecideRequest) (*policyv1.DecideResponse, error) {
	if c := in.GetCharge(); c != nil && (c.GetTaskId() != in.GetTaskId() || c.GetRequester() != in.GetRequester().GetId()) {
		return nil, apierror.InvalidArgument(apierror.ReasonFieldInvalid, "the charge must be for the request's task and requester",
			apierror.FieldViolation{Field: "charge", Description: "task_id and requester must equal the request's"})
	}
	out := &policyv1.DecideResponse{}
	for _, h := range in.GetHandles() {
		res, err := d.ResolveHandle(ctx, &policyv1.ResolveHandleRequest{
			Token: h.GetToken(), TaskId: in.GetTaskId(), Requester: in.GetRequester(), Capability: in.GetCapability(),
			MappingId: in.GetMappingId(), MappingRevision: in.GetMappingRevision(),
			Purpose: in.GetPurpose(), EffectClass: in.GetEffectClass(), Kind: h.GetKind(),
		})
		if err != nil {
			return nil, err
		}
		out.Handles = append(out.Handles, &policyv1.ResolvedHandle{Field: h.GetField(), Binding: res.GetBinding()})
		if res.GetAuthorization() != nil {
			out.Decisions = append(out.Decisions, res.GetAuthorization())
		}
	}
	if len(out.GetDecisions()) == 0 {
		az, err := d.Authorize(ctx, &policyv1.AuthorizeRequest{
			Principal: in.GetRequester(), Capability: in.GetCapability(), Resource: in.GetConnectionId(),
			TaskId: in.GetTaskId(), Purpose: in.GetPurpose(), EffectClass: in.GetEffectClass(),
			MappingId: in.GetMappingId(), MappingRevision: in.GetMappingRevision(),
		})
		if err != nil {
			return nil, err
		}
		out.Decisions = append(out.Decisions, az)
	}
	if in.GetCharge() == nil {
		return out, nil
	}
	for _, az := range out.GetDecisions() {
		if az.GetDecision() != policyv1.Decision_DECISION_ALLOW {
			return out, nil
		}
	}
	charged, err := d.Charge(ctx, in.GetCharge())
	if err != nil {
		return nil, withDecisions(err, out)
	}
	out.Charge = charged
	return out, nil
}

// withDecisions adds what was decided to a refused charge's status, so the
// caller can record the decisions the refusal came after.
func withDecisions(err error, decided *policyv1.DecideResponse) error {
	st, ok := status.FromError(err)
	if !ok || st.Code() == codes.OK {
		return err
	}
	if d, derr := st.WithDetails(decided); derr == nil {
		return d.Err()
	}
	return err
}
