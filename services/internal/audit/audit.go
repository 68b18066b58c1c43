// Package audit records privileged actions in the evidence service's
// append-only audit log: who (the authenticated principal), what, on which
// resource, at which revision, and how it ended. The services that take
// those actions call Record right after deciding; the evidence service
// stamps time and order.
package audit

import (
	"context"
	"log/slog"
	"time"

	"google.golang.org/grpc"

	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	"github.com/v0m3/v0m3/services/identity"
	"github.com/v0m3/v0m3/services/internal/apierror"
)

// Actions recorded. Where a Cedar action exists the name is the same.
const (
	ConnectionCreate = "connection.create"
	ConnectionReview = "connection.review"
	ConnectionRetire = "connection.retire"
	// CredentialRotate is a connection update that changed its credential
	// reference: a new config revision.
	CredentialRotate = "credential.rotate"
	MappingPropose   = "mapping.propose"
	MappingReview    = "mapping.review"
	RequestApprove   = "request.approve"
	RequestDeny      = "request.deny"
	TaskCancel       = "task.cancel"
	PolicyReload     = "policy.reload"
	// OutcomeSettle is the manual settlement of an unknown outcome
	// (OrchestratorService.SettleRequest).
	OutcomeSettle = "outcome.settle"
)

// Outcome OK is a completed action; a refusal's outcome is its ErrorInfo
// reason.
const OK = "ok"

// Appender is the evidence RPC the recorder calls.
type Appender interface {
	AppendAuditRecord(ctx context.Context, in *evidencev1.AppendAuditRecordRequest, opts ...grpc.CallOption) (*evidencev1.AuditRecord, error)
}

// Recorder appends audit records for one service. A nil Recorder records
// nothing (a service running without an evidence service, in unit tests).
type Recorder struct {
	to  Appender
	log *slog.Logger
}

// New returns a recorder appending to evidence; nil evidence returns nil.
func New(evidence Appender, log *slog.Logger) *Recorder {
	if evidence == nil {
		return nil
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Recorder{to: evidence, log: log}
}

// OutcomeOf is OK for a nil error and the error's ErrorInfo reason (or
// gRPC code) otherwise.
func OutcomeOf(err error) string {
	if err == nil {
		return OK
	}
	if r := apierror.Reason(err); r != "" {
		return r
	}
	return apierror.Code(err).String()
}

// Principal is who ctx's RPC acts for: the verified bearer-token subject,
// or the peer service that called (e.g. the operator), or "unknown".
func Principal(ctx context.Context) string {
	c, ok := identity.CallerFrom(ctx)
	switch {
	case !ok || c.ID == "":
		return "unknown"
	case c.Kind == identity.KindService:
		return "service:" + c.ID
	}
	return c.ID
}

// Record appends one record for ctx's principal. The action has already
// happened (or been refused), so a failure to record is logged, not
// returned: it never undoes or fails the action. It waits at most five
// seconds.
func (r *Recorder) Record(ctx context.Context, action, resource, revision string, err error, detail string) {
	if r == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	rec := &evidencev1.AuditRecord{Principal: Principal(ctx), Action: action, Resource: resource, Revision: revision,
		Outcome: OutcomeOf(err), Detail: detail}
	if _, aerr := r.to.AppendAuditRecord(ctx, &evidencev1.AppendAuditRecordRequest{Record: rec}); aerr != nil {
		r.log.ErrorContext(ctx, "audit record not appended", "action", action, "resource", resource, "outcome", rec.Outcome, "err", aerr)
	}
}
