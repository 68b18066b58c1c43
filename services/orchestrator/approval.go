package orchestrator

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"

	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	"github.com/v0m3/v0m3/services/internal/apierror"
)

// Approvals are deliberately minimal for now: an approval names the
// request and the approver, moves the request out of AWAITING_APPROVAL
// exactly once (compare-and-set in the store), and then every product check
// runs again on current state before execution. Binding an approval to the
// exact argument, document, mapping, policy and credential digests is a
// later step.

// awaitApproval parks a prepared request until a person decides.
func (s *Server) awaitApproval(ctx context.Context, req *orchestratorv1.ToolRequest, p *prepared) (*orchestratorv1.ToolRequest, error) {
	out, err := s.st.UpdateRequest(ctx, req.GetId(), func(r *orchestratorv1.ToolRequest) error {
		r.State = orchestratorv1.RequestState_REQUEST_STATE_AWAITING_APPROVAL
		p.record(r)
		r.UpdateTime = s.timestamp()
		return nil
	})
	if err != nil {
		return nil, s.internal(ctx, "record the request as awaiting approval", err)
	}
	s.trace(ctx, req.GetTaskId(), &evidencev1.ProductEvent{
		Kind: evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_APPROVAL, Capability: req.GetCapability(),
		RequestId: req.GetId(), IntentId: req.GetIntentId(),
		Detail: "approval required before execution; arguments " + p.argsDigest,
	})
	s.emit(ctx, req.GetTaskId(), req.GetId(), "request.awaiting_approval", req.GetCapability()+" needs approval")
	return out, nil
}

// Approve approves a request awaiting approval and executes it, after
// re-checking the task, catalogue, arguments, mapping, handles and policy.
func (s *Server) Approve(ctx context.Context, in *orchestratorv1.ApproveRequest) (*orchestratorv1.ToolRequest, error) {
	if in.GetRequestId() == "" {
		return nil, missing("request_id")
	}
	if in.GetApprover() == "" {
		return nil, missing("approver")
	}
	req, err := s.decide(ctx, in.GetRequestId(), orchestratorv1.RequestState_REQUEST_STATE_APPROVED, "", "")
	if err != nil {
		return nil, err
	}
	ctx = context.WithoutCancel(ctx)
	s.trace(ctx, req.GetTaskId(), &evidencev1.ProductEvent{
		Kind: evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_APPROVAL, Capability: req.GetCapability(),
		RequestId: req.GetId(), IntentId: req.GetIntentId(), Detail: "approved by " + in.GetApprover(),
	})
	s.emit(ctx, req.GetTaskId(), req.GetId(), "request.approved", "approved by "+in.GetApprover())

	task, err := s.loadTask(ctx, req.GetTaskId())
	if err != nil {
		return nil, err
	}
	p, err := s.prepare(ctx, task, req)
	if err != nil {
		return s.refuse(ctx, req, p, err)
	}
	if err := s.charge(ctx, task, req); err != nil {
		return s.refuse(ctx, req, p, err)
	}
	return s.execute(ctx, task, req, p)
}

// Deny denies a request awaiting approval.
func (s *Server) Deny(ctx context.Context, in *orchestratorv1.DenyRequest) (*orchestratorv1.ToolRequest, error) {
	if in.GetRequestId() == "" {
		return nil, missing("request_id")
	}
	if in.GetApprover() == "" {
		return nil, missing("approver")
	}
	detail := "denied by " + in.GetApprover()
	if in.GetReason() != "" {
		detail += ": " + in.GetReason()
	}
	req, err := s.decide(ctx, in.GetRequestId(), orchestratorv1.RequestState_REQUEST_STATE_DENIED, "APPROVAL_DENIED", detail)
	if err != nil {
		return nil, err
	}
	s.trace(ctx, req.GetTaskId(), &evidencev1.ProductEvent{
		Kind: evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_APPROVAL, Capability: req.GetCapability(),
		RequestId: req.GetId(), IntentId: req.GetIntentId(), Reason: "APPROVAL_DENIED", Detail: detail,
	})
	s.emit(ctx, req.GetTaskId(), req.GetId(), "request.denied", detail)
	return req, nil
}

// decide moves a request out of AWAITING_APPROVAL exactly once.
func (s *Server) decide(ctx context.Context, id string, to orchestratorv1.RequestState, reason, detail string) (*orchestratorv1.ToolRequest, error) {
	var notAwaiting error
	req, err := s.st.UpdateRequest(ctx, id, func(r *orchestratorv1.ToolRequest) error {
		if r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_AWAITING_APPROVAL {
			notAwaiting = apierror.New(codes.FailedPrecondition, "REQUEST_NOT_AWAITING_APPROVAL",
				fmt.Sprintf("request %s is %s; only a request awaiting approval can be approved or denied", r.GetId(), requestStateName(r.GetState())),
				map[string]string{"request_id": r.GetId()})
			return notAwaiting
		}
		r.State = to
		if reason != "" {
			r.RefusalReason, r.RefusalDetail = reason, detail
		}
		r.UpdateTime = s.timestamp()
		return nil
	})
	switch {
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
