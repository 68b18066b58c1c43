package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/v0m3/v0m3/internal/grant"
	"github.com/v0m3/v0m3/internal/ids"
	"github.com/v0m3/v0m3/internal/receipt"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// grantMargin is added to the attempt timeout to make a grant's lifetime:
// long enough for the call to reach the adapter, short enough that a grant
// that leaked is worthless soon.
const grantMargin = 30 * time.Second

// call signs the execution grant for exactly in and sends it to the
// adapter. It returns the grant id ("" without credentials: plaintext
// development, where no grant is sent). When conn's OAuth client exchanges
// the requester's identity (token exchange), the grant carries a subject
// token naming task's requester, addressed to conn's authorization server.
func (s *Server) call(ctx context.Context, in *adapterv1.ExecuteRequest, intentID, capability string, task *orchestratorv1.Task, conn *registryv1.Connection) (*adapterv1.ExecuteResponse, string, error) {
	// What led to the call is on record before anything is sent.
	s.flush(ctx)
	var grantID string
	if creds := s.deps.Credentials; creds != nil {
		g, err := grant.For(in, ids.New("grant"), intentID, capability, s.now(), s.attemptTimeout+grantMargin)
		if err != nil {
			return nil, "", fmt.Errorf("build execution grant: %w", err)
		}
		if o := conn.GetTransport().GetStreamableHttp().GetOauth(); o.GetGrant() == registryv1.OauthGrant_OAUTH_GRANT_TOKEN_EXCHANGE {
			r := task.GetRequester()
			if g, err = grant.WithSubject(creds, g, ids.New("sbj"), r.GetId(), r.GetGroups(), o.GetIssuer()); err != nil {
				return nil, "", fmt.Errorf("build subject token: %w", err)
			}
		}
		if in.Grant, err = grant.Sign(creds, g); err != nil {
			return nil, "", fmt.Errorf("sign execution grant: %w", err)
		}
		grantID = g.ID
	}
	callCtx, cancel := context.WithTimeout(ctx, s.attemptTimeout)
	defer cancel()
	resp, err := s.deps.Adapter.Execute(callCtx, in)
	return resp, grantID, err
}

// attestation returns the adapter's receipt attestation of an OK response
// to the call in made under grantID, once it is verified to attest exactly
// that call and what the response says: attempt, grant, intent, task,
// response digest, artifact digest and delivery id. Without credentials
// (plaintext development) there is nothing to verify and it returns "".
func (s *Server) attestation(in *adapterv1.ExecuteRequest, resp *adapterv1.ExecuteResponse, grantID, intentID string) (string, error) {
	creds := s.deps.Credentials
	if creds == nil {
		return "", nil
	}
	a, err := receipt.Verify(creds, resp.GetReceiptAttestation())
	if err != nil {
		return "", err
	}
	artifact, delivery := receipt.Fields(resp.GetStructuredContent())
	for _, f := range []struct{ name, want, have string }{
		{"grant_id", grantID, a.GrantID},
		{"attempt_id", in.GetAttemptId(), a.AttemptID},
		{"intent_id", intentID, a.IntentID},
		{"task_id", in.GetTaskId(), a.TaskID},
		{"response_digest", resp.GetResponseDigest(), a.ResponseDigest},
		{"artifact_digest", artifact, a.ArtifactDigest},
		{"delivery_id", delivery, a.DeliveryID},
	} {
		if f.want != f.have {
			return "", &receipt.Error{Reason: receipt.ReasonMismatch, Field: f.name,
				Msg: fmt.Sprintf("the adapter's attestation names another %s than the call it answers", f.name)}
		}
	}
	return resp.GetReceiptAttestation(), nil
}

// trusted reports whether a receipt read back from evidence may settle req:
// its attestation is the adapter's, it attests exactly this receipt, and
// the receipt names req's intent and task and one of req's attempts. A
// receipt that fails is ignored, with a warning and a DIAGNOSTIC in the
// task's trace, never trusted: whoever wrote it, it is not evidence that
// this intent's effect happened.
func (s *Server) trusted(ctx context.Context, req *orchestratorv1.ToolRequest, rc *evidencev1.Receipt) bool {
	reason, detail := "", ""
	attempt := func(id string) bool {
		return slices.ContainsFunc(req.GetAttempts(), func(a *orchestratorv1.Attempt) bool { return a.GetId() == id })
	}
	switch {
	case s.deps.Credentials == nil:
		reason, detail = receipt.ReasonInvalid, "this orchestrator has no certificate to verify receipt attestations with"
	case rc.GetIdempotencyKey() != req.GetIntentId() || rc.GetTaskId() != req.GetTaskId():
		reason, detail = receipt.ReasonMismatch, "the receipt names another intent or task"
	case !attempt(rc.GetAttemptId()):
		reason, detail = receipt.ReasonMismatch, "the receipt names an attempt that is not one of this request's"
	default:
		_, err := receipt.Check(s.deps.Credentials, rc)
		if err == nil {
			return true
		}
		var re *receipt.Error
		if errors.As(err, &re) {
			reason = re.Reason
		}
		detail = err.Error()
	}
	s.log.WarnContext(ctx, "receipt ignored: not attested by the adapter for this intent",
		"request", req.GetId(), "intent", req.GetIntentId(), "receipt", rc.GetId(), "reason", reason, "detail", detail)
	s.trace(ctx, req.GetTaskId(), &evidencev1.ProductEvent{
		Kind: evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_DIAGNOSTIC, Capability: req.GetCapability(),
		RequestId: req.GetId(), IntentId: req.GetIntentId(), Reason: reason,
		Detail: fmt.Sprintf("receipt %s recorded for this intent was ignored, not trusted: %s", rc.GetId(), detail),
	})
	return false
}
