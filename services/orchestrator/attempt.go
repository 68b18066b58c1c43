package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/ids"
	"github.com/v0m3/v0m3/internal/receipt"
	"github.com/v0m3/v0m3/internal/serving"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/orchestrator/lifecycle"
)

// maxUntrustedDetail bounds untrusted error text kept in a record.
const maxUntrustedDetail = 512

// DefaultAttemptTimeout bounds one adapter call when Deps.AttemptTimeout is
// zero. The adapter enforces its own limits; this only keeps a wedged call
// from holding a request forever. A call cut off here has an unknown
// outcome, like any other broken call.
const DefaultAttemptTimeout = 2 * time.Minute

// Safe codes the orchestrator itself puts into error evidence.
const (
	codeResponseLimitExceeded  = "RESPONSE_LIMIT_EXCEEDED"
	codeBudgetExceeded         = "BUDGET_EXCEEDED"
	codeObservationNotRecorded = "OBSERVATION_NOT_RECORDED"
	codeReceiptMissing         = "RECEIPT_MISSING"
	codeReceiptNotRecorded     = "RECEIPT_NOT_RECORDED"
	codeOrchestratorRestarted  = "ORCHESTRATOR_RESTARTED"
	// codeMalformedResult is the adapter's code for a result it could not
	// accept as the tool's answer (see adapter.CodeMalformedResult).
	codeMalformedResult = lifecycle.CodeMalformedResult
)

// reasonConfigRevisionChanged is the adapter's refusal of a call granted
// at a config revision the connection has left; nothing was sent.
const reasonConfigRevisionChanged = "CONFIG_REVISION_CHANGED"

// maxRevisionFollows bounds how many rotations one execution follows: more
// in the time of one call means the connection is not settling.
const maxRevisionFollows = 3

// followRotation decides whether an attempt the adapter refused because
// the connection moved to a new config revision may be made again at that
// revision, and returns the connection there with the reason, or nil. It
// may when nothing was sent, no person approved the request (an approval
// binds the revision it was given at: that stays invalidated), and the
// mapping the call was authorized through is still the active one at the
// new revision, the connection still approved: a rotation within the
// declared credential scope, which the registry says by keeping the
// mapping active. Policy decided on the mapping revision, which did not
// change. A new grant binds the new revision.
func (s *Server) followRotation(ctx context.Context, req *orchestratorv1.ToolRequest, att *orchestratorv1.Attempt, p *prepared) (*registryv1.Connection, string) {
	if att.GetError().GetSafeCode() != reasonConfigRevisionChanged || att.GetStage() != adapterv1.DeliveryStage_DELIVERY_STAGE_PREPARED || req.GetApproval() != nil {
		return nil, ""
	}
	conn, err := s.deps.Registry.GetConnection(ctx, &registryv1.GetConnectionRequest{Id: p.connection.GetId()})
	if err != nil || serving.Revision(conn) <= serving.Revision(p.connection) ||
		conn.GetState() != registryv1.ConnectionState_CONNECTION_STATE_ACTIVE || conn.GetReviewState() != registryv1.ReviewState_REVIEW_STATE_APPROVED {
		return nil, ""
	}
	if _, err := s.deps.Registry.ResolveMapping(ctx, &registryv1.ResolveMappingRequest{
		Capability: req.GetCapability(), MappingId: p.mapping.GetId(), Revision: p.mapping.GetRevision(), ConnectionId: conn.GetId(),
	}); err != nil {
		return nil, ""
	}
	return conn, fmt.Sprintf("connection %s moved from config revision %d to %d (mapping %s r%d still active); attempting again at revision %d",
		conn.GetId(), serving.Revision(p.connection), serving.Revision(conn), p.mapping.GetId(), p.mapping.GetRevision(), serving.Revision(conn))
}

