package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/digest"
	"github.com/v0m3/v0m3/internal/handlekind"
	"github.com/v0m3/v0m3/internal/store"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/orchestrator/lifecycle"
	"github.com/v0m3/v0m3/services/orchestrator/tasks"
)

// prepared is everything decided about a candidate request before anything
// is sent: the current capability and mapping, normalized arguments,
// resolved handle targets and the authorization. It lives only in memory;
// an approval re-derives it so execution always runs on current state.
type prepared struct {
	capability *registryv1.Capability
	offered    *orchestratorv1.OfferedCapability
	mapping    *registryv1.Mapping
	connection *registryv1.Connection
	// fresh is the digest of connection while it is the reading made for
	// this decision, "" once an attempt used it (see freshConnection).
	fresh      string
	normalized map[string]any
	argsDigest string
	// targets maps a handle field to its resolved server-side target.
	targets map[string]string
	// target is what the call reaches (see callTarget).
	target *registryv1.RemoteTarget
	// labels maps a server-side target to the label the model saw.
	labels map[string]string
	// fieldLabels maps a handle field to the label the model saw.
	fieldLabels map[string]string
	// summary is the consequence in product terms (see summarize).
	summary string
	// authz is the authorization in force; approvalRequired is whether any
	// decision asked for a person.
	authz            *policyv1.AuthorizeResponse
	approvalRequired bool
}

