package policy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/paging"
	"github.com/v0m3/v0m3/internal/store"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// Eligible computes, for every capability the registry knows, how far it
// got towards being offered to this task and why it stopped: no mapping, no
// active mapping, a degraded or retired connection, a policy denial, or no
// need in the task's plan. Keeping these apart is what makes a missing tool
// debuggable.
func (s *Server) Eligible(ctx context.Context, req *policyv1.EligibleRequest) (*policyv1.EligibleResponse, error) {
	var bad []apierror.FieldViolation
	if req.GetTaskId() == "" {
		bad = append(bad, apierror.FieldViolation{Field: "task_id", Description: "required"})
	}
	if req.GetRequester().GetId() == "" {
		bad = append(bad, apierror.FieldViolation{Field: "requester.id", Description: "required"})
	}
	if req.GetPurpose() == "" {
		bad = append(bad, apierror.FieldViolation{Field: "purpose", Description: "required"})
	}
	if len(bad) > 0 {
		return nil, apierror.InvalidArgument(apierror.ReasonFieldInvalid, "the eligibility request is incomplete", bad...)
	}

	caps, err := paging.Collect(ctx, func(ctx context.Context, tok string) ([]*registryv1.Capability, string, error) {
		r, err := s.deps.Registry.ListCapabilities(ctx, &registryv1.ListCapabilitiesRequest{PageSize: paging.MaxSize, PageToken: tok})
		return r.GetCapabilities(), r.GetNextPageToken(), err
	})
	if err != nil {
		return nil, apierror.Propagate(err, "policy: list capabilities")
	}
	maps, err := paging.Collect(ctx, func(ctx context.Context, tok string) ([]*registryv1.Mapping, string, error) {
		r, err := s.deps.Registry.ListMappings(ctx, &registryv1.ListMappingsRequest{PageSize: paging.MaxSize, PageToken: tok})
		return r.GetMappings(), r.GetNextPageToken(), err
	})
	if err != nil {
		return nil, apierror.Propagate(err, "policy: list mappings")
	}
	byCap := map[string][]*registryv1.Mapping{}
	for _, m := range maps {
		byCap[m.GetCapability()] = append(byCap[m.GetCapability()], m)
	}
	needed := map[string]bool{}
	for _, n := range req.GetNeededCapabilities() {
		needed[n] = true
	}

	e := &eligibility{s: s, req: req, conns: map[string]connState{}}
	resp := &policyv1.EligibleResponse{PolicyRevision: s.policy.Load().revision}
	for _, c := range caps {
		ce, err := e.evaluate(ctx, c, byCap[c.GetName()], needed[c.GetName()])
		if err != nil {
			return nil, err
		}
		resp.Capabilities = append(resp.Capabilities, ce)
	}
	slices.SortFunc(resp.Capabilities, func(a, b *policyv1.CapabilityEligibility) int {
		return cmp.Compare(a.GetCapability(), b.GetCapability())
	})
	return resp, nil
}

// connState is a connection's fitness, looked up once per Eligible call.
type connState struct {
	degraded bool
	detail   string
}

// eligibility holds one Eligible call's request and lookups.
type eligibility struct {
	s     *Server
	req   *policyv1.EligibleRequest
	conns map[string]connState
}

