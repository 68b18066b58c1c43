package orchestrator

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/failpoint"
	leases "github.com/v0m3/v0m3/services/orchestrator/lease"
)

// Defaults of request ownership and recovery.
const (
	// DefaultLeaseTTL is how long a replica's claim on an in-flight
	// request lasts without renewal, when Deps.LeaseTTL is zero. Another
	// replica takes the request over only after it expired.
	DefaultLeaseTTL = 30 * time.Second
	// DefaultRecoveryInterval is how often every replica looks for
	// unsettled requests nobody owns, when Deps.RecoveryInterval is zero.
	DefaultRecoveryInterval = 10 * time.Second
)

// Fail points where a test may stop a replica as if its process died: in
// process through Deps.FailPoint, or as a real crash or freeze of a binary
// built with the failpoints tag (internal/failpoint).
const (
	// FailPointTaskCreated is after a task started with a request id was
	// recorded, before its catalogue is stored: it stays ACTIVE without a
	// catalogue until a retry ends it (see replayStart).
	FailPointTaskCreated = "task.created"
	// FailPointSubmitReceived is after a request was recorded, before any
	// decision about it: it stays REQUESTED.
	FailPointSubmitReceived = "submit.received"
	// FailPointSubmitDecided is after the decision that a request awaits
	// approval was recorded, before its events are written.
	FailPointSubmitDecided = "submit.decided"
	// FailPointApprovalUsed is after an approval was used, before the
	// first attempt: the request stays APPROVED.
	FailPointApprovalUsed = "approval.used"
	// FailPointAttemptPrepared is after an attempt was persisted as
	// PREPARED, before the adapter is called.
	FailPointAttemptPrepared = "attempt.prepared"
	// FailPointAttemptExecuted is after the adapter's reply was persisted,
	// before the request is committed.
	FailPointAttemptExecuted = "attempt.executed"
	// FailPointAttemptObserved is after a retrieval's result was recorded
	// as source observations, before the request is committed.
	FailPointAttemptObserved = "attempt.observed"
	// FailPointRequestCommitted is after the request was persisted as
	// EXECUTED, before its trace and events are written.
	FailPointRequestCommitted = "request.committed"
	// FailPointRecoveryPassed is after each completed recovery pass
	// (outbox, held results, unsettled requests). It stops nothing (a
	// pass has nothing left to stop; an error is ignored): a test counts
	// it to wait until a replica could have acted, then asserts it did
	// not.
	FailPointRecoveryPassed = "recovery.passed"
)

// reasonReplicaStopped is the reason of a call cut off by a fail point.
const reasonReplicaStopped = "ORCHESTRATOR_STOPPED"

// lease is this replica's claim on one request while it works on it (see
// package lease).
type lease = leases.Lease

// own takes this replica's lease on a request. ok is false when another
// replica, or another call of this one, is working on it.
func (s *Server) own(ctx context.Context, requestID string) (*lease, bool, error) {
	return s.leases.Own(ctx, requestID)
}

// The lease package's names, as the server spells them.
var (
	claimFailed = leases.ClaimFailed
	withLease   = leases.With
	leaseOf     = leases.Of
	stillOwner  = leases.StillOwner
	leaseLost   = leases.Lost
	fenceOn     = leases.FenceOn
)

// reasonLeaseLost is the reason of a call cut off because another replica
// took its request over.
const reasonLeaseLost = leases.ReasonLost

// workInternalCalls is how many internal calls, each at its bound, the
// detached work on one request is allowed besides its attempts.
const workInternalCalls = 30

// detach returns the context the work on a request continues under once
// it is recorded, whether or not the caller still waits: not cancelled by
// the caller, owned by l, and bounded by the server's work timeout. Work
// cut off by that bound leaves the request as stored for recovery (the
// lease is released), never unrecorded.
func (s *Server) detach(ctx context.Context, l *lease) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.workTimeout)
	return withLease(ctx, l), cancel
}

// fenced ends the call whose write the store refused as stale: another
// replica took the request over and writes its own account of it. What
// the call still holds dies with it (as at a fail point), the lease is
// lost, and nothing is retried.
func (s *Server) fenced(ctx context.Context, id string, err error) error {
	s.log.WarnContext(ctx, "write dropped: another replica took the request over", "request", id, "err", err)
	if c := checkpointOf(ctx); c != nil {
		c.kill()
	}
	if l := leaseOf(ctx); l != nil && l.RequestID() == id {
		l.Lose()
	}
	return leaseLost(id)
}

// passed tells the fail points that a recovery pass completed.
func (s *Server) passed() {
	failpoint.Hit(FailPointRecoveryPassed)
	if s.deps.FailPoint != nil {
		_ = s.deps.FailPoint(FailPointRecoveryPassed)
	}
}

// failAt is a fail point: when Deps.FailPoint stops this replica at point,
// the call ends here as if the process died. Events held for the call's
// next checkpoint are dropped and the lease is left to expire.
func (s *Server) failAt(ctx context.Context, point string) error {
	// A binary built with the failpoints tag may be crashed or frozen
	// here for real; in any other it does nothing.
	failpoint.Hit(point)
	if s.deps.FailPoint == nil {
		return nil
	}
	if err := s.deps.FailPoint(point); err == nil {
		return nil
	}
	if c := checkpointOf(ctx); c != nil {
		c.kill()
	}
	if l := leaseOf(ctx); l != nil {
		l.Abandon()
	}
	return apierror.New(codes.Unavailable, reasonReplicaStopped, "the orchestrator replica stopped at "+point, nil)
}
