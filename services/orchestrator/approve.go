package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/authz"
	"github.com/v0m3/v0m3/internal/digest"
	"github.com/v0m3/v0m3/internal/ids"
	"github.com/v0m3/v0m3/internal/serving"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/orchestrator/lifecycle"
	ostore "github.com/v0m3/v0m3/services/orchestrator/store"
)

// DefaultApprovalTTL is how long an approval may be given after it was
// asked for, when Deps.ApprovalTTL is zero.
const DefaultApprovalTTL = 15 * time.Minute

// Approval refusal reasons.
const (
	reasonApprovalInvalidated = "APPROVAL_INVALIDATED"
	reasonApprovalUsed        = "APPROVAL_ALREADY_USED"
)

// An approval binds exactly what the person was shown: the normalized
// arguments digest, the document digest the product service supplied, the
// mapping revision, the policy revision and the connection's credential
// configuration revision, until an expiry. It is recorded when the request
// starts waiting (so GetApproval shows the review surface), every binding
// is recomputed from current state when the person approves, and the
// approval is used once, atomically in the store, before anything runs.

// awaitApproval parks a prepared request until a person decides, recording
// the approval it asks for.
func (s *Server) awaitApproval(ctx context.Context, req *orchestratorv1.ToolRequest, p *prepared) (*orchestratorv1.ToolRequest, error) {
	now := s.now()
	ap := &orchestratorv1.Approval{
		Id:              ids.New("apr"),
		RequestId:       req.GetId(),
		IntentId:        req.GetIntentId(),
		Capability:      req.GetCapability(),
		Summary:         p.summary,
		ArgumentsDigest: p.argsDigest,
		DocumentDigest:  req.GetDocumentDigest(),
		MappingId:       p.mapping.GetId(),
		MappingRevision: p.mapping.GetRevision(),
		PolicyRevision:  p.authz.GetPolicyRevision(),
		ConnectionId:    p.connection.GetId(),
		ConfigRevision:  serving.Revision(p.connection),
		CreateTime:      timestamppb.New(now),
		ExpireTime:      timestamppb.New(now.Add(s.approvalTTL)),
	}
	out, err := s.updateRequest(ctx, req.GetId(), func(r *orchestratorv1.ToolRequest) error {
		if err := lifecycle.Move(r, lifecycle.AskApproval, lifecycle.NoOutcome); err != nil {
			return err
		}
		r.Approval = ap
		p.record(r)
		r.UpdateTime = s.timestamp()
		return nil
	}, func(ctx context.Context) { s.traceAwaiting(ctx, req, ap) })
	if err != nil {
		return nil, s.internal(ctx, "record the request as awaiting approval", err)
	}
	if err := s.failAt(ctx, FailPointSubmitDecided); err != nil {
		return nil, err
	}
	return out, nil
}

// traceAwaiting tells that req awaits approval ap.
func (s *Server) traceAwaiting(ctx context.Context, req *orchestratorv1.ToolRequest, ap *orchestratorv1.Approval) {
	s.trace(ctx, req.GetTaskId(), &evidencev1.ProductEvent{
		Kind: evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_APPROVAL, Capability: req.GetCapability(),
		RequestId: req.GetId(), IntentId: req.GetIntentId(),
		Detail: fmt.Sprintf("approval %s asked: %s; bound to arguments %s, document %s, mapping %s r%d, policy %s, connection %s config r%d, until %s",
			ap.GetId(), ap.GetSummary(), ap.GetArgumentsDigest(), orNone(ap.GetDocumentDigest()), ap.GetMappingId(), ap.GetMappingRevision(),
			ap.GetPolicyRevision(), ap.GetConnectionId(), ap.GetConfigRevision(), ap.GetExpireTime().AsTime().UTC().Format(time.RFC3339)),
	})
	s.emit(ctx, req.GetTaskId(), req.GetId(), "request.awaiting_approval", ap.GetSummary())
}

// GetApproval returns a request's approval.
func (s *Server) GetApproval(ctx context.Context, in *orchestratorv1.GetApprovalRequest) (*orchestratorv1.Approval, error) {
	if in.GetRequestId() == "" {
		return nil, missing("request_id")
	}
	r, _, err := s.openRequest(ctx, in.GetRequestId(), authz.TaskRead)
	if err != nil {
		return nil, err
	}
	if r.GetApproval() == nil {
		return nil, apierror.New(codes.NotFound, "APPROVAL_UNKNOWN", "request "+r.GetId()+" never needed an approval", map[string]string{"request_id": r.GetId()})
	}
	return r.GetApproval(), nil
}