// prepare runs every product decision about a request, in order, and stops
// at the first that fails. Nothing here sends anything to a remote server:
// in particular handles are resolved (and so checked against this task)
// before the adapter is ever called. The returned prepared value holds what
// was learned so far even on failure, for the record. With charge, policy
// also charges the call (once per intent) when it allows it, in the same
// round trip. cat is the task's offered catalogue when the caller read it
// with the task (as the request's creation does); nil reads it here.
func (s *Server) prepare(ctx context.Context, task *orchestratorv1.Task, cat *orchestratorv1.OfferedCatalogue, req *orchestratorv1.ToolRequest, charge bool) (*prepared, error) {
	p := &prepared{targets: map[string]string{}, labels: map[string]string{}, fieldLabels: map[string]string{}}
	name := req.GetCapability()

	// a. Only an active task may act.
	if task.GetState() != orchestratorv1.TaskState_TASK_STATE_ACTIVE {
		return p, apierror.New(codes.FailedPrecondition, "TASK_NOT_ACTIVE",
			fmt.Sprintf("task %s is %s; it accepts no requests", task.GetId(), tasks.Name(task.GetState())),
			map[string]string{"task_id": task.GetId(), "state": tasks.Name(task.GetState())})
	}

	// b. Only what was offered to this task may be requested.
	var err error
	if cat == nil {
		cat, err = s.st.GetCatalogue(ctx, task.GetId())
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return p, s.internal(ctx, "load the offered catalogue", err)
		}
	}
	p.offered = offeredCapability(cat, name)
	if p.offered == nil {
		return p, apierror.New(codes.PermissionDenied, "CAPABILITY_NOT_OFFERED",
			fmt.Sprintf("capability %s was not offered to task %s; offered: %s", name, task.GetId(), listOrNone(offeredNames(cat))),
			map[string]string{"task_id": task.GetId(), "capability": name})
	}

	// The registry's answer to "is the offered mapping still current?" is
	// asked first: when it is, it also names the capability revision in
	// force (an active mapping is reviewed against the current contract),
	// whose contract is then read from the cache. Its refusal is reported
	// at step d, after the checks that come before it.
	resolved, conn, resolveErr := s.resolveExecution(ctx, name, p.offered)

	// c. Arguments must match the product schema the model was shown.
	var current string // the digest of the contract's input schema
	if resolveErr == nil && p.offered.GetMappingId() != "" && resolved.GetCapabilityRevision() > 0 {
		p.capability, current, err = s.caps.Contract(ctx, s.deps.Registry, name, resolved.GetCapabilityRevision())
	} else if p.capability, err = s.deps.Registry.GetCapability(ctx, &registryv1.GetCapabilityRequest{Name: name}); err == nil {
		current, _ = digest.Struct(p.capability.GetInputSchema())
	}
	if err != nil {
		return p, apierror.Propagate(err, "get capability")
	}
	// The catalogue lists handles in the schema the model sees; the
	// contract the request is held to is the declared schema it was
	// compiled from (catalogues compiled before handles were listed hold
	// the declared schema itself).
	shown := p.offered.GetInputSchemaDigest()
	if shown == "" {
		shown, _ = digest.Struct(p.offered.GetInputSchema())
	}
	if shown != current {
		return p, apierror.New(codes.FailedPrecondition, "CAPABILITY_CHANGED",
			fmt.Sprintf("capability %s changed since it was offered to task %s; start a new task to use the current contract", name, task.GetId()),
			map[string]string{"capability": name})
	}
	p.normalized, err = normalizeArguments(p.capability.GetInputSchema(), req.GetArguments())
	if err != nil {
		return p, err
	}
	if p.argsDigest, err = digest.JSON(p.normalized); err != nil {
		return p, fmt.Errorf("digest arguments: %w", err)
	}

	// d. The mapping offered must still be the reviewed, active one.
	if resolveErr != nil {
		return p, apierror.Propagate(resolveErr, "resolve mapping")
	}
	p.mapping = resolved
	p.setConnection(conn)
	if p.connection.GetState() == registryv1.ConnectionState_CONNECTION_STATE_RETIRED {
		return p, apierror.New(codes.FailedPrecondition, "CONNECTION_RETIRED",
			fmt.Sprintf("connection %s implementing %s is retired", p.connection.GetId(), name),
			map[string]string{"connection_id": p.connection.GetId()})
	}

	// e. Handles resolve against this task, requester, the field's handle
	// kind, capability and mapping revision, or the request stops here;
	// f. policy decides on current state; and, when asked, the call is
	// charged once every decision allows: one round trip to policy.
	dreq := &policyv1.DecideRequest{
		Requester: task.GetRequester(), TaskId: task.GetId(), Capability: name,
		ConnectionId: p.mapping.GetConnectionId(), MappingId: p.mapping.GetId(), MappingRevision: p.mapping.GetRevision(),
		Purpose: purposeOf(task), EffectClass: p.capability.GetEffectClass(),
	}
	for _, hf := range p.capability.GetHandles() {
		v, ok := p.normalized[hf.GetField()]
		if !ok {
			continue
		}
		token, _ := v.(string)
		dreq.Handles = append(dreq.Handles, &policyv1.HandleUse{Field: hf.GetField(), Token: token, Kind: handlekind.Of(hf.GetKind())})
	}
	if charge {
		dreq.Charge = callCharge(task, req)
	}
	decided, chargeErr := s.deps.Policy.Decide(ctx, dreq)
	if chargeErr != nil {
		if decided, chargeErr = splitDecided(chargeErr); decided == nil {
			// Nothing was decided: a handle did not resolve, or policy failed.
			if len(dreq.GetHandles()) > 0 {
				return p, apierror.Propagate(chargeErr, "resolve the handles in "+handleFields(dreq))
			}
			return p, apierror.Propagate(chargeErr, "authorize")
		}
	}
	for _, h := range decided.GetHandles() {
		b := h.GetBinding()
		if b.GetTaskId() != task.GetId() || b.GetCapability() != name {
			// Policy checks this; the orchestrator refuses to be the place
			// where a mismatch slips through if it ever did not.
			return p, apierror.New(codes.PermissionDenied, "HANDLE_TASK_MISMATCH",
				fmt.Sprintf("the handle in %s is not bound to task %s and capability %s", h.GetField(), task.GetId(), name), nil)
		}
		p.targets[h.GetField()] = b.GetTarget()
		p.labels[b.GetTarget()] = b.GetLabel()
		p.fieldLabels[h.GetField()] = b.GetLabel()
	}

	if p.target, err = callTarget(p.mapping, p.targets); err != nil {
		return p, err
	}

	p.summary = summarize(p.capability, p.normalized, p.fieldLabels)

	decisions := decided.GetDecisions()
	if len(decisions) == 0 {
		return p, apierror.New(codes.Internal, "POLICY_NO_DECISION", "policy returned no decision for the call", nil)
	}
	p.authz = decisions[0]
	for _, d := range decisions {
		if d.GetApprovalRequired() {
			p.approvalRequired = true
		}
		if d.GetDecision() != policyv1.Decision_DECISION_ALLOW {
			p.authz = d
		}
	}
	allowed := p.authz.GetDecision() == policyv1.Decision_DECISION_ALLOW
	s.trace(ctx, task.GetId(), &evidencev1.ProductEvent{
		Kind: evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_POLICY_DECISION, Capability: name,
		RequestId: req.GetId(), IntentId: req.GetIntentId(),
		PolicyDecision: decisionText(p.authz),
		Detail:         fmt.Sprintf("%s on connection %s via mapping %s r%d; approval required: %t", decisionText(p.authz), p.mapping.GetConnectionId(), p.mapping.GetId(), p.mapping.GetRevision(), p.approvalRequired),
	})
	if !allowed {
		return p, apierror.New(codes.PermissionDenied, "POLICY_DENIED",
			fmt.Sprintf("policy denied %s for %s in task %s (%s)", name, task.GetRequester().GetId(), task.GetId(), decisionText(p.authz)),
			map[string]string{"policy_revision": p.authz.GetPolicyRevision()})
	}
	if chargeErr != nil {
		return p, apierror.Propagate(chargeErr, "charge budget")
	}
	return p, nil
}

