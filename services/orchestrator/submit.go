package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/digest"
	"github.com/v0m3/v0m3/internal/handlekind"
	"github.com/v0m3/v0m3/internal/ids"
	"github.com/v0m3/v0m3/internal/store"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/orchestrator/lifecycle"
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

// SubmitToolRequest records what the model asked for as a candidate
// request, then validates, authorizes and, when no approval is needed,
// executes it. The same (task, provider call id) returns the recorded
// request without acting again.
//
// Once the request is recorded every error carries its id in the
// ErrorInfo metadata ("request_id"), and GetRequest returns the request
// in the state the error tells of (see the README's error model).
func (s *Server) SubmitToolRequest(ctx context.Context, in *orchestratorv1.SubmitToolRequestRequest) (_ *orchestratorv1.ToolRequest, err error) {
	for _, f := range []struct{ name, value string }{
		{"task_id", in.GetTaskId()}, {"provider_call_id", in.GetProviderCallId()}, {"capability", in.GetCapability()},
	} {
		if f.value == "" {
			return nil, missing(f.name)
		}
	}
	task, err := s.openTaskToAct(ctx, in.GetTaskId(), taskWrite)
	if err != nil {
		return nil, err
	}
	// The lease of the new request is taken with its creation, in the
	// same transaction, so no replica's recovery ever sees it unowned
	// while this call decides; until then the id is reserved, so this
	// replica's does not either.
	id := ids.New("req")
	s.reserve(id)
	var l *lease
	defer func() {
		if l != nil {
			l.release()
		} else {
			s.unreserve(id)
		}
	}()
	// The call's trace and task events are written with the state change
	// they tell of, and delivered at its checkpoints: before the adapter
	// is called and before this returns (ctx is the detached one by then).
	ctx = withCheckpoint(ctx)
	defer func() { s.flush(ctx) }()
	now := s.timestamp()
	asked := time.Now()
	cand := &orchestratorv1.ToolRequest{
		Id:             id,
		TaskId:         task.GetId(),
		ProviderCallId: in.GetProviderCallId(),
		Capability:     in.GetCapability(),
		Arguments:      in.GetArguments(),
		DocumentDigest: in.GetDocumentDigest(),
		IntentId:       ids.New("int"),
		CreateTime:     now,
		UpdateTime:     now,
	}
	if err := lifecycle.Move(cand, lifecycle.Receive, lifecycle.NoOutcome); err != nil {
		return nil, s.internal(ctx, "record the candidate request", err)
	}
	c, err := s.createRequest(ctx, cand, func(ctx context.Context) {
		s.trace(ctx, task.GetId(), &evidencev1.ProductEvent{
			Kind: evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_REQUEST_RECEIVED, Capability: cand.GetCapability(),
			RequestId: cand.GetId(), IntentId: cand.GetIntentId(),
			Detail: fmt.Sprintf("candidate request for %s (provider call %s); nothing has acted", cand.GetCapability(), cand.GetProviderCallId()),
		})
		s.emit(ctx, task.GetId(), cand.GetId(), "request.received", cand.GetCapability())
	})
	if err != nil {
		return nil, s.internal(ctx, "record the candidate request", err)
	}
	req := c.Request
	if !c.Created {
		if !sameCandidate(in, req) {
			return nil, apierror.New(codes.AlreadyExists, reasonIdempotencyKeyReused,
				fmt.Sprintf("provider call %q of task %s was already submitted with another capability, arguments or document digest; a new call needs a new provider_call_id", truncate(in.GetProviderCallId(), maxEchoBytes), task.GetId()),
				map[string]string{"request_id": req.GetId()})
		}
		if err := replayedRefusal(req); err != nil {
			return nil, err
		}
		return req, nil
	}
	if c.LeaseGeneration == 0 {
		// Another owner's live lease on an id just made: recovery takes
		// the request once it ends.
		return nil, claimFailed("the new request")
	}
	l = s.leased(id, c.LeaseGeneration, asked)
	// Every later write of the request is fenced by the lease (see
	// updateRequest).
	ctx = withLease(ctx, l)
	defer func() { err = withRequestID(err, req.GetId()) }()
	// The task is read again in the transaction that recorded the
	// request: a CompleteTask that missed this request had changed the
	// task's state by then, or will see the request (see CompleteTask).
	// Its offered catalogue, which prepare checks the request against,
	// comes with it.
	task, cat := c.Task, c.Catalogue
	if task == nil {
		return s.refuseUnlessOutage(ctx, req, nil, s.taskErr(ctx, in.GetTaskId(), store.ErrNotFound))
	}
	// The request is recorded; whatever happens next must be recorded too,
	// even if the caller stops waiting.
	ctx, cancel := s.detach(ctx, l)
	defer cancel()
	s.log.DebugContext(ctx, "request received", "task", task.GetId(), "request", req.GetId(), "intent", req.GetIntentId(), "capability", req.GetCapability())
	if err := s.failAt(ctx, FailPointSubmitReceived); err != nil {
		return nil, err
	}

	p, err := s.prepare(ctx, task, cat, req, true)
	if err != nil {
		return s.refuseUnlessOutage(ctx, req, p, err)
	}
	if p.approvalRequired {
		return s.awaitApproval(ctx, req, p)
	}
	if in.GetReturnImmediately() {
		return s.executeInBackground(ctx, task, req, p)
	}
	return s.execute(ctx, task, req, p)
}

