package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/authz"
	"github.com/v0m3/v0m3/internal/bounds"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/orchestrator/lifecycle"
)

// Unknown outcomes are settled by evidence only: the receipt recorded under
// the intent (evidence), the server's status for the intent's request id
// (adapter), or a person who established it (SettleRequest). Until then a
// request whose outcome is unknown stays FAILED / UNKNOWN, is never
// attempted again, and is revisited by the continuous recovery with a
// growing interval (see settleSchedule).

// MaxSettleInterval bounds the growing interval between two automatic
// checks of one unknown outcome.
const MaxSettleInterval = 10 * time.Minute

// Limits of a manual settlement's fields.
const (
	maxSettleNote     = 1024
	maxSettleEvidence = 256
)

// Reasons of settlement refusals.
const (
	reasonOutcomeNotUnknown = "OUTCOME_NOT_UNKNOWN"
	reasonRequestChanged    = "REQUEST_CHANGED"
	reasonEvidenceRequired  = "SETTLEMENT_EVIDENCE_REQUIRED"
	reasonReceiptMismatch   = "RECEIPT_NOT_OF_REQUEST"
)

var artifactDigestPattern = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// settleSchedule spaces the automatic checks of each unknown outcome: the
// first after one recovery interval, then twice as long each time, up to
// MaxSettleInterval, so a dependency that stays down is not hammered and
// one that is back is asked again soon. It is per replica and in memory: a
// restarted replica checks again at once, which is harmless.
type settleSchedule struct {
	mu   sync.Mutex
	next map[string]settleCheck
}

type settleCheck struct {
	at    time.Time
	delay time.Duration
}

// settleDue reports whether the unknown outcome of request id is to be checked
// now, and if so schedules the check after it.
func (s *Server) settleDue(id string) bool {
	sc := &s.settles
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.next == nil {
		sc.next = map[string]settleCheck{}
	}
	now := time.Now() // pacing, not a recorded time
	c, ok := sc.next[id]
	if !ok {
		// The call that ended it unknown just asked what evidence there
		// was: the first check is one interval later.
		sc.next[id] = settleCheck{at: now.Add(s.recoveryInterval), delay: s.recoveryInterval}
		return false
	}
	if now.Before(c.at) {
		return false
	}
	delay := min(2*c.delay, MaxSettleInterval)
	sc.next[id] = settleCheck{at: now.Add(delay), delay: delay}
	return true
}

// forgetSettled drops the schedule of requests no longer listed for
// recovery (settled, by evidence or by hand).
func (s *Server) forgetSettled(listed []*orchestratorv1.ToolRequest) {
	sc := &s.settles
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if len(sc.next) == 0 {
		return
	}
	keep := make(map[string]bool, len(listed))
	for _, r := range listed {
		keep[r.GetId()] = true
	}
	for id := range sc.next {
		if !keep[id] {
			delete(sc.next, id)
		}
	}
}

