package orchestrator

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/v0m3/v0m3/internal/receipt"
	"github.com/v0m3/v0m3/internal/serving"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/orchestrator/lifecycle"
)

// action is what follows a failed attempt.
type action int

const (
	// actionStop leaves the request failed with the attempt's outcome.
	actionStop action = iota
	// actionRetry makes another attempt.
	actionRetry
	// actionSettled commits the request on a receipt found after the fact.
	actionSettled
)

// next is the decision about a failed attempt: the attempt as it should be
// recorded (with its resolution) and, when settled, the receipt.
type next struct {
	action  action
	att     *orchestratorv1.Attempt
	receipt *evidencev1.Receipt
}

// afterFailure applies the capability's retry rule to a failed attempt.
//
//   - RETRY (a bounded read): an interrupted or unavailable attempt is
//     tried again, at most maxAutomaticRetries times.
//   - CHECK_RECEIPT (a transformation with a durable request id): an
//     attempt that never reached the server is tried again; one whose
//     outcome is unknown first looks for a receipt under the intent id in
//     evidence (trusted only with the adapter's attestation for one of this
//     request's attempts, see trusted), then asks the server's status tool;
//     an artifact found either way settles the request without another
//     render; only a definite "not found" allows another attempt, under the
//     same request id.
//   - NEVER_BLIND (and anything unknown): never tried again automatically;
//     an unknown outcome waits for a person.
//
// Failures that are answers (invalid, forbidden, rate limited) are never
// retried here.
func (s *Server) afterFailure(ctx context.Context, task *orchestratorv1.Task, req *orchestratorv1.ToolRequest, att *orchestratorv1.Attempt,
	capb *registryv1.Capability, m *registryv1.Mapping, conn *registryv1.Connection, retries int) next {
	att = proto.CloneOf(att)
	stop := func(resolution string) next {
		if resolution != "" {
			att.Resolution = joinResolution(att.GetResolution(), resolution)
		}
		return next{action: actionStop, att: att}
	}
	retry := func(resolution string) next {
		if retries >= lifecycle.MaxAutomaticRetries {
			return stop(resolution + "; no automatic attempt left")
		}
		att.Resolution = joinResolution(att.GetResolution(), resolution+"; attempting again")
		return next{action: actionRetry, att: att}
	}
	o := att.GetOutcome()
	switch lifecycle.AfterFailure(capb.GetRetryRule(), o) {
	case lifecycle.Retry:
		if capb.GetRetryRule() == registryv1.RetryRule_RETRY_RULE_CHECK_RECEIPT {
			return retry("the request never reached the server")
		}
		return retry(fmt.Sprintf("%s bounded read", outcomeName(o)))
	case lifecycle.CheckEvidence:
		rc, err := s.deps.Evidence.GetReceipt(ctx, &evidencev1.GetReceiptRequest{IdempotencyKey: req.GetIntentId()})
		switch {
		case err == nil && s.trusted(ctx, req, rc):
			att.Resolution = joinResolution(att.GetResolution(), fmt.Sprintf("settled by receipt %s already recorded for intent %s", rc.GetId(), req.GetIntentId()))
			return next{action: actionSettled, att: att, receipt: rc}
		case err == nil:
			// An unattested receipt is no evidence either way: ask the
			// server, as if there were none.
			att.Resolution = joinResolution(att.GetResolution(), fmt.Sprintf("receipt %s ignored: not attested by the adapter for this intent", rc.GetId()))
		case status.Code(err) != codes.NotFound:
			s.log.WarnContext(ctx, "look up receipt", "request", req.GetId(), "err", err)
			return stop("receipt lookup failed; not attempted again")
		}
		st, err := s.queryStatus(ctx, task, req, att, m, conn)
		if err != nil {
			s.log.WarnContext(ctx, "query render status", "request", req.GetId(), "err", err)
			return stop("no receipt, and the server's status could not be read; not attempted again")
		}
		if st == nil {
			return retry("no receipt, and the server's status has no artifact for request id " + req.GetIntentId())
		}
		rc, err = s.recordReceipt(ctx, req, att.GetId(), st.artifact, st.delivery, st.attestation, "server status for request id "+req.GetIntentId())
		if err != nil {
			s.log.ErrorContext(ctx, "record receipt from status", "request", req.GetId(), "err", err)
			return stop("the server reports artifact " + st.artifact + " but its receipt could not be recorded")
		}
		att.Resolution = joinResolution(att.GetResolution(), "settled by the server's status: artifact "+st.artifact+" exists for request id "+req.GetIntentId())
		return next{action: actionSettled, att: att, receipt: rc}
	default:
		return stop("")
	}
}

// queryStatus asks the connection's status tool whether the request id
// (the intent id) produced an artifact. It is a read under the same
// connection, configuration revision, mapping and limits as the attempt,
// made for that attempt (its own grant, the attempt's id), so the
// adapter's attestation of the answer binds the artifact to the attempt
// and intent. It returns nil when the server has no artifact for the
// request id.
func (s *Server) queryStatus(ctx context.Context, task *orchestratorv1.Task, req *orchestratorv1.ToolRequest, att *orchestratorv1.Attempt,
	m *registryv1.Mapping, conn *registryv1.Connection) (*statusAnswer, error) {
	if m.GetStatusTool() == "" || m.GetIdempotencyKeyField() == "" {
		return nil, fmt.Errorf("mapping %s r%d declares no status tool queried by idempotency key", m.GetId(), m.GetRevision())
	}
	args, err := structpb.NewStruct(map[string]any{m.GetIdempotencyKeyField(): req.GetIntentId()})
	if err != nil {
		return nil, err
	}
	in := &adapterv1.ExecuteRequest{
		ConnectionId:    m.GetConnectionId(),
		ConfigRevision:  serving.Revision(conn),
		MappingId:       m.GetId(),
		MappingRevision: m.GetRevision(),
		Target:          &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: m.GetStatusTool()},
		Arguments:       args,
		Limits:          m.GetLimits(),
		TaskId:          task.GetId(),
		AttemptId:       att.GetId(),
		SnapshotId:      m.GetSnapshotId(),
	}
	resp, grantID, err := s.call(ctx, in, req.GetIntentId(), req.GetCapability(), task, conn)
	if err != nil {
		return nil, err
	}
	if resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
		return nil, fmt.Errorf("status tool: %s (%s)", outcomeName(resp.GetOutcome()), resp.GetError().GetSafeCode())
	}
	switch resp.GetStructuredContent().GetFields()["state"].GetStringValue() {
	case "done":
		st := &statusAnswer{}
		st.artifact, st.delivery = receipt.Fields(resp.GetStructuredContent())
		if st.artifact == "" {
			return nil, fmt.Errorf("status tool: done without an artifact digest")
		}
		if st.attestation, err = s.attestation(in, resp, grantID, req.GetIntentId()); err != nil {
			return nil, fmt.Errorf("status tool: %w", err)
		}
		return st, nil
	case "not_found":
		return nil, nil
	default:
		return nil, fmt.Errorf("status tool: unrecognized state")
	}
}

// statusAnswer is a server status that shows the artifact of a request id,
// with the adapter's attestation of it.
type statusAnswer struct {
	artifact, delivery, attestation string
}

func joinResolution(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}
