package orchestrator

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/v0m3/v0m3/internal/apierror"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/orchestrator/lifecycle"
)

// recoverLoop recovers, until Close, every unsettled request no replica
// owns: at start (what a previous process left) and then every
// RecoveryInterval (what a replica that stopped left, once its lease
// expired). Each request is worked on under this replica's lease, so with
// several replicas on one store each is recovered by one of them.
func (s *Server) recoverLoop(ctx context.Context) {
	for {
		s.deliverOutbox(ctx)
		s.recordHeldResults(ctx)
		s.recoverUnsettled(ctx)
		s.passed()
		if !sleep(ctx, s.recoveryInterval) {
			return
		}
	}
}

// recoverUnsettled makes one pass over the unsettled requests, a few at a
// time (one stuck on a slow server does not hold up the others). A request
// whose recovery failed on an unavailable dependency stays as it is and is
// tried again on the next pass.
func (s *Server) recoverUnsettled(ctx context.Context) {
	rs, err := s.st.ListUnsettledRequests(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.log.WarnContext(ctx, "list unsettled requests for recovery", "err", err)
		}
		return
	}
	s.forgetSettled(rs)
	rs = slices.DeleteFunc(rs, func(r *orchestratorv1.ToolRequest) bool { return !s.needsRecovery(r) })
	recoverEach(ctx, rs, func(r *orchestratorv1.ToolRequest) { s.recoverOwned(ctx, r.GetId()) })
}

// recoveryParallelism bounds the requests one replica recovers at once.
const recoveryParallelism = 4

// recoverEach calls fn for each item, recoveryParallelism at a time, until
// ctx ends; it returns when the calls it started have returned.
func recoverEach[T any](ctx context.Context, items []T, fn func(T)) {
	var wg sync.WaitGroup
	defer wg.Wait()
	slots := make(chan struct{}, recoveryParallelism)
	for _, it := range items {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		wg.Go(func() {
			defer func() { <-slots }()
			fn(it)
		})
	}
}

// recoverOwned recovers one request if no replica (nor another call of
// this one) owns it.
func (s *Server) recoverOwned(ctx context.Context, id string) {
	l, ok, err := s.own(ctx, id)
	if err != nil {
		s.log.WarnContext(ctx, "recover request: take lease", "request", id, "err", err)
		return
	}
	if !ok {
		return // another replica (or call) is working on it
	}
	// Recovery of one request is bounded as a caller's detached work is.
	wctx, cancel := context.WithTimeout(withLease(ctx, l), s.workTimeout)
	err = s.recoverRequest(wctx, id)
	cancel()
	l.Release()
	switch {
	case err == nil || ctx.Err() != nil:
	case transient(err):
		s.log.WarnContext(ctx, "recover request: dependency unavailable; retried on the next pass", "request", id, "retry_in", s.recoveryInterval, "err", err)
	default:
		s.log.ErrorContext(ctx, "recover request", "request", id, "err", err)
	}
}

// needsRecovery reports whether an unsettled request may need work from
// recovery: a request waiting for a person needs none until its approval
// expires (read without taking its lease, so waiting costs no writes).
func (s *Server) needsRecovery(r *orchestratorv1.ToolRequest) bool {
	if awaitingSettlement(r) {
		return s.settleDue(r.GetId())
	}
	if r.GetState() == orchestratorv1.RequestState_REQUEST_STATE_AWAITING_APPROVAL && openAttempt(r) == nil {
		return !s.now().Before(r.GetApproval().GetExpireTime().AsTime())
	}
	return true
}

// transient reports whether err may pass if tried again later: a
// dependency that could not be reached or did not answer in time, a lost
// lease, a call cut off. RESOURCE_EXHAUSTED is not: every reason that
// uses it (a budget exceeded, a response or observation over its limit, a
// message over the transport's) gives the same answer on every try, so a
// request it stops is refused or failed, not decided again forever.
func transient(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted, codes.Canceled:
		return true
	}
	return false
}