// settleUnknown looks for evidence of what happened in a request's attempt
// whose outcome is unknown, under this replica's lease: a receipt under the
// intent id attested by the adapter settles it as executed; so does the
// server's status showing the intent's artifact (its receipt is recorded
// first); the server's definite "not found" settles it as not executed. A
// dependency that fails leaves the outcome unknown for the next check. No
// attempt is ever made.
func (s *Server) settleUnknown(ctx context.Context, req *orchestratorv1.ToolRequest) error {
	att := lastAttempt(req)
	task, err := s.st.GetTask(ctx, req.GetTaskId())
	if err != nil {
		return fmt.Errorf("load task %s: %w", req.GetTaskId(), err)
	}
	rc, err := s.deps.Evidence.GetReceipt(ctx, &evidencev1.GetReceiptRequest{IdempotencyKey: req.GetIntentId()})
	switch {
	case err == nil && s.trusted(ctx, req, rc):
		_, err := s.recordSettlement(ctx, task, req, att.GetId(), true, rc, rc.GetArtifactDigest(), rc.GetDeliveryId(),
			fmt.Sprintf("settled after the fact by receipt %s recorded for intent %s", rc.GetId(), req.GetIntentId()), "")
		return ignoreSettled(err)
	case err == nil, status.Code(err) == codes.NotFound:
		// An unattested receipt is no evidence either way.
	default:
		return fmt.Errorf("look up the receipt of intent %s: %w", req.GetIntentId(), err)
	}
	m, err := s.deps.Registry.GetMapping(ctx, &registryv1.GetMappingRequest{Id: req.GetMappingId(), Revision: req.GetMappingRevision()})
	if err != nil {
		return err
	}
	if m.GetStatusTool() == "" || m.GetIdempotencyKeyField() == "" {
		return nil // nothing else to ask: a person settles it
	}
	conn, err := s.deps.Registry.GetConnection(ctx, &registryv1.GetConnectionRequest{Id: m.GetConnectionId()})
	if err != nil {
		return err
	}
	st, err := s.queryStatus(ctx, task, req, att, m, conn)
	if err != nil {
		s.log.WarnContext(ctx, "settle unknown outcome: server status unreadable; checked again later", "request", req.GetId(), "err", err)
		return nil
	}
	if st == nil {
		_, err := s.recordSettlement(ctx, task, req, att.GetId(), false, nil, "", "",
			"settled after the fact by the server's status: no artifact exists for request id "+req.GetIntentId()+"; the effect did not happen", "")
		return ignoreSettled(err)
	}
	rc, err = s.recordReceipt(ctx, req, att.GetId(), st.artifact, st.delivery, st.attestation, "server status for request id "+req.GetIntentId())
	if err != nil {
		return fmt.Errorf("record the receipt the server's status shows: %w", err)
	}
	_, err = s.recordSettlement(ctx, task, req, att.GetId(), true, rc, rc.GetArtifactDigest(), rc.GetDeliveryId(),
		"settled after the fact by the server's status: artifact "+st.artifact+" exists for request id "+req.GetIntentId(), "")
	return ignoreSettled(err)
}

// errAlreadySettled is a settlement of a request that no longer awaits
// one (settled meanwhile, or attempted again).
var errAlreadySettled = errors.New("the request no longer awaits settlement")

func ignoreSettled(err error) error {
	if errors.Is(err, errAlreadySettled) {
		return nil
	}
	return err
}

// recordSettlement is the one place an unknown outcome is rewritten: only
// while the request still awaits settlement with attemptID as its last
// attempt, and only with the evidence (why) recorded in the attempt's
// resolution, the trace and the task events. by names the person who
// settled it by hand ("" for evidence found automatically).
func (s *Server) recordSettlement(ctx context.Context, task *orchestratorv1.Task, req *orchestratorv1.ToolRequest, attemptID string,
	executed bool, rc *evidencev1.Receipt, artifact, delivery, why, by string) (*orchestratorv1.ToolRequest, error) {
	outcome := adapterv1.Outcome_OUTCOME_INTERRUPTED
	what := "not executed"
	if executed {
		outcome = adapterv1.Outcome_OUTCOME_OK
		what = "executed"
		if rc.GetId() != "" {
			what += ", receipt " + rc.GetId()
		}
		if artifact != "" {
			what += ", artifact " + artifact
		}
		if delivery != "" {
			what += ", delivery " + delivery
		}
	}
	reason := "SETTLED_BY_EVIDENCE"
	if by != "" {
		reason = "SETTLED_BY_HAND"
	}
	detail := fmt.Sprintf("unknown outcome of attempt %s settled: %s; %s", attemptID, what, why)
	out, err := s.updateRequest(ctx, req.GetId(), func(r *orchestratorv1.ToolRequest) error {
		att := lastAttempt(r)
		if !awaitingSettlement(r) || att.GetId() != attemptID {
			return errAlreadySettled
		}
		// The attempt is checked against the request as it stands
		// before the request moves.
		event, stage := lifecycle.SettleNotExecuted, lifecycle.Keep
		if executed {
			event = lifecycle.SettleExecuted
			if rc != nil {
				stage = lifecycle.ReceiptVerified
			}
		}
		if err := lifecycle.MoveAttempt(r.GetState(), att, event, stage, outcome); err != nil {
			return err
		}
		if err := lifecycle.Move(r, event, outcome); err != nil {
			return err
		}
		att.Resolution = joinResolution(att.GetResolution(), why)
		if executed {
			att.Error = nil
			r.ReceiptId, r.ArtifactDigest = rc.GetId(), artifact
		}
		r.UpdateTime = s.timestamp()
		return nil
	}, func(ctx context.Context) {
		s.trace(ctx, task.GetId(), &evidencev1.ProductEvent{
			Kind: evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_CONSEQUENCE, Capability: req.GetCapability(),
			RequestId: req.GetId(), IntentId: req.GetIntentId(), AttemptId: attemptID, Outcome: outcomeName(outcome),
			Reason: reason, Detail: detail,
		})
		s.emit(ctx, task.GetId(), req.GetId(), "request.settled", detail)
	})
	if err != nil {
		if errors.Is(err, errAlreadySettled) {
			return nil, err
		}
		return nil, s.internal(ctx, "record the settlement", err)
	}
	s.log.InfoContext(ctx, "unknown outcome settled", "task", task.GetId(), "request", out.GetId(), "attempt", attemptID,
		"outcome", outcomeName(outcome), "reason", reason, "by", by)
	return out, nil
}