// Approve approves a request awaiting approval and executes it. Every
// binding of the approval is recomputed first; any difference refuses the
// request with APPROVAL_INVALIDATED naming the binding. Then every product
// check runs again on current state, the approval is used (once), and the
// request executes.
func (s *Server) Approve(ctx context.Context, in *orchestratorv1.ApproveRequest) (_ *orchestratorv1.ToolRequest, err error) {
	if in.GetRequestId() == "" {
		return nil, missing("request_id")
	}
	defer func() { err = withRequestID(err, in.GetRequestId()) }()
	req, task, approver, err := s.decider(ctx, in.GetRequestId(), authz.RequestApprove)
	if err != nil {
		return nil, err
	}
	if approvedBy(req, approver) {
		return req, nil
	}
	if err := approvable(req); err != nil {
		return nil, err
	}
	// The approver's call works on the request under this replica's
	// lease, as a submission does, from the approval on.
	l, err := s.ownToApprove(ctx, req.GetId())
	if err != nil {
		return nil, err
	}
	defer l.Release()
	ctx, cancel := s.detach(ctx, l)
	defer cancel()
	ctx = withCheckpoint(ctx)
	defer s.flush(ctx)
	binding, detail, err := s.checkBindings(ctx, task, req, in.GetDocumentDigest(), true)
	if err != nil {
		return nil, apierror.Propagate(err, "check approval bindings")
	}
	if binding != orchestratorv1.ApprovalBinding_APPROVAL_BINDING_UNSPECIFIED {
		return nil, s.invalidate(ctx, req, binding, detail)
	}
	p, err := s.prepare(ctx, task, nil, req, false)
	if err != nil {
		if req, lerr := s.loadRequest(ctx, req.GetId()); lerr == nil && approvable(req) != nil {
			return nil, approvable(req)
		}
		return s.refuseUnlessOutage(ctx, req, p, err)
	}
	// UseApproval's rule, with what tells of the approval's use written
	// in the same transaction.
	awaiting := req
	req, err = s.updateRequest(ctx, req.GetId(), ostore.UseApproval(approver, s.timestamp()), func(ctx context.Context) {
		s.trace(ctx, awaiting.GetTaskId(), &evidencev1.ProductEvent{
			Kind: evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_APPROVAL, Capability: awaiting.GetCapability(),
			RequestId: awaiting.GetId(), IntentId: awaiting.GetIntentId(),
			Detail: fmt.Sprintf("approval %s used by %s: %s", awaiting.GetApproval().GetId(), approver, awaiting.GetApproval().GetSummary()),
		})
		s.emit(ctx, awaiting.GetTaskId(), awaiting.GetId(), "request.approved", "approved by "+approver+": "+awaiting.GetApproval().GetSummary())
	})
	switch {
	case errors.Is(err, ostore.ErrApprovalUsed):
		if cur, lerr := s.loadRequest(ctx, in.GetRequestId()); lerr == nil && approvedBy(cur, approver) {
			return cur, nil
		}
		return nil, approvalUsed(in.GetRequestId())
	case errors.Is(err, ostore.ErrNotAwaiting):
		cur, lerr := s.loadRequest(ctx, in.GetRequestId())
		if lerr != nil {
			return nil, lerr
		}
		return nil, approvable(cur)
	case err != nil:
		return nil, s.internal(ctx, "use the approval", err)
	}
	if err := s.failAt(ctx, FailPointApprovalUsed); err != nil {
		return nil, err
	}
	if err := s.charge(ctx, task, req); err != nil {
		return s.refuseUnlessOutage(ctx, req, p, err)
	}
	if in.GetReturnImmediately() {
		return s.executeInBackground(ctx, task, req, p)
	}
	return s.execute(ctx, task, req, p)
}

