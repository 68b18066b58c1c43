// Package audit records privileged actions in the evidence service's
// append-only audit log: who (the authenticated principal), what, on which
// resource, at which revision, and how it ended. The services that take
// those actions call Record right after deciding; the evidence service
// stamps time and order.
package audit

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	"github.com/v0m3/v0m3/services/identity"
	"github.com/v0m3/v0m3/services/internal/apierror"
	"github.com/v0m3/v0m3/services/internal/ids"
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

// Recorder appends audit records for one service. A record evidence
// could not take (it is unavailable, or its store is) waits in a queue,
// in order, and is appended again until it is taken: an evidence outage
// or restart delays the audit log, it does not leave holes in it. The
// queue is in memory and bounded (maxQueued); a record that does not fit,
// or is waiting when the service stops, is logged as lost. A nil Recorder
// records nothing (a service running without an evidence service, in unit
// tests).
type Recorder struct {
	to  Appender
	log *slog.Logger
	now func() time.Time
	// retryWait is the first wait before appending queued records again;
	// it doubles up to maxRetryWait.
	retryWait time.Duration

	mu sync.Mutex
	// queued records wait for evidence, oldest first; a goroutine
	// appends them while it is not empty.
	queued []*evidencev1.AppendAuditRecordRequest
	// lost counts records dropped since the last one logged as lost.
	lost int
	// closed: the service is stopping; nothing more is queued.
	closed bool
}

// Queue bounds and timing.
const (
	// maxQueued bounds the records waiting for evidence.
	maxQueued = 10000
	// appendWait bounds one append: an action's response waits for its
	// record at most this long, then the record queues.
	appendWait = 5 * time.Second
	// firstRetryWait and maxRetryWait bound the waits between appending
	// queued records again.
	firstRetryWait = time.Second
	maxRetryWait   = 30 * time.Second
)

// New returns a recorder appending to evidence; nil evidence returns nil.
func New(evidence Appender, log *slog.Logger) *Recorder {
	if evidence == nil {
		return nil
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Recorder{to: evidence, log: log, now: time.Now, retryWait: firstRetryWait}
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
// happened (or been refused), so a failure to record never undoes or
// fails it: the record queues and is appended once evidence is back (see
// Recorder). It waits at most appendWait, and not at all while records
// are queued: it queues behind them, keeping the log in order.
func (r *Recorder) Record(ctx context.Context, action, resource, revision string, err error, detail string) {
	if r == nil {
		return
	}
	// The request id makes an append sent again after a timeout (which
	// evidence may have stored) appear once.
	rec := &evidencev1.AppendAuditRecordRequest{RequestId: ids.New("audreq"), Record: &evidencev1.AuditRecord{
		Principal: Principal(ctx), Action: action, Resource: resource, Revision: revision,
		Outcome: OutcomeOf(err), Detail: detail, ActionTime: timestamppb.New(r.now())}}
	r.mu.Lock()
	if len(r.queued) > 0 {
		r.enqueue(ctx, rec)
		r.mu.Unlock()
		return
	}
	r.mu.Unlock()
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), appendWait)
	defer cancel()
	aerr := r.append(actx, rec)
	if aerr == nil {
		return
	}
	if !retryable(aerr) {
		r.log.ErrorContext(ctx, "audit record refused by evidence, not appended", "action", action, "resource", resource, "outcome", rec.GetRecord().GetOutcome(), "err", aerr)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.queued) == 0 {
		r.log.WarnContext(ctx, "audit records wait for evidence; appended once it is back", "action", action, "resource", resource, "err", aerr)
	}
	r.enqueue(ctx, rec)
}

func (r *Recorder) append(ctx context.Context, rec *evidencev1.AppendAuditRecordRequest) error {
	_, err := r.to.AppendAuditRecord(ctx, rec)
	return err
}

// retryable says whether evidence may take the record later: it was
// unavailable, slow, or out of room, not refusing the record itself.
func retryable(err error) bool {
	switch apierror.Code(err) {
	case codes.InvalidArgument, codes.PermissionDenied, codes.Unauthenticated, codes.Unimplemented, codes.FailedPrecondition:
		return false
	}
	return true
}

// enqueue queues rec, starting the goroutine that appends the queue when
// it was empty. Called with mu held.
func (r *Recorder) enqueue(ctx context.Context, rec *evidencev1.AppendAuditRecordRequest) {
	if r.closed {
		r.log.ErrorContext(ctx, "audit record lost: evidence did not take it while the service stopped", "action", rec.GetRecord().GetAction(), "resource", rec.GetRecord().GetResource())
		return
	}
	if len(r.queued) >= maxQueued {
		if r.lost++; r.lost == 1 {
			r.log.ErrorContext(ctx, "audit records lost: too many wait for evidence", "waiting", len(r.queued), "action", rec.GetRecord().GetAction(), "resource", rec.GetRecord().GetResource())
		}
		return
	}
	r.queued = append(r.queued, rec)
	if len(r.queued) == 1 {
		go r.drain()
	}
}

// drain appends the queued records in order until the queue is empty,
// waiting longer between tries while evidence does not take them.
func (r *Recorder) drain() {
	wait := r.retryWait
	for {
		time.Sleep(wait)
		for {
			r.mu.Lock()
			if len(r.queued) == 0 || r.closed {
				r.mu.Unlock()
				return
			}
			rec := r.queued[0]
			r.mu.Unlock()
			ctx, cancel := context.WithTimeout(context.Background(), appendWait)
			err := r.append(ctx, rec)
			cancel()
			if err != nil && retryable(err) {
				break
			}
			if err != nil {
				r.log.Error("audit record refused by evidence, not appended", "action", rec.GetRecord().GetAction(), "resource", rec.GetRecord().GetResource(), "err", err)
			}
			r.mu.Lock()
			if r.closed {
				// Close took the queue over (and appends rec again:
				// under the same request id, so once).
				r.mu.Unlock()
				return
			}
			r.queued = r.queued[1:]
			empty, lost := len(r.queued) == 0, r.lost
			if empty {
				r.queued, r.lost = nil, 0
			}
			r.mu.Unlock()
			if empty {
				r.log.Info("audit records that waited for evidence are appended", "lost", lost)
				return
			}
			wait = r.retryWait
		}
		wait = min(2*wait, maxRetryWait)
	}
}

// Close is called when the service stops: it appends the records still
// waiting, until ctx ends, and logs those evidence did not take as lost.
// Records after Close are appended once, not queued.
func (r *Recorder) Close(ctx context.Context) {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.closed = true
	queued := r.queued
	r.queued = nil
	r.mu.Unlock()
	for i, rec := range queued {
		actx, cancel := context.WithTimeout(ctx, appendWait)
		err := r.append(actx, rec)
		cancel()
		if err != nil {
			r.log.ErrorContext(ctx, "audit records lost: evidence did not take them before the service stopped", "lost", len(queued)-i, "err", err)
			return
		}
	}
}