// SettleRequest settles by hand, with evidence, a request whose outcome is
// unknown. Policy must grant the caller request.settle on it (the default
// policy: the settler and admins groups); a refusal changes nothing. The
// request must still await settlement at the attempt the operator names.
func (s *Server) SettleRequest(ctx context.Context, in *orchestratorv1.SettleRequestRequest) (*orchestratorv1.ToolRequest, error) {
	if err := validateSettlement(in); err != nil {
		return nil, err
	}
	req, task, who, err := s.decider(ctx, in.GetRequestId(), authz.RequestSettle)
	if err != nil {
		return nil, err
	}
	if err := settleable(req, in.GetAttemptId()); err != nil {
		return nil, err
	}
	l, ok, err := s.own(ctx, req.GetId())
	if err != nil {
		return nil, claimFailed("the request")
	}
	if !ok {
		return nil, apierror.New(codes.Aborted, "REQUEST_IN_PROGRESS",
			fmt.Sprintf("request %s is being worked on; try again", req.GetId()), map[string]string{"request_id": req.GetId()})
	}
	defer l.Release()
	s.queueBehindOutbox(ctx)
	// Once claimed, the settlement is recorded whether or not the caller
	// waits for it.
	ctx, cancel := s.detach(ctx, l)
	defer cancel()
	ctx = withCheckpoint(ctx)
	defer s.flush(ctx)
	if req, err = s.loadRequest(ctx, req.GetId()); err != nil {
		return nil, err
	}
	if err := settleable(req, in.GetAttemptId()); err != nil {
		return nil, err
	}
	executed := in.GetSettlement() == orchestratorv1.Settlement_SETTLEMENT_EXECUTED
	var rc *evidencev1.Receipt
	artifact, delivery := in.GetArtifactDigest(), in.GetDeliveryId()
	if in.GetReceiptId() != "" {
		got, err := s.deps.Evidence.GetReceipt(ctx, &evidencev1.GetReceiptRequest{IdempotencyKey: req.GetIntentId()})
		if err != nil && status.Code(err) != codes.NotFound {
			return nil, apierror.Propagate(err, "look up the receipt")
		}
		if err != nil || got.GetId() != in.GetReceiptId() {
			return nil, apierror.New(codes.FailedPrecondition, reasonReceiptMismatch,
				fmt.Sprintf("receipt %s is not the receipt recorded for request %s's intent", truncate(in.GetReceiptId(), 64), req.GetId()),
				map[string]string{"request_id": req.GetId()})
		}
		rc = got
		if artifact == "" {
			artifact = got.GetArtifactDigest()
		}
		if delivery == "" {
			delivery = got.GetDeliveryId()
		}
	}
	why := fmt.Sprintf("settled by hand by %s: %s", who, in.GetNote())
	// The audit record of this call is written by the audit interceptor
	// (internal/audit), as for every privileged RPC.
	out, err := s.recordSettlement(ctx, task, req, in.GetAttemptId(), executed, rc, artifact, delivery, why, who)
	if errors.Is(err, errAlreadySettled) {
		if cur, lerr := s.loadRequest(ctx, req.GetId()); lerr == nil {
			return nil, settleable(cur, in.GetAttemptId())
		}
		return nil, apierror.New(codes.FailedPrecondition, reasonOutcomeNotUnknown, "request "+req.GetId()+" no longer awaits settlement",
			map[string]string{"request_id": req.GetId()})
	}
	return out, err
}

