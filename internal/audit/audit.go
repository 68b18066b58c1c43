// Package audit records privileged actions in the evidence service's
// append-only audit log: who (the authenticated principal), what, on which
// resource, at which revision, and how it ended. The services that take
// those actions call Record right after deciding; the evidence service
// stamps time and order.
package audit

import (
	"context"
	"log/slog"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/ids"
	"github.com/v0m3/v0m3/internal/retryqueue"
	"github.com/v0m3/v0m3/internal/telemetry"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
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
	// ConnectionUpdate is a connection update that did not touch its
	// credential: a new transport, image, sandbox record or description.
	ConnectionUpdate   = "connection.update"
	ConnectionDiscover = "connection.discover"
	CapabilityWrite    = "capability.write"
	ProfileWrite       = "profile.write"
	ClaimLink          = "claim.link"
	// EvidencePrune strips protocol evidence from traces (EvidenceService.Prune).
	EvidencePrune = "evidence.prune"
	// McpTokenMint issues a task-scoped MCP bearer token.
	McpTokenMint = "mcp_token.mint"
)

// Outcome OK is a completed action; a refusal's outcome is its ErrorInfo
// reason.
const OK = "ok"

// Appender is the evidence RPC the recorder calls.
type Appender interface {
	AppendAuditRecord(ctx context.Context, in *evidencev1.AppendAuditRecordRequest, opts ...grpc.CallOption) (*evidencev1.AuditRecord, error)
}

// Recorder appends audit records for one service. A record evidence
// could not take (it is unavailable, or its store is) waits in a queue,
// in order, and in the service's own store (its spool), and is appended
// again until it is taken: an evidence outage or restart delays the audit
// log, it does not leave holes in it, even when the recording service
// crashes or stops meanwhile (see retryqueue; each record carries a
// request id, so one appended twice is stored once). A nil Recorder
// records nothing (a service running without an evidence service, in
// unit tests).
type Recorder struct {
	q *retryqueue.Queue[*evidencev1.AppendAuditRecordRequest]
}

// New returns a recorder appending to evidence for service (a metric
// label); nil evidence returns nil. spool keeps the records that wait
// across a restart (see Recover); nil keeps them in memory only.
func New(evidence Appender, service string, spool retryqueue.Spool, log *slog.Logger) *Recorder {
	if evidence == nil {
		return nil
	}
	return &Recorder{q: retryqueue.New(log, retryqueue.Options[*evidencev1.AppendAuditRecordRequest]{
		What: "audit record", Spool: spool,
		Waiting: telemetry.EvidenceBacklog.WithLabelValues(service, "audit_record"),
		Lost:    telemetry.EvidenceLost.WithLabelValues(service, "audit_record"),
		Encode:  func(rec *evidencev1.AppendAuditRecordRequest) ([]byte, error) { return proto.Marshal(rec) },
		Decode: func(b []byte) (*evidencev1.AppendAuditRecordRequest, error) {
			rec := &evidencev1.AppendAuditRecordRequest{}
			return rec, proto.Unmarshal(b, rec)
		},
		Send: func(ctx context.Context, rec *evidencev1.AppendAuditRecordRequest) error {
			_, err := evidence.AppendAuditRecord(ctx, rec)
			return err
		},
		Describe: func(rec *evidencev1.AppendAuditRecordRequest) []any {
			return []any{"action", rec.GetRecord().GetAction(), "resource", rec.GetRecord().GetResource(), "outcome", rec.GetRecord().GetOutcome()}
		},
	})}
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

// Principal is who ctx's RPC acts for (identity.Caller.Principal): the
// verified bearer-token subject, or the SPIFFE URI of the peer service
// that called (e.g. spiffe://v0m3/service/operator), which no token's
// subject can be; or "unknown".
func Principal(ctx context.Context) string {
	c, ok := identity.CallerFrom(ctx)
	if !ok || c.ID == "" {
		return "unknown"
	}
	return c.Principal()
}

// Record appends one record for ctx's principal. The action has already
// happened (or been refused), so a failure to record never undoes or
// fails it: the record queues and is appended once evidence is back (see
// Recorder). It waits at most retryqueue.DefaultSendWait, and not at all
// while records are queued: it queues behind them, keeping the log in
// order.
func (r *Recorder) Record(ctx context.Context, action, resource, revision string, err error, detail string) {
	if r == nil {
		return
	}
	// The request id makes an append sent again after a timeout (which
	// evidence may have stored) appear once.
	r.q.Send(ctx, &evidencev1.AppendAuditRecordRequest{RequestId: ids.New("audreq"), Record: &evidencev1.AuditRecord{
		Principal: Principal(ctx), Action: action, Resource: resource, Revision: revision,
		Outcome: OutcomeOf(err), Detail: detail, ActionTime: timestamppb.Now()}})
}

// Recover queues the records the spool kept across a restart (of this
// service or another replica) to be appended; call it once the service
// starts.
func (r *Recorder) Recover(ctx context.Context) error {
	if r == nil {
		return nil
	}
	return r.q.Recover(ctx)
}

// Close is called when the service stops: it appends the records still
// waiting, until ctx ends; those evidence did not take stay in the spool
// for the next start (without one, they are logged as lost).
// Records after Close are appended once, not queued.
func (r *Recorder) Close(ctx context.Context) {
	if r != nil {
		r.q.Close(ctx)
	}
}
