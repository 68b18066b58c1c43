package orchestrator

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/receipt"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/orchestrator/lifecycle"
)

// complete turns a successful attempt into product state by what the
// capability's results become: a retrieval's content becomes source
// observations and quoted excerpts (see observe), a data capability's an
// observation of the call quoted as data (see observeData), or waits for
// evidence to record them (see recordResult); any other
// effect must come with a receipt (artifact digest or delivery id), which
// is recorded in evidence (stage RECEIPT_VERIFIED) before the request is
// committed.
func (s *Server) complete(ctx context.Context, task *orchestratorv1.Task, req *orchestratorv1.ToolRequest, att *orchestratorv1.Attempt,
	p *prepared, remote *structpb.Struct, resp *adapterv1.ExecuteResponse) (*orchestratorv1.ToolRequest, error) {
	if observes(p.capability) {
		return s.recordResult(ctx, task, req, att, &unrecordedResult{p: p, remote: remote, resp: resp})
	}
	artifact, delivery := receipt.Fields(resp.GetStructuredContent())
	if artifact == "" && delivery == "" {
		// The server says it succeeded but shows no evidence of the effect:
		// whether it happened is not known.
		if err := lifecycle.MoveAttempt(req.GetState(), att, lifecycle.Doubt, lifecycle.Keep, lifecycle.Unknown); err != nil {
			return nil, s.internal(ctx, "record the missing receipt", err)
		}
		att.Error = &adapterv1.ErrorEvidence{SafeCode: codeReceiptMissing}
		return s.fail(ctx, req, att)
	}
	rc, err := s.recordReceipt(ctx, req, att.GetId(), artifact, delivery, resp.GetReceiptAttestation(), "reply of attempt "+att.GetId())
	if err != nil {
		if err := lifecycle.MoveAttempt(req.GetState(), att, lifecycle.Doubt, lifecycle.Keep, lifecycle.Unknown); err != nil {
			return nil, s.internal(ctx, "record the unrecorded receipt", err)
		}
		att.Error = &adapterv1.ErrorEvidence{SafeCode: codeReceiptNotRecorded}
		s.log.ErrorContext(ctx, "record receipt", "request", req.GetId(), "attempt", att.GetId(), "err", err)
		return s.fail(ctx, req, att)
	}
	return s.commit(ctx, task, req, att, nil, rc)
}

// recordReceipt records the evidence of an effect under the intent id, the
// idempotency key: recording it again returns the first receipt. The
// adapter's attestation goes with it; evidence refuses a receipt it does
// not attest.
func (s *Server) recordReceipt(ctx context.Context, req *orchestratorv1.ToolRequest, attemptID, artifact, delivery, attestation, source string) (*evidencev1.Receipt, error) {
	detail, err := structpb.NewStruct(map[string]any{
		"capability":      req.GetCapability(),
		"summary":         req.GetSummary(),
		"document_digest": req.GetDocumentDigest(),
		"evidence_from":   source,
	})
	if err != nil {
		return nil, err
	}
	rc, err := s.deps.Evidence.RecordReceipt(ctx, &evidencev1.RecordReceiptRequest{Receipt: &evidencev1.Receipt{
		IdempotencyKey: req.GetIntentId(), TaskId: req.GetTaskId(), AttemptId: attemptID,
		ArtifactDigest: artifact, DeliveryId: delivery, Detail: detail, Attestation: attestation,
	}})
	if err != nil {
		return nil, err
	}
	// The key may already hold a receipt: the first one, which stands only
	// if the adapter attested it for this intent.
	same := rc.GetAttemptId() == attemptID && rc.GetArtifactDigest() == artifact && rc.GetDeliveryId() == delivery && rc.GetAttestation() == attestation
	if !same && !s.trusted(ctx, req, rc) {
		return nil, fmt.Errorf("the intent's receipt key holds receipt %s, which the adapter did not attest for this intent", rc.GetId())
	}
	return rc, nil
}