// settleable says why req cannot be settled at attemptID now, or nil.
func settleable(req *orchestratorv1.ToolRequest, attemptID string) error {
	if !awaitingSettlement(req) {
		return apierror.New(codes.FailedPrecondition, reasonOutcomeNotUnknown,
			fmt.Sprintf("request %s is %s with outcome %s; only a request whose outcome is unknown can be settled",
				req.GetId(), requestStateName(req.GetState()), outcomeName(req.GetOutcome())),
			map[string]string{"request_id": req.GetId()})
	}
	if last := lastAttempt(req); last.GetId() != attemptID {
		return apierror.New(codes.FailedPrecondition, reasonRequestChanged,
			fmt.Sprintf("the unknown outcome of request %s is that of attempt %s, not the attempt named; examine it again", req.GetId(), last.GetId()),
			map[string]string{"request_id": req.GetId(), "attempt_id": last.GetId()})
	}
	return nil
}

// validateSettlement checks a settlement's fields before anything is read.
func validateSettlement(in *orchestratorv1.SettleRequestRequest) error {
	switch {
	case in.GetRequestId() == "":
		return missing("request_id")
	case in.GetAttemptId() == "":
		return missing("attempt_id")
	case in.GetNote() == "":
		return missing("note")
	}
	for _, f := range []struct {
		name, value string
		limit       int
	}{
		{"request_id", in.GetRequestId(), maxSettleEvidence}, {"attempt_id", in.GetAttemptId(), maxSettleEvidence},
		{"receipt_id", in.GetReceiptId(), maxSettleEvidence}, {"delivery_id", in.GetDeliveryId(), maxSettleEvidence},
		{"artifact_digest", in.GetArtifactDigest(), maxSettleEvidence}, {"note", in.GetNote(), maxSettleNote},
	} {
		if len(f.value) > f.limit {
			return bounds.FieldTooLong(f.name, f.limit)
		}
	}
	if d := in.GetArtifactDigest(); d != "" && !artifactDigestPattern.MatchString(d) {
		return apierror.InvalidArgument("ARTIFACT_DIGEST_INVALID", "artifact_digest must be sha256:<64 lowercase hex>",
			apierror.FieldViolation{Field: "artifact_digest", Description: "sha256:<64 lowercase hex>"})
	}
	hasEvidence := in.GetReceiptId() != "" || in.GetArtifactDigest() != "" || in.GetDeliveryId() != ""
	switch in.GetSettlement() {
	case orchestratorv1.Settlement_SETTLEMENT_EXECUTED:
		if !hasEvidence {
			return apierror.InvalidArgument(reasonEvidenceRequired, "an executed settlement needs evidence: receipt_id, artifact_digest or delivery_id",
				apierror.FieldViolation{Field: "artifact_digest", Description: "receipt_id, artifact_digest or delivery_id is required"})
		}
	case orchestratorv1.Settlement_SETTLEMENT_NOT_EXECUTED:
		if hasEvidence {
			return apierror.InvalidArgument("SETTLEMENT_EVIDENCE_UNEXPECTED", "a not-executed settlement takes no receipt, artifact or delivery; explain it in note",
				apierror.FieldViolation{Field: "settlement", Description: "evidence of an effect contradicts NOT_EXECUTED"})
		}
	default:
		return apierror.InvalidArgument(apierror.ReasonFieldRequired, "settlement is required: EXECUTED or NOT_EXECUTED",
			apierror.FieldViolation{Field: "settlement", Description: "required"})
	}
	return nil
}