// recoverRequest settles or continues one request, under this replica's
// lease, from its stored state: an open attempt is recovered from its last
// persisted stage (see recoverAttempt); a request that was never decided
// is decided again; an approved request with no attempt is executed; an
// approval that expired unused refuses the request. Every step is
// idempotent: the decision is taken again on current state, charges are
// keyed by the intent, and the adapter is called only for an attempt that
// recovery itself persisted.
func (s *Server) recoverRequest(ctx context.Context, id string) error {
	req, err := s.st.GetRequest(ctx, id)
	if err != nil {
		return fmt.Errorf("load request %s: %w", id, err)
	}
	if awaitingSettlement(req) {
		ctx = withCheckpoint(ctx)
		defer s.flush(ctx)
		return s.settleUnknown(ctx, req)
	}
	if !unsettled(req) {
		return nil // settled since it was listed
	}
	ctx = withCheckpoint(ctx)
	defer s.flush(ctx)
	if openAttempt(req) != nil {
		return s.recoverAttempt(ctx, req)
	}
	task, err := s.st.GetTask(ctx, req.GetTaskId())
	if err != nil {
		return fmt.Errorf("load task %s: %w", req.GetTaskId(), err)
	}
	switch req.GetState() {
	case orchestratorv1.RequestState_REQUEST_STATE_AWAITING_APPROVAL:
		if s.now().Before(req.GetApproval().GetExpireTime().AsTime()) {
			return nil
		}
		detail := fmt.Sprintf("the approval expired at %s", req.GetApproval().GetExpireTime().AsTime().UTC().Format(time.RFC3339))
		err := s.invalidate(ctx, req, orchestratorv1.ApprovalBinding_APPROVAL_BINDING_EXPIRY, detail)
		if apierror.Reason(err) == reasonApprovalInvalidated {
			return nil
		}
		return err
	case orchestratorv1.RequestState_REQUEST_STATE_REQUESTED, orchestratorv1.RequestState_REQUEST_STATE_APPROVED:
	default:
		return nil
	}
	s.log.InfoContext(ctx, "recovering request", "request", req.GetId(), "state", requestStateName(req.GetState()), "attempts", len(req.GetAttempts()))
	s.emit(ctx, task.GetId(), req.GetId(), "request.recovering",
		fmt.Sprintf("the orchestrator stopped while the request was %s; recovered", requestStateName(req.GetState())))
	if req.GetState() == orchestratorv1.RequestState_REQUEST_STATE_REQUESTED && len(req.GetAttempts()) == 0 {
		return s.decideAgain(ctx, task, req)
	}
	// Approved, or between two attempts: the next attempt is made on
	// current state, with the retries already spent.
	var last *orchestratorv1.Attempt
	if n := len(req.GetAttempts()); n > 0 {
		last = req.GetAttempts()[n-1]
	}
	return s.retryRecovered(ctx, task, req, last, retriesSpent(req))
}

// decideAgain takes the decision a stopped replica did not finish about a
// request: the same checks on current state, the same intent (so a budget
// is charged once), and then approval or execution as at submission. A
// dependency that is unavailable leaves the request for the next pass
// instead of refusing it.
func (s *Server) decideAgain(ctx context.Context, task *orchestratorv1.Task, req *orchestratorv1.ToolRequest) error {
	p, err := s.prepare(ctx, task, nil, req, true)
	if err != nil {
		if transient(err) {
			return err
		}
		_, err = s.refuse(ctx, req, p, err)
		return ignoreRefusal(err)
	}
	if p.approvalRequired {
		_, err = s.awaitApproval(ctx, req, p)
		return err
	}
	_, err = s.execute(ctx, task, req, p)
	return ignoreRefusal(err)
}

// ignoreRefusal drops the error a caller would have seen for a request
// that was recorded as refused or failed: for recovery, that is an end.
// A storage failure or an unavailable dependency is not: the request is
// tried again on the next pass.
func ignoreRefusal(err error) error {
	if err == nil || transient(err) || status.Code(err) == codes.Internal {
		return err
	}
	return nil
}