// evaluate places one capability on the eligibility ladder.
func (e *eligibility) evaluate(ctx context.Context, c *registryv1.Capability, mappings []*registryv1.Mapping, needed bool) (*policyv1.CapabilityEligibility, error) {
	ce := &policyv1.CapabilityEligibility{Capability: c.GetName(), EffectClass: c.GetEffectClass()}
	if len(mappings) == 0 {
		ce.Stage = policyv1.EligibilityStage_ELIGIBILITY_STAGE_UNKNOWN
		ce.Reason = policyv1.NotOfferedReason_NOT_OFFERED_REASON_REGISTRATION_MISSING
		ce.Detail = "no mapping implements this capability"
		return ce, nil
	}
	slices.SortFunc(mappings, func(a, b *registryv1.Mapping) int { return cmp.Compare(a.GetId(), b.GetId()) })
	var active []*registryv1.Mapping
	var states []string
	for _, m := range mappings {
		if m.GetState() == registryv1.MappingState_MAPPING_STATE_ACTIVE {
			active = append(active, m)
			continue
		}
		states = append(states, fmt.Sprintf("mapping %s revision %d is %s", m.GetId(), m.GetRevision(), mappingStateName(m.GetState())))
	}
	if len(active) == 0 {
		ce.Stage = policyv1.EligibilityStage_ELIGIBILITY_STAGE_DISCOVERED
		ce.Reason = policyv1.NotOfferedReason_NOT_OFFERED_REASON_REGISTRATION_MISSING
		ce.Detail = strings.Join(states, "; ")
		return ce, nil
	}

	// Several active mappings (on different connections) may implement one
	// capability: the first healthy, permitted one is used. Otherwise a
	// policy denial on a healthy connection explains more than a degraded
	// connection does.
	ce.Stage = policyv1.EligibilityStage_ELIGIBILITY_STAGE_REGISTERED
	var denied, degraded *policyv1.CapabilityEligibility
	for _, m := range active {
		cand := &policyv1.CapabilityEligibility{
			Capability:      c.GetName(),
			Stage:           policyv1.EligibilityStage_ELIGIBILITY_STAGE_REGISTERED,
			MappingId:       m.GetId(),
			MappingRevision: m.GetRevision(),
			ConnectionId:    m.GetConnectionId(),
			EffectClass:     c.GetEffectClass(),
		}
		cs, err := e.connection(ctx, m.GetConnectionId())
		if err != nil {
			return nil, err
		}
		if cs.degraded {
			cand.Reason = policyv1.NotOfferedReason_NOT_OFFERED_REASON_CONNECTION_DEGRADED
			cand.Detail = cs.detail
			if degraded == nil {
				degraded = cand
			}
			continue
		}
		if idempotencyRequired(c) && !effectRecoverable(m) {
			// A capability whose outcome can be unknown must have a way to
			// find out whether it happened; without one, a disconnect could
			// only be answered by a blind retry.
			cand.Reason = policyv1.NotOfferedReason_NOT_OFFERED_REASON_POLICY_DENIED
			if c.GetEffectClass() == registryv1.EffectClass_EFFECT_CLASS_EXTERNAL_EFFECT {
				cand.PolicyReasons = []string{ExternalEffectNeedsIdempotency}
				cand.Detail = fmt.Sprintf("external effect disabled: mapping %s revision %d declares neither an idempotency key field nor a status tool", m.GetId(), m.GetRevision())
			} else {
				cand.PolicyReasons = []string{CapabilityNeedsIdempotency}
				cand.Detail = fmt.Sprintf("capability %s requires idempotency: mapping %s revision %d declares neither an idempotency key field nor a status tool", c.GetName(), m.GetId(), m.GetRevision())
			}
			if denied == nil {
				denied = cand
			}
			continue
		}
		dec := e.s.decide(ctx, query{
			principal:       e.req.GetRequester(),
			capability:      c.GetName(),
			connectionID:    m.GetConnectionId(),
			taskID:          e.req.GetTaskId(),
			purpose:         e.req.GetPurpose(),
			effect:          c.GetEffectClass(),
			approval:        c.GetApproval(),
			mappingID:       m.GetId(),
			mappingRevision: m.GetRevision(),
		})
		cand.PolicyReasons = dec.GetReasons()
		if dec.GetDecision() != policyv1.Decision_DECISION_ALLOW {
			cand.Reason = policyv1.NotOfferedReason_NOT_OFFERED_REASON_POLICY_DENIED
			cand.Detail = fmt.Sprintf("policy %s denies %s to %s for purpose %q", dec.GetPolicyRevision(), c.GetName(), e.req.GetRequester().GetId(), e.req.GetPurpose())
			if denied == nil {
				denied = cand
			}
			continue
		}
		if needed {
			cand.Stage = policyv1.EligibilityStage_ELIGIBILITY_STAGE_OFFERED
		} else {
			cand.Stage = policyv1.EligibilityStage_ELIGIBILITY_STAGE_ELIGIBLE
			cand.Reason = policyv1.NotOfferedReason_NOT_OFFERED_REASON_NOT_NEEDED
			cand.Detail = "the task's plan does not need it"
		}
		return cand, nil
	}
	if denied != nil {
		return denied, nil
	}
	return degraded, nil
}

// connection reports whether a connection is retired or reported degraded.
// A connection whose health was never reported counts as healthy: the
// adapter reports failures, and silence is not one.
func (e *eligibility) connection(ctx context.Context, id string) (connState, error) {
	if cs, ok := e.conns[id]; ok {
		return cs, nil
	}
	var cs connState
	conn, err := e.s.deps.Registry.GetConnection(ctx, &registryv1.GetConnectionRequest{Id: id})
	switch {
	case status.Code(err) == codes.NotFound:
		cs = connState{degraded: true, detail: fmt.Sprintf("connection %s is not in the registry", id)}
	case err != nil:
		return connState{}, apierror.Propagate(err, "policy: look up connection")
	case conn.GetState() == registryv1.ConnectionState_CONNECTION_STATE_RETIRED:
		cs = connState{degraded: true, detail: fmt.Sprintf("connection %s is retired", id)}
	default:
		h, err := e.s.store.GetHealth(ctx, id)
		switch {
		case errors.Is(err, store.ErrNotFound):
		case err != nil:
			return connState{}, e.s.storeError(ctx, err, "read the connection's health")
		case h.GetState() == policyv1.HealthState_HEALTH_STATE_DEGRADED:
			cs = connState{degraded: true, detail: fmt.Sprintf("connection %s reported degraded at %s", id,
				h.GetReportTime().AsTime().UTC().Format("2006-01-02T15:04:05Z"))}
		}
	}
	e.conns[id] = cs
	return cs, nil
}

// mappingStateName is a mapping state as people read it, e.g.
// "review_required".
func mappingStateName(st registryv1.MappingState) string {
	return strings.ToLower(strings.TrimPrefix(st.String(), "MAPPING_STATE_"))
}

// The built-in rule (reported as a policy reason) that keeps a capability
// requiring idempotency disabled on a mapping whose server offers no
// idempotency key and no status query; see idempotencyRequired.
const (
	// ExternalEffectNeedsIdempotency is the rule's reason for an external
	// effect.
	ExternalEffectNeedsIdempotency = "builtin:external-effect-needs-idempotency"
	// CapabilityNeedsIdempotency is the rule's reason for any other
	// capability that declares idempotency_required.
	CapabilityNeedsIdempotency = "builtin:capability-needs-idempotency"
)

// idempotencyRequired reports whether a capability may be offered only on
// a mapping that can learn an attempt's outcome without repeating it: when
// its contract says so, and for every external effect whatever its
// contract says.
func idempotencyRequired(c *registryv1.Capability) bool {
	return c.GetIdempotencyRequired() || c.GetEffectClass() == registryv1.EffectClass_EFFECT_CLASS_EXTERNAL_EFFECT
}

// effectRecoverable reports whether a mapping lets V0M3 learn the outcome
// of an attempt without repeating it.
func effectRecoverable(m *registryv1.Mapping) bool {
	return m.GetIdempotencyKeyField() != "" || m.GetStatusTool() != ""
}