// commit persists the receipt stage (when there is a receipt), then the
// committed request with the task's checkpoint text.
func (s *Server) commit(ctx context.Context, task *orchestratorv1.Task, req *orchestratorv1.ToolRequest, att *orchestratorv1.Attempt,
	obs *observed, rc *evidencev1.Receipt) (*orchestratorv1.ToolRequest, error) {
	if rc != nil {
		if err := lifecycle.MoveAttempt(req.GetState(), att, lifecycle.VerifyReceipt, lifecycle.ReceiptVerified, lifecycle.OK); err != nil {
			return nil, s.internal(ctx, "persist the verified receipt", err)
		}
		if _, err := s.saveAttempt(ctx, req.GetId(), att, nil); err != nil {
			return nil, s.internal(ctx, "persist the verified receipt", err)
		}
	}
	if err := lifecycle.MoveAttempt(req.GetState(), att, lifecycle.Commit, lifecycle.Committed, lifecycle.OK); err != nil {
		return nil, s.internal(ctx, "commit the executed request", err)
	}
	att.EndTime = s.timestamp()
	committed := func(ctx context.Context) {
		what := fmt.Sprintf("%d quoted excerpts", len(obs.GetExcerpts()))
		if rc != nil {
			what = "receipt " + rc.GetId()
			if rc.GetArtifactDigest() != "" {
				what += ", artifact " + rc.GetArtifactDigest()
			}
			if rc.GetDeliveryId() != "" {
				what += ", delivery " + rc.GetDeliveryId()
			}
		}
		if att.GetResolution() != "" {
			what += "; " + att.GetResolution()
		}
		s.trace(ctx, task.GetId(), &evidencev1.ProductEvent{
			Kind: evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_CONSEQUENCE, Capability: req.GetCapability(),
			RequestId: req.GetId(), IntentId: req.GetIntentId(), AttemptId: att.GetId(), Outcome: outcomeName(adapterv1.Outcome_OUTCOME_OK),
			Detail: "committed: " + what,
		})
		s.emit(ctx, task.GetId(), req.GetId(), "request.executed", fmt.Sprintf("%s committed with %s", req.GetCapability(), what))
		// The task's checkpoint text rides the commit it sums up.
		checkpoint := fmt.Sprintf("last committed: request %s (%s), attempt %s #%d", req.GetId(), req.GetCapability(), att.GetId(), att.GetNumber())
		s.updateTaskAtCheckpoint(ctx, task.GetId(), func(t *orchestratorv1.Task) error {
			t.Checkpoint = checkpoint
			t.UpdateTime = s.timestamp()
			return nil
		})
	}
	out, err := s.updateRequest(ctx, req.GetId(), func(r *orchestratorv1.ToolRequest) error {
		if err := lifecycle.Move(r, lifecycle.Commit, lifecycle.OK); err != nil {
			return err
		}
		mergeAttempt(r, att)
		if obs != nil {
			r.Excerpts, r.Diagnostics = obs.excerpts, obs.diagnostics
		}
		if rc != nil {
			r.ReceiptId, r.ArtifactDigest = rc.GetId(), rc.GetArtifactDigest()
		}
		r.UpdateTime = s.timestamp()
		return nil
	}, committed)
	if err != nil {
		return nil, s.internal(ctx, "commit the executed request", err)
	}
	if err := s.failAt(ctx, FailPointRequestCommitted); err != nil {
		return nil, err
	}
	s.log.DebugContext(ctx, "request executed", "task", task.GetId(), "request", out.GetId(), "attempt", att.GetId())
	return out, nil
}

// fail records a failed attempt. A response that broke the mapping's limits
// is also an error for the caller; any other failure is reported through
// the request's state and its attempt's evidence.
func (s *Server) fail(ctx context.Context, req *orchestratorv1.ToolRequest, att *orchestratorv1.Attempt) (*orchestratorv1.ToolRequest, error) {
	att.EndTime = s.timestamp()
	code := att.GetError().GetSafeCode()
	// Only the safe code goes into the product trace and events; the
	// untrusted detail stays on the attempt, displayed, never parsed.
	detail := fmt.Sprintf("attempt %d failed: %s", att.GetNumber(), outcomeName(att.GetOutcome()))
	if code != "" {
		detail += " (" + code + ")"
	}
	if att.GetResolution() != "" {
		detail += "; " + att.GetResolution()
	}
	if att.GetOutcome() == adapterv1.Outcome_OUTCOME_UNKNOWN {
		detail += "; not retried: a person must establish whether the effect happened before any new attempt"
	}
	out, err := s.updateRequest(ctx, req.GetId(), func(r *orchestratorv1.ToolRequest) error {
		if err := lifecycle.Move(r, lifecycle.Fail, att.GetOutcome()); err != nil {
			return err
		}
		mergeAttempt(r, att)
		r.UpdateTime = s.timestamp()
		return nil
	}, func(ctx context.Context) {
		s.trace(ctx, req.GetTaskId(), &evidencev1.ProductEvent{
			Kind: evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_CONSEQUENCE, Capability: req.GetCapability(),
			RequestId: req.GetId(), IntentId: req.GetIntentId(), AttemptId: att.GetId(), Outcome: outcomeName(att.GetOutcome()),
			Reason: code, Detail: detail,
		})
		s.emit(ctx, req.GetTaskId(), req.GetId(), "request.failed", detail)
	})
	if err != nil {
		return nil, s.internal(ctx, "record the failed request", err)
	}
	s.log.InfoContext(ctx, "request failed", "task", req.GetTaskId(), "request", req.GetId(), "attempt", att.GetId(), "outcome", outcomeName(att.GetOutcome()), "code", code)
	if code == codeResponseLimitExceeded {
		return nil, apierror.New(codes.ResourceExhausted, codeResponseLimitExceeded,
			fmt.Sprintf("the response to %s exceeded the mapping's limits; request %s is recorded as failed", req.GetCapability(), req.GetId()),
			map[string]string{"request_id": req.GetId(), "attempt_id": att.GetId()})
	}
	return out, nil
}

// observes reports whether a capability's successful result is observed
// content (source observations, or data, which is quoted the same way for
// now) rather than an effect proven by a receipt. The declared result kind
// decides; when none is declared, the effect class does (a retrieval is
// observed, anything else needs a receipt). An external effect is believed
// only with a receipt, whatever its declaration says.
func observes(c *registryv1.Capability) bool {
	if c.GetEffectClass() == registryv1.EffectClass_EFFECT_CLASS_EXTERNAL_EFFECT {
		return false
	}
	switch c.GetResultKind() {
	case registryv1.ResultKind_RESULT_KIND_SOURCE_OBSERVATION, registryv1.ResultKind_RESULT_KIND_DATA:
		return true
	case registryv1.ResultKind_RESULT_KIND_ARTIFACT, registryv1.ResultKind_RESULT_KIND_RECEIPT:
		return false
	}
	return c.GetEffectClass() == registryv1.EffectClass_EFFECT_CLASS_RETRIEVAL
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