// recoverAttempt recovers a request's open attempt.
func (s *Server) recoverAttempt(ctx context.Context, req *orchestratorv1.ToolRequest) error {
	att := openAttempt(req)
	task, err := s.st.GetTask(ctx, req.GetTaskId())
	if err != nil {
		return fmt.Errorf("load task %s: %w", req.GetTaskId(), err)
	}
	capb, err := s.deps.Registry.GetCapability(ctx, &registryv1.GetCapabilityRequest{Name: req.GetCapability()})
	if err != nil {
		return err
	}
	m, err := s.deps.Registry.GetMapping(ctx, &registryv1.GetMappingRequest{Id: req.GetMappingId(), Revision: req.GetMappingRevision()})
	if err != nil {
		return err
	}
	conn, err := s.deps.Registry.GetConnection(ctx, &registryv1.GetConnectionRequest{Id: m.GetConnectionId()})
	if err != nil {
		return err
	}

	// End the interrupted attempt by the strongest evidence persisted. A
	// reply that was observed but not committed is not evidence any more
	// (its content died with the process), so it counts as unknown.
	// A read's unknown is interrupted, as for a call's answer (see
	// lifecycle.Classify).
	if att.GetOutcome() == adapterv1.Outcome_OUTCOME_UNSPECIFIED || att.GetOutcome() == adapterv1.Outcome_OUTCOME_OK {
		if err := lifecycle.MoveAttempt(req.GetState(), att, lifecycle.Interrupt, lifecycle.Keep,
			lifecycle.Classify(capb.GetEffectClass(), lifecycle.Unknown, "")); err != nil {
			return fmt.Errorf("end the interrupted attempt: %w", err)
		}
		if att.GetError() == nil {
			att.Error = &adapterv1.ErrorEvidence{SafeCode: codeOrchestratorRestarted}
		}
	}
	why := fmt.Sprintf("the orchestrator stopped during this attempt (last persisted stage %s); recovered", stageName(att.GetStage()))
	if awaitsObservation(att) {
		why = "the result awaiting its observation is not held here any more (the orchestrator restarted, or another replica recovers it); recovered"
	}
	att.Resolution = joinResolution(att.GetResolution(), why)
	if req, err = s.saveAttempt(ctx, req.GetId(), att, func(ctx context.Context) {
		s.emit(ctx, task.GetId(), req.GetId(), "request.recovering", att.GetResolution())
	}); err != nil {
		return fmt.Errorf("persist recovered attempt: %w", err)
	}
	s.log.InfoContext(ctx, "recovering request", "request", req.GetId(), "attempt", att.GetId(), "stage", stageName(att.GetStage()))

	// The attempts before this one spent retries as a call's would: a
	// request recovered on every pass (a read whose result is not held
	// while evidence stays down) is not retried anew on each.
	retries := retriesSpent(req)
	n := s.afterFailure(ctx, task, req, att, capb, m, conn, retries)
	switch n.action {
	case actionSettled:
		_, err := s.commit(ctx, task, req, n.att, nil, n.receipt)
		return err
	case actionRetry:
		att = n.att
		if err := lifecycle.MoveAttempt(req.GetState(), att, lifecycle.EndAttempt, lifecycle.Keep, lifecycle.NoOutcome); err != nil {
			return fmt.Errorf("end recovered attempt: %w", err)
		}
		att.EndTime = s.timestamp()
		if req, err = s.saveAttempt(ctx, req.GetId(), att, nil); err != nil {
			return fmt.Errorf("end recovered attempt: %w", err)
		}
		return s.retryRecovered(ctx, task, req, att, retries+1)
	default:
		_, err := s.fail(ctx, req, n.att)
		return err
	}
}

// retryRecovered makes the further attempt recovery decided on (the first,
// for an approved request that has none; retries are those spent). The intent
// was authorized before the crash, but a new attempt is a new call: every
// product check runs again on current state, and an approval already used
// for this intent must still match its bindings (other than its expiry and
// the document the person saw, which were checked when it was used).
func (s *Server) retryRecovered(ctx context.Context, task *orchestratorv1.Task, req *orchestratorv1.ToolRequest, last *orchestratorv1.Attempt, retries int) error {
	var p *prepared
	stop := func(why string) error {
		if last == nil {
			_, err := s.refuse(ctx, req, p, apierror.New(codes.FailedPrecondition, "NOT_ATTEMPTED", why, map[string]string{"request_id": req.GetId()}))
			return ignoreRefusal(err)
		}
		last.Resolution = joinResolution(last.GetResolution(), why)
		_, err := s.fail(ctx, req, last)
		return err
	}
	p, err := s.prepare(ctx, task, nil, req, false)
	if err != nil {
		if transient(err) {
			return err
		}
		return stop("not attempted again: " + apierror.Reason(apierror.Propagate(err, "prepare")) + ": " + errorMessage(err))
	}
	if req.GetApproval() != nil {
		binding, detail, err := s.checkBindings(ctx, task, req, "", false)
		if err != nil {
			return err
		}
		if binding != orchestratorv1.ApprovalBinding_APPROVAL_BINDING_UNSPECIFIED {
			return stop(fmt.Sprintf("not attempted again: the approval no longer holds (%s changed: %s)", bindingName(binding), detail))
		}
	}
	if last == nil {
		// Approved and never attempted: the call is charged under its
		// intent, which a charge made before the stop already was.
		if err := s.charge(ctx, task, req); err != nil {
			if transient(err) {
				return err
			}
			// A budget spent is the decision: refused with its reason.
			_, err = s.refuse(ctx, req, p, err)
			return ignoreRefusal(err)
		}
	}
	_, err = s.executeFrom(ctx, task, req, p, retries)
	return ignoreRefusal(err)
}

// retriesSpent is how many retries r's ended attempts spent, as
// executeFrom counts them: each, but one refused at a config revision
// the connection had left (a rotation followed, not a retry).
func retriesSpent(r *orchestratorv1.ToolRequest) int {
	n := 0
	for _, a := range r.GetAttempts() {
		followed := a.GetError().GetSafeCode() == reasonConfigRevisionChanged && a.GetStage() == adapterv1.DeliveryStage_DELIVERY_STAGE_PREPARED
		if a.GetEndTime() != nil && !followed {
			n++
		}
	}
	return n
}