// servingNote is "; " and why the connection's latest config revision does
// not serve, or "" when it does: the trace says which credential a call
// used and why not the newest.
func servingNote(c *registryv1.Connection) string {
	if n := serving.Note(c); n != "" {
		return "; " + n
	}
	return ""
}

// maxAutomaticRetries is how many further attempts one execution may make
// on its own, when the capability's retry rule allows any.
const maxAutomaticRetries = lifecycle.MaxAutomaticRetries

// execute runs a prepared, authorized request to a committed or failed
// end: one attempt, and when it fails, what the capability's retry rule
// allows (see afterFailure).
func (s *Server) execute(ctx context.Context, task *orchestratorv1.Task, req *orchestratorv1.ToolRequest, p *prepared) (*orchestratorv1.ToolRequest, error) {
	return s.executeFrom(ctx, task, req, p, 0)
}

// executeFrom is execute with retries already spent.
func (s *Server) executeFrom(ctx context.Context, task *orchestratorv1.Task, req *orchestratorv1.ToolRequest, p *prepared, retries int) (*orchestratorv1.ToolRequest, error) {
	remote, err := remoteArguments(p.mapping, p.normalized, p.targets)
	if err != nil {
		return s.refuse(ctx, req, p, apierror.New(codes.FailedPrecondition, "MAPPING_UNUSABLE",
			fmt.Sprintf("mapping %s r%d cannot build remote arguments: %v", p.mapping.GetId(), p.mapping.GetRevision(), err), nil))
	}
	// The intent id is the idempotency key: every attempt at one intent
	// carries the same key, so the server can refuse to repeat the effect.
	if k := p.mapping.GetIdempotencyKeyField(); k != "" && p.target.GetKind() == registryv1.RemoteKind_REMOTE_KIND_TOOL {
		remote.Fields[k] = structpb.NewStringValue(req.GetIntentId())
	}
	follows := 0
	for {
		var (
			att  *orchestratorv1.Attempt
			resp *adapterv1.ExecuteResponse
		)
		req, att, resp, err = s.attempt(ctx, task, req, p, remote)
		if err != nil {
			return nil, err
		}
		if att.GetOutcome() == adapterv1.Outcome_OUTCOME_OK {
			if observes(p.capability) {
				// A read charges its response when it is recorded, so
				// a policy outage waits like an evidence one (see
				// recordResult).
				return s.recordResult(ctx, task, req, att, &unrecordedResult{p: p, remote: remote, resp: resp})
			}
			if err := s.chargeResponse(ctx, task, att, resp); transient(err) {
				// The effect happened: a policy outage does not make it
				// fail. Its response goes uncharged, and the log says so.
				s.log.WarnContext(ctx, "response bytes not charged: policy unavailable", "request", req.GetId(), "attempt", att.GetId(), "bytes", resp.GetResponseBytes(), "err", err)
			} else if err != nil {
				return s.withholdOverBudget(ctx, req, att, err)
			}
			return s.complete(ctx, task, req, att, p, remote, resp)
		}
		if code := att.GetError().GetSafeCode(); code == codeResponseLimitExceeded {
			return s.fail(ctx, req, att)
		}
		if follows < maxRevisionFollows {
			if conn, why := s.followRotation(ctx, req, att, p); conn != nil {
				follows++
				if err := lifecycle.MoveAttempt(req.GetState(), att, lifecycle.EndAttempt, lifecycle.Keep, lifecycle.NoOutcome); err != nil {
					return nil, s.internal(ctx, "end the attempt refused at the old config revision", err)
				}
				att.Resolution = joinResolution(att.GetResolution(), why)
				att.EndTime = s.timestamp()
				if req, err = s.saveAttempt(ctx, req.GetId(), att, func(ctx context.Context) {
					s.emit(ctx, task.GetId(), req.GetId(), "request.revision_followed", why)
				}); err != nil {
					return nil, s.internal(ctx, "end the attempt refused at the old config revision", err)
				}
				p.setConnection(conn)
				continue
			}
		}
		next := s.afterFailure(ctx, task, req, att, p.capability, p.mapping, p.connection, retries)
		switch next.action {
		case actionSettled:
			return s.commit(ctx, task, req, next.att, nil, next.receipt)
		case actionRetry:
			retries++
			att = next.att
			if err := lifecycle.MoveAttempt(req.GetState(), att, lifecycle.EndAttempt, lifecycle.Keep, lifecycle.NoOutcome); err != nil {
				return nil, s.internal(ctx, "end the failed attempt", err)
			}
			att.EndTime = s.timestamp()
			if req, err = s.saveAttempt(ctx, req.GetId(), att, func(ctx context.Context) {
				s.emit(ctx, task.GetId(), req.GetId(), "request.retrying", att.GetResolution())
			}); err != nil {
				return nil, s.internal(ctx, "end the failed attempt", err)
			}
			continue
		default:
			return s.fail(ctx, req, next.att)
		}
	}
}