// ownToApprove takes this replica's lease on a request to approve it.
// While another call holds it (most often a concurrent approval about to
// use the approval) it waits, a bounded time, for either the lease or a
// state that says why the request cannot be approved: of approvers racing,
// one wins and the others learn the approval was used.
func (s *Server) ownToApprove(ctx context.Context, id string) (*lease, error) {
	deadline := time.Now().Add(approveWait)
	for {
		l, ok, err := s.own(ctx, id)
		if err != nil {
			return nil, claimFailed("the request")
		}
		if ok {
			s.queueBehindOutbox(ctx)
			return l, nil
		}
		cur, err := s.loadRequest(ctx, id)
		if err != nil {
			return nil, err
		}
		if err := approvable(cur); err != nil {
			return nil, err
		}
		if time.Now().After(deadline) || !sleep(ctx, 20*time.Millisecond) {
			return nil, apierror.New(codes.Aborted, "REQUEST_IN_PROGRESS",
				fmt.Sprintf("request %s is being worked on; try again", id), map[string]string{"request_id": id})
		}
	}
}

// approveWait bounds how long an approval waits for another call on the
// same request.
const approveWait = 10 * time.Second

// decider loads a request and its task and returns who decides it when
// policy lets the caller take action (approve or deny) on it. Separation
// of duties is policy: the default forbids approving a request of one's
// own task.
func (s *Server) decider(ctx context.Context, id, action string) (*orchestratorv1.ToolRequest, *orchestratorv1.Task, string, error) {
	c, err := caller(ctx)
	if err != nil {
		return nil, nil, "", err
	}
	req, err := s.loadRequest(ctx, id)
	if err != nil {
		return nil, nil, "", err
	}
	task, err := s.loadTask(ctx, req.GetTaskId())
	if err != nil {
		return nil, nil, "", err
	}
	attrs := taskAttributes(task)
	attrs["capability"] = req.GetCapability()
	if err := s.require(ctx, task, action, authz.Resource{Type: "request", ID: req.GetId()}, attrs); err != nil {
		return nil, nil, "", err
	}
	return req, task, c.ID, nil
}

// approvedBy reports whether r's approval was already used by approver: a
// retry of an Approve whose reply was lost, which replays the request as
// recorded (running or done) instead of refusing it, as
// SubmitToolRequest replays its answer. Anyone else learns the approval
// was used.
func approvedBy(r *orchestratorv1.ToolRequest, approver string) bool {
	return r.GetApproval().GetUseTime() != nil && r.GetApproval().GetApprover() == approver
}

// deniedBy reports whether r was denied by denier: a retried Deny replays
// the request as recorded.
func deniedBy(r *orchestratorv1.ToolRequest, denier string) bool {
	return r.GetState() == orchestratorv1.RequestState_REQUEST_STATE_DENIED && r.GetApproval().GetDenier() == denier
}

// approvable says why a request cannot be approved now, or nil.
func approvable(r *orchestratorv1.ToolRequest) error {
	if r.GetApproval().GetUseTime() != nil {
		return approvalUsed(r.GetId())
	}
	if r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_AWAITING_APPROVAL || r.GetApproval() == nil {
		return apierror.New(codes.FailedPrecondition, "REQUEST_NOT_AWAITING_APPROVAL",
			fmt.Sprintf("request %s is %s; only a request awaiting approval can be approved or denied", r.GetId(), requestStateName(r.GetState())),
			map[string]string{"request_id": r.GetId()})
	}
	return nil
}

func approvalUsed(requestID string) error {
	return apierror.New(codes.FailedPrecondition, reasonApprovalUsed,
		fmt.Sprintf("the approval of request %s was already used; an approval authorizes one execution", requestID),
		map[string]string{"request_id": requestID})
}

// bindingName is the binding's name in metadata and messages, e.g.
// "credentials".
func bindingName(b orchestratorv1.ApprovalBinding) string {
	n := strings.ToLower(strings.TrimPrefix(b.String(), "APPROVAL_BINDING_"))
	if n == "expiry" {
		return "expired"
	}
	return n
}