// sameCandidate reports whether a resubmission asks for what the recorded
// request of its provider call id asked: the idempotency key names one
// candidate request, not whichever came first.
func sameCandidate(in *orchestratorv1.SubmitToolRequestRequest, r *orchestratorv1.ToolRequest) bool {
	return in.GetCapability() == r.GetCapability() && in.GetDocumentDigest() == r.GetDocumentDigest() &&
		proto.Equal(in.GetArguments(), r.GetArguments())
}

// replayedRefusal is the error of a resubmitted request that was
// refused, as the first submission saw it; nil for any other state.
func replayedRefusal(r *orchestratorv1.ToolRequest) error {
	if r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_REFUSED {
		return nil
	}
	code := codes.FailedPrecondition // refused before the code was recorded
	for c := codes.OK + 1; c <= codes.Unauthenticated; c++ {
		if codeName(c) == r.GetRefusalCode() {
			code = c
		}
	}
	return apierror.New(code, r.GetRefusalReason(), r.GetRefusalDetail(), map[string]string{"request_id": r.GetId()})
}

// withRequestID adds the id of the recorded request to a submission's or
// decision's error, so the caller can always read the request resource.
func withRequestID(err error, id string) error {
	if err == nil {
		return nil
	}
	reason := "DEPENDENCY_" + codeName(status.Code(err))
	return apierror.WithMetadata(err, reason, "request_id", id)
}

// executeInBackground records what was decided about an authorized
// request and executes it after returning (return_immediately): the
// caller follows it with GetRequest or WatchTask. The events of the
// decision are written before execution starts, so a watcher sees them
// first. A server closing waits for the execution (Close), as it would
// for a call in progress.
func (s *Server) executeInBackground(ctx context.Context, task *orchestratorv1.Task, req *orchestratorv1.ToolRequest, p *prepared) (*orchestratorv1.ToolRequest, error) {
	out, err := s.updateRequest(ctx, req.GetId(), func(r *orchestratorv1.ToolRequest) error {
		p.record(r)
		r.UpdateTime = s.timestamp()
		return nil
	}, nil)
	if err != nil {
		return nil, s.internal(ctx, "record the decided request", err)
	}
	s.flush(ctx)
	if s.ctx.Err() != nil {
		// Closing: run it here rather than start work nobody waits for.
		return s.execute(ctx, task, out, p)
	}
	release := leaseOf(ctx).handOff()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer release()
		// The call's work bound ends when it returns: the execution gets
		// one of its own, under the same lease.
		bctx, cancel := s.detach(ctx, leaseOf(ctx))
		defer cancel()
		bctx = withCheckpoint(bctx)
		defer s.flush(bctx)
		if _, err := s.execute(bctx, task, out, p); err != nil {
			s.log.WarnContext(bctx, "background execution ended with an error", "task", task.GetId(), "request", out.GetId(), "reason", apierror.Reason(err))
		}
	}()
	return proto.Clone(out).(*orchestratorv1.ToolRequest), nil
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
			fmt.Sprintf("task %s is %s; it accepts no requests", task.GetId(), stateName(task.GetState())),
			map[string]string{"task_id": task.GetId(), "state": stateName(task.GetState())})
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

// chargeResponse charges the bytes an attempt read to the task's and
// requester's budgets, keyed by the attempt so a retry is charged for what
// it read and a recovery never charges twice.
func (s *Server) chargeResponse(ctx context.Context, task *orchestratorv1.Task, att *orchestratorv1.Attempt, resp *adapterv1.ExecuteResponse) error {
	if resp.GetResponseBytes() <= 0 {
		return nil
	}
	_, err := s.deps.Policy.Charge(ctx, &policyv1.ChargeRequest{
		TaskId: task.GetId(), Requester: task.GetRequester().GetId(),
		ResponseBytes: resp.GetResponseBytes(), IdempotencyKey: att.GetId() + "/response-bytes",
	})
	return err
}

// withholdOverBudget fails a request whose call happened but whose
// response charge policy refused (err): the result would exceed a budget,
// so it is withheld, and the caller learns which budget.
func (s *Server) withholdOverBudget(ctx context.Context, req *orchestratorv1.ToolRequest, att *orchestratorv1.Attempt, err error) (*orchestratorv1.ToolRequest, error) {
	att.Error = &adapterv1.ErrorEvidence{SafeCode: codeBudgetExceeded}
	if _, ferr := s.fail(ctx, req, att); ferr != nil {
		return nil, ferr
	}
	return nil, apierror.Propagate(err, "charge response bytes")
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

func codeName(c codes.Code) string {
	// codes.Code.String gives e.g. "Unavailable" or "DeadlineExceeded";
	// turn it into UPPER_SNAKE.
	var b strings.Builder
	for i, r := range c.String() {
		if i > 0 && r >= 'A' && r <= 'Z' {
			b.WriteByte('_')
		}
		b.WriteRune(r)
	}
	return strings.ToUpper(b.String())
}