// attempt makes one attempt: it persists the attempt as PREPARED before
// anything is sent, calls the adapter, and persists the stage and outcome
// the adapter reports. The attempt stays open (no end time) until the
// caller commits or fails it, so a crash in between is recovered.
func (s *Server) attempt(ctx context.Context, task *orchestratorv1.Task, req *orchestratorv1.ToolRequest, p *prepared, remote *structpb.Struct) (*orchestratorv1.ToolRequest, *orchestratorv1.Attempt, *adapterv1.ExecuteResponse, error) {
	att := &orchestratorv1.Attempt{
		Id:        ids.New("att"),
		IntentId:  req.GetIntentId(),
		Number:    int32(len(req.GetAttempts()) + 1),
		StartTime: s.timestamp(),
	}
	// The events held until now are written with the prepared attempt, in
	// one transaction, and the call's trace is delivered before the
	// adapter is called.
	req, err := s.updateRequest(ctx, req.GetId(), func(r *orchestratorv1.ToolRequest) error {
		if err := lifecycle.MoveAttempt(r.GetState(), att, lifecycle.Prepare, lifecycle.Prepared, lifecycle.NoOutcome); err != nil {
			return err
		}
		mergeAttempt(r, att)
		p.record(r)
		r.UpdateTime = s.timestamp()
		return nil
	}, nil)
	if err != nil {
		// Nothing was sent. The request stays as stored, and recovery
		// makes the attempt: the caller follows it (resubmitting the
		// same provider call id finds it), and must not resubmit under
		// a new call id, which would be a second intent.
		return nil, nil, nil, s.internal(ctx, "persist the prepared attempt", err)
	}
	s.flushTrace(ctx)
	if err := s.failAt(ctx, FailPointAttemptPrepared); err != nil {
		return nil, nil, nil, err
	}
	if err := stillOwner(ctx); err != nil {
		// The attempt stays open for the replica that took over.
		return nil, nil, nil, err
	}

	in := &adapterv1.ExecuteRequest{
		ConnectionId:    p.mapping.GetConnectionId(),
		ConfigRevision:  serving.Revision(p.connection),
		MappingId:       p.mapping.GetId(),
		MappingRevision: p.mapping.GetRevision(),
		Target:          p.target,
		Arguments:       remote,
		Limits:          p.mapping.GetLimits(),
		TaskId:          task.GetId(),
		AttemptId:       att.GetId(),
		SnapshotId:      p.mapping.GetSnapshotId(),
		// The reviewed output schema travels with the mapping the
		// registry resolved for this call: no further lookup, and the
		// grant binds it.
		OutputSchema:     p.mapping.GetOutputSchema(),
		ConnectionDigest: p.freshConnection(),
		// A read's result becomes an observation, never a receipt: no
		// attestation of it is ever checked.
		OmitReceiptAttestation: observes(p.capability),
	}
	if p.target.GetKind() != registryv1.RemoteKind_REMOTE_KIND_TOOL {
		in.OutputSchema = nil
	}
	resp, grantID, callErr := s.call(ctx, in, req.GetIntentId(), req.GetCapability(), task, p.connection)
	if callErr != nil {
		resp = responseFromCallError(callErr)
	}
	if resp.GetOutcome() == adapterv1.Outcome_OUTCOME_OK && !observes(p.capability) {
		// An effect is believed only with the adapter's attestation of
		// exactly this call; without one, what happened is not known.
		if resp.ReceiptAttestation, err = s.attestation(in, resp, grantID, req.GetIntentId()); err != nil {
			s.log.ErrorContext(ctx, "adapter result without a valid receipt attestation", "request", req.GetId(), "attempt", att.GetId(), "err", err)
			reason := receipt.ReasonInvalid
			var re *receipt.Error
			if errors.As(err, &re) {
				reason = re.Reason
			}
			resp = &adapterv1.ExecuteResponse{Outcome: adapterv1.Outcome_OUTCOME_UNKNOWN, Stage: resp.GetStage(), Method: resp.GetMethod(),
				ResponseBytes: resp.GetResponseBytes(), Error: &adapterv1.ErrorEvidence{SafeCode: reason}}
		}
	}
	// The strongest evidence the answer reached (see lifecycle.Classify):
	// an effect's malformed result is unknown, a read's unknown is
	// interrupted.
	outcome := lifecycle.Classify(p.capability.GetEffectClass(), resp.GetOutcome(), resp.GetError().GetSafeCode())
	if err := lifecycle.MoveAttempt(req.GetState(), att, lifecycle.Report, resp.GetStage(), outcome); err != nil {
		// Receipt and commit are the orchestrator's own evidence: an
		// adapter that claims them is not believed, and what happened
		// is not known.
		s.log.ErrorContext(ctx, "adapter reported a stage it cannot reach", "request", req.GetId(), "attempt", att.GetId(), "err", err)
		outcome = adapterv1.Outcome_OUTCOME_UNKNOWN
		if err := lifecycle.MoveAttempt(req.GetState(), att, lifecycle.Report, lifecycle.Keep, outcome); err != nil {
			return nil, nil, nil, s.internal(ctx, "record the adapter's answer", err)
		}
	}
	att.Error = resp.GetError()
	executed := func(ctx context.Context) {
		s.trace(ctx, task.GetId(), &evidencev1.ProductEvent{
			Kind: evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_EXECUTED, Capability: req.GetCapability(),
			RequestId: req.GetId(), IntentId: req.GetIntentId(), AttemptId: att.GetId(), Outcome: outcomeName(outcome),
			Detail: fmt.Sprintf("attempt %d via connection %s config r%d mapping %s r%d: %s, stage %s, %d bytes, response %s%s",
				att.GetNumber(), p.mapping.GetConnectionId(), serving.Revision(p.connection), p.mapping.GetId(), p.mapping.GetRevision(), outcomeName(outcome),
				stageName(att.GetStage()), resp.GetResponseBytes(), resp.GetResponseDigest(), servingNote(p.connection)),
		})
	}
	saved, err := s.updateRequest(ctx, req.GetId(), func(r *orchestratorv1.ToolRequest) error {
		mergeAttempt(r, att)
		return nil
	}, executed)
	switch {
	case apierror.Reason(err) == reasonLeaseLost:
		// Another replica took the request over while the call ran: it
		// accounts for the request, so nothing of this reply is
		// recorded anywhere (evidence included).
		return nil, nil, nil, err
	case err != nil:
		s.log.ErrorContext(ctx, "persist attempt stage", "request", req.GetId(), "attempt", att.GetId(), "err", err)
		executed(ctx) // held for the call's next write
	default:
		req = saved
	}
	if err := s.failAt(ctx, FailPointAttemptExecuted); err != nil {
		return nil, nil, nil, err
	}
	return req, att, resp, nil
}