// checkBindings recomputes every binding of req's approval from current
// state and returns the first that differs, with a human detail. With
// atApproval false (recovery of an approval already used) the expiry and
// the document are not checked again: the person's decision was taken in
// time and on the document then supplied. An error means a binding could
// not be computed (a dependency failed), not that it changed.
func (s *Server) checkBindings(ctx context.Context, task *orchestratorv1.Task, req *orchestratorv1.ToolRequest, seenDocument string, atApproval bool) (orchestratorv1.ApprovalBinding, string, error) {
	ap := req.GetApproval()
	none := orchestratorv1.ApprovalBinding_APPROVAL_BINDING_UNSPECIFIED
	if atApproval {
		if now := s.now(); !now.Before(ap.GetExpireTime().AsTime()) {
			return orchestratorv1.ApprovalBinding_APPROVAL_BINDING_EXPIRY,
				fmt.Sprintf("the approval expired at %s", ap.GetExpireTime().AsTime().UTC().Format(time.RFC3339)), nil
		}
		if seenDocument != ap.GetDocumentDigest() {
			return orchestratorv1.ApprovalBinding_APPROVAL_BINDING_DOCUMENT,
				fmt.Sprintf("the document digest approved (%s) is not the one the request was submitted with (%s)", orNone(seenDocument), orNone(ap.GetDocumentDigest())), nil
		}
	}
	capb, err := s.deps.Registry.GetCapability(ctx, &registryv1.GetCapabilityRequest{Name: req.GetCapability()})
	if err != nil {
		return none, "", err
	}
	normalized, nerr := normalizeArguments(capb.GetInputSchema(), req.GetArguments())
	argsDigest := ""
	if nerr == nil {
		argsDigest, _ = digest.JSON(normalized)
	}
	if argsDigest != ap.GetArgumentsDigest() {
		return orchestratorv1.ApprovalBinding_APPROVAL_BINDING_ARGUMENTS,
			fmt.Sprintf("the normalized arguments are now %s, the approval is bound to %s", orNone(argsDigest), ap.GetArgumentsDigest()), nil
	}
	conn, err := s.deps.Registry.GetConnection(ctx, &registryv1.GetConnectionRequest{Id: ap.GetConnectionId()})
	if err != nil {
		return none, "", err
	}
	if rev := serving.Revision(conn); rev != ap.GetConfigRevision() {
		return orchestratorv1.ApprovalBinding_APPROVAL_BINDING_CREDENTIALS,
			fmt.Sprintf("connection %s serves configuration revision %d, the approval is bound to revision %d", conn.GetId(), rev, ap.GetConfigRevision()), nil
	}
	pol, err := s.deps.Policy.GetPolicyRevision(ctx, &policyv1.GetPolicyRevisionRequest{})
	if err != nil {
		return none, "", err
	}
	if pol.GetRevision() != ap.GetPolicyRevision() {
		return orchestratorv1.ApprovalBinding_APPROVAL_BINDING_POLICY,
			fmt.Sprintf("policy revision %s is in force, the approval is bound to %s", pol.GetRevision(), ap.GetPolicyRevision()), nil
	}
	m, err := s.deps.Registry.ResolveMapping(ctx, &registryv1.ResolveMappingRequest{Capability: req.GetCapability(), MappingId: ap.GetMappingId()})
	switch c := status.Code(err); {
	case err == nil:
		if m.GetId() != ap.GetMappingId() || m.GetRevision() != ap.GetMappingRevision() {
			return orchestratorv1.ApprovalBinding_APPROVAL_BINDING_MAPPING,
				fmt.Sprintf("mapping %s is at revision %d, the approval is bound to revision %d", m.GetId(), m.GetRevision(), ap.GetMappingRevision()), nil
		}
	case c == codes.FailedPrecondition || c == codes.NotFound:
		return orchestratorv1.ApprovalBinding_APPROVAL_BINDING_MAPPING,
			fmt.Sprintf("mapping %s r%d is no longer usable: %s", ap.GetMappingId(), ap.GetMappingRevision(), errorMessage(err)), nil
	default:
		return none, "", err
	}
	return none, "", nil
}