// resolveExecution asks the registry whether the mapping offered for
// capability is still the current one, and reads the connection it runs
// on: one round trip (ResolveExecution). An offer without a mapping (a
// catalogue compiled before offers named one) resolves the capability's
// active mapping; a registry without ResolveExecution (an older version
// during an upgrade) answers in two.
func (s *Server) resolveExecution(ctx context.Context, capability string, offered *orchestratorv1.OfferedCapability) (*registryv1.Mapping, *registryv1.Connection, error) {
	if offered.GetMappingId() != "" {
		r, err := s.deps.Registry.ResolveExecution(ctx, &registryv1.ResolveExecutionRequest{
			Capability: capability, MappingId: offered.GetMappingId(), Revision: offered.GetMappingRevision(),
		})
		if status.Code(err) != codes.Unimplemented {
			return r.GetMapping(), r.GetConnection(), err
		}
	}
	m, err := s.deps.Registry.ResolveMapping(ctx, &registryv1.ResolveMappingRequest{
		Capability: capability, MappingId: offered.GetMappingId(), Revision: offered.GetMappingRevision(),
	})
	if err != nil {
		return nil, nil, err
	}
	c, err := s.deps.Registry.GetConnection(ctx, &registryv1.GetConnectionRequest{Id: m.GetConnectionId()})
	if err != nil {
		return m, nil, err
	}
	return m, c, nil
}

// charge charges one call to the task's and requester's budgets. The
// intent id is the idempotency key, so an approval re-running the checks
// never charges twice. Submission charges within prepare (one round trip
// to policy); this is for the paths that charge after other steps.
func (s *Server) charge(ctx context.Context, task *orchestratorv1.Task, req *orchestratorv1.ToolRequest) error {
	_, err := s.deps.Policy.Charge(ctx, callCharge(task, req))
	return apierror.Propagate(err, "charge budget")
}

// callCharge is the charge of one call, keyed by its intent.
func callCharge(task *orchestratorv1.Task, req *orchestratorv1.ToolRequest) *policyv1.ChargeRequest {
	return &policyv1.ChargeRequest{
		TaskId: task.GetId(), Requester: task.GetRequester().GetId(), Calls: 1, IdempotencyKey: req.GetIntentId(),
	}
}

// splitDecided separates what policy decided before it refused a call's
// charge (a Decide error carries it in its details) from the refusal, so
// the decisions are recorded and the refusal alone (never the bindings'
// targets) goes on to the caller. decided is nil when the error carries
// none.
func splitDecided(err error) (decided *policyv1.DecideResponse, refusal error) {
	st, ok := status.FromError(err)
	if !ok {
		return nil, err
	}
	pb := st.Proto()
	kept := pb.Details[:0]
	for _, a := range pb.GetDetails() {
		r := &policyv1.DecideResponse{}
		if a.MessageIs(r) && a.UnmarshalTo(r) == nil {
			decided = r
			continue
		}
		kept = append(kept, a)
	}
	if decided == nil {
		return nil, err
	}
	pb.Details = kept
	return decided, status.FromProto(pb).Err()
}

// handleFields names the fields of a call's handles, for an error.
func handleFields(r *policyv1.DecideRequest) string {
	names := make([]string, len(r.GetHandles()))
	for i, h := range r.GetHandles() {
		names[i] = h.GetField()
	}
	return strings.Join(names, ", ")
}