// callTarget returns what a call through m reaches. A tool is the
// reviewed tool. A resource read takes no arguments, so a handle cannot
// steer it through them: when the mapping binds a handle field, the read
// is of exactly that handle's resolved target; when it binds none, it
// reads the mapping's fixed URI, and every handle the request used must
// name that URI, or the request is refused before anything is sent.
func callTarget(m *registryv1.Mapping, targets map[string]string) (*registryv1.RemoteTarget, error) {
	t := m.GetTarget()
	if t.GetKind() != registryv1.RemoteKind_REMOTE_KIND_RESOURCE {
		return t, nil
	}
	unusable := func(format string, args ...any) error {
		return apierror.New(codes.FailedPrecondition, "MAPPING_UNUSABLE",
			fmt.Sprintf("resource mapping %s r%d: ", m.GetId(), m.GetRevision())+fmt.Sprintf(format, args...),
			map[string]string{"mapping_id": m.GetId()})
	}
	if len(m.GetDefaults().GetFields()) > 0 {
		return nil, unusable("a resource read takes no arguments, but the mapping has defaults")
	}
	var bound []string
	for _, b := range m.GetArgumentMap() {
		if !b.GetFromHandle() {
			return nil, unusable("a resource read takes no arguments; %s is bound as a value", b.GetRemoteField())
		}
		field, err := handleField(b)
		if err != nil {
			return nil, unusable("%v", err)
		}
		bound = append(bound, field)
	}
	switch len(bound) {
	case 0:
		for field, target := range targets {
			if target != t.GetName() {
				return nil, apierror.New(codes.PermissionDenied, "HANDLE_TARGET_MISMATCH",
					fmt.Sprintf("the handle in %s names another source than resource mapping %s r%d reads; the mapping must bind the handle to read it", field, m.GetId(), m.GetRevision()),
					map[string]string{"field": field, "mapping_id": m.GetId()})
			}
		}
		return t, nil
	case 1:
		target, ok := targets[bound[0]]
		if !ok {
			return nil, apierror.InvalidArgument("HANDLE_REQUIRED",
				fmt.Sprintf("resource mapping %s r%d reads the source the handle in %s names; the request carries none", m.GetId(), m.GetRevision(), bound[0]),
				apierror.FieldViolation{Field: bound[0], Description: "a handle is required"})
		}
		return &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_RESOURCE, Name: target}, nil
	default:
		return nil, unusable("a resource read reads one source, but %d handle fields are bound", len(bound))
	}
}