// invalidate refuses a request whose approval no longer matches current
// state, records which binding changed, and returns the error the approver
// sees. The request stays refused: a new review is a new request.
func (s *Server) invalidate(ctx context.Context, req *orchestratorv1.ToolRequest, binding orchestratorv1.ApprovalBinding, detail string) error {
	name := bindingName(binding)
	msg := fmt.Sprintf("the approval of request %s is no longer valid: %s changed (%s); submit the request again for a new review", req.GetId(), name, detail)
	cause := apierror.New(codes.FailedPrecondition, reasonApprovalInvalidated, msg,
		map[string]string{"binding": name, "request_id": req.GetId(), "approval_id": req.GetApproval().GetId()})
	_, err := s.updateRequest(ctx, req.GetId(), func(r *orchestratorv1.ToolRequest) error {
		if err := approvable(r); err != nil {
			return err
		}
		if err := lifecycle.Move(r, lifecycle.Refuse, lifecycle.NoOutcome); err != nil {
			return err
		}
		r.RefusalReason, r.RefusalDetail = reasonApprovalInvalidated, msg
		r.RefusalCode = codeName(codes.FailedPrecondition)
		r.Approval.Invalidated, r.Approval.InvalidatedDetail = binding, detail
		r.UpdateTime = s.timestamp()
		return nil
	}, func(ctx context.Context) {
		s.trace(ctx, req.GetTaskId(), &evidencev1.ProductEvent{
			Kind: evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_REQUEST_REFUSED, Capability: req.GetCapability(),
			RequestId: req.GetId(), IntentId: req.GetIntentId(), Reason: reasonApprovalInvalidated, Detail: msg,
		})
		s.emit(ctx, req.GetTaskId(), req.GetId(), "request.refused", reasonApprovalInvalidated+": "+name+" changed")
	})
	if err != nil {
		if apierror.Reason(err) != "" {
			return err
		}
		return s.internal(ctx, "record the invalidated approval", err)
	}
	s.log.InfoContext(ctx, "approval invalidated", "request", req.GetId(), "binding", name)
	return cause
}

// Deny denies a request awaiting approval.
func (s *Server) Deny(ctx context.Context, in *orchestratorv1.DenyRequest) (_ *orchestratorv1.ToolRequest, err error) {
	if in.GetRequestId() == "" {
		return nil, missing("request_id")
	}
	defer func() { err = withRequestID(err, in.GetRequestId()) }()
	req, _, approver, err := s.decider(ctx, in.GetRequestId(), authz.RequestDeny)
	if err != nil {
		return nil, err
	}
	if deniedBy(req, approver) {
		return req, nil
	}
	detail := "denied by " + approver
	if in.GetReason() != "" {
		detail += ": " + in.GetReason()
	}
	s.queueBehindOutbox(ctx)
	return s.decide(ctx, in.GetRequestId(), lifecycle.Deny, approver, "APPROVAL_DENIED", detail, func(ctx context.Context) {
		s.trace(ctx, req.GetTaskId(), &evidencev1.ProductEvent{
			Kind: evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_APPROVAL, Capability: req.GetCapability(),
			RequestId: req.GetId(), IntentId: req.GetIntentId(), Reason: "APPROVAL_DENIED", Detail: detail,
		})
		s.emit(ctx, req.GetTaskId(), req.GetId(), "request.denied", detail)
	})
}

// decide moves a request out of AWAITING_APPROVAL exactly once, by
// decider, by event (Deny), with what tell traces and emits of it. A concurrent retry by
// the same decider that lost the race replays the decision.
func (s *Server) decide(ctx context.Context, id string, event lifecycle.Event, decider, reason, detail string, tell func(context.Context)) (*orchestratorv1.ToolRequest, error) {
	var (
		notAwaiting error
		replay      *orchestratorv1.ToolRequest
	)
	req, err := s.updateRequest(ctx, id, func(r *orchestratorv1.ToolRequest) error {
		if deniedBy(r, decider) {
			replay = r
			return errReplay
		}
		if err := approvable(r); err != nil {
			notAwaiting = err
			return err
		}
		if err := lifecycle.Move(r, event, lifecycle.NoOutcome); err != nil {
			return err
		}
		r.Approval.Denier = decider
		if reason != "" {
			r.RefusalReason, r.RefusalDetail = reason, detail
		}
		r.UpdateTime = s.timestamp()
		return nil
	}, tell)
	switch {
	case replay != nil && errors.Is(err, errReplay):
		return replay, nil
	case notAwaiting != nil && errors.Is(err, notAwaiting):
		return nil, notAwaiting
	case err != nil:
		if _, lerr := s.loadRequest(ctx, id); lerr != nil {
			return nil, lerr
		}
		return nil, s.internal(ctx, "record the decision", err)
	}
	return req, nil
}

// errReplay stops an update that finds the decision already recorded.
var errReplay = errors.New("orchestrator: the decision is already recorded")

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