// refuseUnlessOutage refuses a request for cause, except when cause is a
// dependency outage (UNAVAILABLE, DEADLINE_EXCEEDED): then the decision
// was not taken, so the request stays as it is stored: REQUESTED or
// APPROVED, which recovery takes again once the dependency is back (see
// decideAgain, retryRecovered), and the caller's retry under the same
// provider call id finds it decided; AWAITING_APPROVAL, which the
// approver tries again. Recording the outage as a refusal made every
// retry replay UNAVAILABLE for good.
func (s *Server) refuseUnlessOutage(ctx context.Context, req *orchestratorv1.ToolRequest, p *prepared, cause error) (*orchestratorv1.ToolRequest, error) {
	switch status.Code(cause) {
	case codes.Unavailable, codes.DeadlineExceeded:
		s.log.WarnContext(ctx, "request left as it is: a dependency is unavailable", "task", req.GetTaskId(), "request", req.GetId(), "err", cause)
		return nil, apierror.Propagate(cause, "decide the request")
	}
	return s.refuse(ctx, req, p, cause)
}

// refuse records a request as refused, traces why, and returns the error
// the caller sees (a downstream service's status passes through unchanged).
func (s *Server) refuse(ctx context.Context, req *orchestratorv1.ToolRequest, p *prepared, cause error) (*orchestratorv1.ToolRequest, error) {
	cause = apierror.Propagate(cause, "prepare request")
	reason := apierror.Reason(cause)
	if reason == "" {
		reason = "DEPENDENCY_" + codeName(status.Code(cause))
	}
	detail := errorMessage(cause)
	_, err := s.updateRequest(ctx, req.GetId(), func(r *orchestratorv1.ToolRequest) error {
		if err := lifecycle.Move(r, lifecycle.Refuse, lifecycle.NoOutcome); err != nil {
			return err
		}
		r.RefusalReason, r.RefusalDetail = reason, detail
		r.RefusalCode = codeName(status.Code(cause))
		p.record(r)
		r.UpdateTime = s.timestamp()
		return nil
	}, func(ctx context.Context) {
		s.trace(ctx, req.GetTaskId(), &evidencev1.ProductEvent{
			Kind: evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_REQUEST_REFUSED, Capability: req.GetCapability(),
			RequestId: req.GetId(), IntentId: req.GetIntentId(), Reason: reason, Detail: detail,
		})
		s.emit(ctx, req.GetTaskId(), req.GetId(), "request.refused", reason+": "+detail)
	})
	switch {
	case apierror.Reason(err) == reasonLeaseLost:
		return nil, err
	case err != nil:
		s.log.ErrorContext(ctx, "record refusal", "request", req.GetId(), "err", err)
	}
	s.log.InfoContext(ctx, "request refused", "task", req.GetTaskId(), "request", req.GetId(), "capability", req.GetCapability(), "reason", reason)
	return nil, cause
}

// setConnection sets the connection the call runs on, as just read from
// the registry.
func (p *prepared) setConnection(c *registryv1.Connection) {
	p.connection = c
	p.fresh, _ = digest.Message(c) // none: the adapter reads it itself
}

// freshConnection returns, once, the digest of the connection reading
// made for this decision: the first attempt tells the adapter which state
// it was authorized on (ExecuteRequest.connection_digest), so the adapter
// need not read it again. Later attempts (after a retry's wait) send none
// and the adapter reads the connection itself.
func (p *prepared) freshConnection() string {
	d := p.fresh
	p.fresh = ""
	return d
}

// record copies what is known about the product decision onto a request.
func (p *prepared) record(r *orchestratorv1.ToolRequest) {
	if p == nil {
		return
	}
	if p.argsDigest != "" {
		r.ArgumentsDigest = p.argsDigest
	}
	if p.mapping != nil {
		r.MappingId, r.MappingRevision = p.mapping.GetId(), p.mapping.GetRevision()
	} else if p.offered != nil {
		r.MappingId, r.MappingRevision = p.offered.GetMappingId(), p.offered.GetMappingRevision()
	}
	if p.authz != nil {
		r.PolicyRevision = p.authz.GetPolicyRevision()
	}
	if p.summary != "" {
		r.Summary = p.summary
	}
}

func decisionText(az *policyv1.AuthorizeResponse) string {
	verb := "deny"
	if az.GetDecision() == policyv1.Decision_DECISION_ALLOW {
		verb = "allow"
	}
	by := "no matching policy"
	if len(az.GetReasons()) > 0 {
		by = strings.Join(az.GetReasons(), ", ")
	}
	return fmt.Sprintf("%s by %s (policy revision %s)", verb, by, az.GetPolicyRevision())
}
