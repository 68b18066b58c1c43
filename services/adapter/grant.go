package adapter

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/grant"
	"github.com/v0m3/v0m3/internal/receipt"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
)

// checkGrant verifies the execution grant of req: signed by the
// orchestrator, within its time, and binding exactly this request. It runs
// before anything else Execute does, so a call without a valid grant
// starts no process, sends nothing and leaves no trace of a remote call.
// ok is false only for an adapter in plaintext development mode, which has
// nothing to verify with (Deps.InsecureUngranted).
func (s *Server) checkGrant(ctx context.Context, req *adapterv1.ExecuteRequest) (g grant.Grant, ok bool, err error) {
	if s.deps.Credentials == nil {
		if s.deps.InsecureUngranted {
			return grant.Grant{}, false, nil
		}
		return grant.Grant{}, false, s.grantRefused(ctx, req, &grant.Error{Reason: grant.ReasonUnverifiable,
			Msg: "this adapter has no service certificate to verify execution grants with; configure --tls-cert-file, --tls-key-file and --tls-ca-file"})
	}
	g, err = grant.Verify(s.deps.Credentials, req.GetGrant(), time.Now())
	if err == nil {
		err = g.Match(req)
	}
	if err != nil {
		return grant.Grant{}, false, s.grantRefused(ctx, req, err)
	}
	return g, true, nil
}

// useGrant spends g, once: a replayed request is refused.
func (s *Server) useGrant(ctx context.Context, req *adapterv1.ExecuteRequest, g grant.Grant) error {
	if s.grants.Use(g, time.Now()) {
		return nil
	}
	return s.grantRefused(ctx, req, &grant.Error{Reason: grant.ReasonUsed,
		Msg: "execution grant " + g.ID + " was already used; every attempt needs its own grant"})
}

// grantRefused logs a refused grant and returns its PERMISSION_DENIED
// status.
func (s *Server) grantRefused(ctx context.Context, req *adapterv1.ExecuteRequest, err error) error {
	var ge *grant.Error
	if !errors.As(err, &ge) {
		ge = &grant.Error{Reason: grant.ReasonInvalid, Msg: err.Error()}
	}
	s.log.WarnContext(ctx, "execute refused: execution grant", "reason", ge.Reason, "field", ge.Field,
		"connection_id", req.GetConnectionId(), "mapping_id", req.GetMappingId(), "attempt_id", req.GetAttemptId())
	var md map[string]string
	if ge.Field != "" {
		md = map[string]string{"field": ge.Field}
	}
	return apierror.New(codes.PermissionDenied, ge.Reason, ge.Msg, md)
}

// attest signs the receipt attestation of an OK result: what this adapter
// observed for the granted attempt. A failure to sign leaves the response
// without one, which the orchestrator treats as no evidence of the effect.
// A caller that has no use for one (a read) asks for none: signing is an
// ECDSA signature and a certificate-carrying JWS per call.
func (s *Server) attest(ctx context.Context, g grant.Grant, req *adapterv1.ExecuteRequest, resp *adapterv1.ExecuteResponse) {
	if resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK || s.deps.Credentials == nil || req.GetOmitReceiptAttestation() {
		return
	}
	artifact, delivery := receipt.Fields(resp.GetStructuredContent())
	observed := time.Now()
	if t := resp.GetObserveTime(); t != nil {
		observed = t.AsTime()
	}
	tok, err := receipt.Attest(s.deps.Credentials, receipt.Attestation{
		GrantID: g.ID, AttemptID: req.GetAttemptId(), IntentID: g.IntentID, TaskID: req.GetTaskId(),
		ResponseDigest: resp.GetResponseDigest(), ArtifactDigest: artifact, DeliveryID: delivery,
	}, observed)
	if err != nil {
		s.log.ErrorContext(ctx, "sign receipt attestation", "attempt_id", req.GetAttemptId(), "error", logText(err))
		return
	}
	resp.ReceiptAttestation = tok
}
