package orchestrator

import (
	"context"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/ids"
	"github.com/v0m3/v0m3/internal/store"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	"github.com/v0m3/v0m3/services/orchestrator/lifecycle"
)

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
	s.leases.Reserve(id)
	var l *lease
	defer func() {
		if l != nil {
			l.Release()
		} else {
			s.leases.Unreserve(id)
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
	l = s.leases.Leased(id, c.LeaseGeneration, asked)
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
	release := leaseOf(ctx).HandOff()
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
