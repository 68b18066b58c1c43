package orchestrator

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/internal/apierror"
)

// resume recovers attempts a previous process left open (it stopped between
// persisting an attempt and ending it). Each is recovered from its last
// persisted stage: the attempt is ended with the strongest outcome its
// evidence supports, then the capability's retry rule decides, exactly as
// after a failed attempt (see afterFailure), so a render that already
// produced its artifact is settled by its receipt or the server's status
// and never rendered twice. Dependencies may still be starting: a request
// whose recovery failed on an unavailable service is tried again with
// backoff until Close.
func (s *Server) resume(ctx context.Context, open []*orchestratorv1.ToolRequest) {
	for _, r := range open {
		backoff := watchBackoffMin
		for {
			err := s.recoverRequest(ctx, r.GetId())
			if err == nil || ctx.Err() != nil {
				break
			}
			if !transient(err) {
				s.log.ErrorContext(ctx, "recover request", "request", r.GetId(), "err", err)
				break
			}
			s.log.WarnContext(ctx, "recover request: dependency unavailable", "request", r.GetId(), "retry_in", backoff, "err", err)
			if !sleep(ctx, backoff) {
				return
			}
			backoff = min(backoff*2, watchBackoffMax)
		}
	}
}

// transient reports whether err may pass if tried again later.
func transient(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted, codes.ResourceExhausted, codes.Canceled:
		return true
	}
	return false
}

// recoverRequest recovers one request's open attempt.
func (s *Server) recoverRequest(ctx context.Context, id string) error {
	req, err := s.st.GetRequest(ctx, id)
	if err != nil {
		return fmt.Errorf("load request %s: %w", id, err)
	}
	var att *orchestratorv1.Attempt
	for _, a := range req.GetAttempts() {
		if a.GetEndTime() == nil {
			att = a
		}
	}
	if att == nil {
		return nil // already settled
	}
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
	retrieval := capb.GetEffectClass() == registryv1.EffectClass_EFFECT_CLASS_RETRIEVAL
	if att.GetOutcome() == adapterv1.Outcome_OUTCOME_UNSPECIFIED || att.GetOutcome() == adapterv1.Outcome_OUTCOME_OK {
		att.Outcome = adapterv1.Outcome_OUTCOME_UNKNOWN
		if retrieval {
			att.Outcome = adapterv1.Outcome_OUTCOME_INTERRUPTED
		}
		if att.GetError() == nil {
			att.Error = &adapterv1.ErrorEvidence{SafeCode: codeOrchestratorRestarted}
		}
	}
	att.Resolution = joinResolution(att.GetResolution(),
		fmt.Sprintf("the orchestrator stopped during this attempt (last persisted stage %s); recovered at restart", stageName(att.GetStage())))
	if req, err = s.st.SaveAttempt(ctx, req.GetId(), att); err != nil {
		return fmt.Errorf("persist recovered attempt: %w", err)
	}
	s.log.InfoContext(ctx, "recovering request", "request", req.GetId(), "attempt", att.GetId(), "stage", stageName(att.GetStage()))
	s.emit(ctx, task.GetId(), req.GetId(), "request.recovering", att.GetResolution())

	n := s.afterFailure(ctx, task, req, att, capb, m, conn, 0)
	switch n.action {
	case actionSettled:
		_, err := s.commit(ctx, task, req, n.att, nil, n.receipt)
		return err
	case actionRetry:
		att = n.att
		att.EndTime = s.timestamp()
		if req, err = s.st.SaveAttempt(ctx, req.GetId(), att); err != nil {
			return fmt.Errorf("end recovered attempt: %w", err)
		}
		return s.retryRecovered(ctx, task, req, att)
	default:
		_, err := s.fail(ctx, req, n.att)
		return err
	}
}

// retryRecovered makes the further attempt recovery decided on. The intent
// was authorized before the crash, but a new attempt is a new call: every
// product check runs again on current state, and an approval already used
// for this intent must still match its bindings (other than its expiry and
// the document the person saw, which were checked when it was used).
func (s *Server) retryRecovered(ctx context.Context, task *orchestratorv1.Task, req *orchestratorv1.ToolRequest, last *orchestratorv1.Attempt) error {
	stop := func(why string) error {
		last.Resolution = joinResolution(last.GetResolution(), why)
		_, err := s.fail(ctx, req, last)
		return err
	}
	p, err := s.prepare(ctx, task, req)
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
	_, err = s.executeFrom(ctx, task, req, p, 1)
	return err
}