// responseFromCallError describes a failed adapter call as an attempt
// result. Codes that mean the adapter refused before sending map to a
// definite outcome; anything else may have reached the server, so it is
// UNKNOWN.
func responseFromCallError(err error) *adapterv1.ExecuteResponse {
	st := status.Convert(err)
	outcome := adapterv1.Outcome_OUTCOME_UNKNOWN
	switch st.Code() {
	case codes.InvalidArgument, codes.FailedPrecondition, codes.NotFound, codes.OutOfRange:
		outcome = adapterv1.Outcome_OUTCOME_INVALID_REQUEST
	case codes.PermissionDenied, codes.Unauthenticated:
		outcome = adapterv1.Outcome_OUTCOME_FORBIDDEN
	case codes.ResourceExhausted:
		outcome = adapterv1.Outcome_OUTCOME_RATE_LIMITED
	}
	code := apierror.Reason(err)
	if code == "" {
		code = "ADAPTER_" + codeName(st.Code())
	}
	return &adapterv1.ExecuteResponse{
		Outcome: outcome,
		Stage:   adapterv1.DeliveryStage_DELIVERY_STAGE_PREPARED,
		Error:   &adapterv1.ErrorEvidence{SafeCode: code, UntrustedDetail: truncate(st.Message(), maxUntrustedDetail)},
	}
}
