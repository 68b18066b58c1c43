package orchestrator

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/failpoint"
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
)

// reasonReplicaStopped is the reason of a call cut off by a fail point.
const reasonReplicaStopped = "ORCHESTRATOR_STOPPED"

// lease is this replica's claim on one request while it works on it. It is
// renewed in the background every third of its ttl until released. A
// lease that could not be renewed is lost: another replica may have taken
// the request over, so this one must not call the adapter for it again.
type lease struct {
	s         *Server
	requestID string
	// gen is the lease's generation: every write made under the lease
	// carries it (fence), so one made after another replica took the
	// request over is refused.
	gen  int64
	stop chan struct{}
	done chan struct{}
	lost atomic.Bool
	// renewed is when the lease was last taken or renewed (unix nanos):
	// a lease not renewed for its ttl (the store unreachable) may have
	// expired, so it is no proof of ownership.
	renewed atomic.Int64
	// abandoned leases are left to expire (a replica that "died").
	abandoned atomic.Bool
	// handed leases belong to work that outlives the call that took
	// them (handOff): that call's release leaves them held.
	handed atomic.Bool
	// kept leases belong to a result held until its observation is
	// recorded (see awaitObservation): no call's release ends them.
	kept atomic.Bool
	// settled: the last write under the lease left the request executed,
	// with nothing for recovery, an approver or a settler to do. Nobody
	// needs its lease released, so end leaves it to expire with its ttl
	// (a store round trip fewer on every call's path).
	settled atomic.Bool
	once    sync.Once
}

// own takes this replica's lease on a request. ok is false when another
// replica, or another call of this one, is working on it.
func (s *Server) own(ctx context.Context, requestID string) (l *lease, ok bool, err error) {
	if !s.reserve(requestID) {
		return nil, false, nil
	}
	gen, err := s.st.AcquireLease(ctx, requestID, s.replica, 0, s.leaseTTL)
	if err != nil || gen == 0 {
		s.unreserve(requestID)
		if err != nil {
			return nil, false, fmt.Errorf("take the lease of request %s: %w", requestID, err)
		}
		return nil, false, nil
	}
	return s.leased(requestID, gen, time.Now()), true, nil
}

// reserve marks a request as worked on by a call of this replica; false
// when another call is.
func (s *Server) reserve(requestID string) bool {
	s.workMu.Lock()
	defer s.workMu.Unlock()
	if s.working[requestID] {
		return false
	}
	s.working[requestID] = true
	return true
}

// unreserve ends a reservation that took no lease.
func (s *Server) unreserve(requestID string) {
	s.workMu.Lock()
	delete(s.working, requestID)
	s.workMu.Unlock()
}

// leased is the lease of generation gen a reserved request's call took
// at taken, renewed from then on.
func (s *Server) leased(requestID string, gen int64, taken time.Time) *lease {
	l := &lease{s: s, requestID: requestID, gen: gen, stop: make(chan struct{}), done: make(chan struct{})}
	l.renewed.Store(taken.UnixNano())
	go l.renew()
	return l
}

// claimFailed is the error of a call that could not take a request's
// lease because the store did not answer: UNAVAILABLE with a RetryInfo,
// as every store outage is (apierror.Store).
func claimFailed(what string) error {
	return apierror.Unavailable(apierror.ReasonStoreUnavailable, "the orchestrator could not claim "+what+"; the store is unreachable, retry in a moment", nil)
}

func (l *lease) renew() {
	defer close(l.done)
	t := time.NewTicker(max(l.s.leaseTTL/3, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-l.s.ctx.Done():
			// A closing replica stops renewing: its requests are taken
			// over once their leases expire.
			return
		case <-t.C:
		}
		gen, err := l.s.st.AcquireLease(l.s.ctx, l.requestID, l.s.replica, l.gen, l.s.leaseTTL)
		if err == nil && gen == 0 {
			l.lost.Store(true)
			l.s.log.Error("lease of an in-flight request lost to another replica", "request", l.requestID)
			return
		}
		if err != nil {
			l.s.log.Warn("renew request lease", "request", l.requestID, "err", err)
			continue
		}
		l.renewed.Store(time.Now().UnixNano())
	}
}

// release ends the lease (unless it was abandoned) and stops its renewal;
// a lease handed off is left to the work it was handed to.
func (l *lease) release() {
	if l == nil || l.handed.Load() || l.kept.Load() {
		return
	}
	l.end()
}

// handOff passes the lease to work that continues after the call that
// took it returns (return_immediately): that call's deferred release
// leaves it held, and the work calls the returned func when it ends, so
// no other replica's recovery takes the request over while it runs.
func (l *lease) handOff() (release func()) {
	if l == nil {
		return func() {}
	}
	l.handed.Store(true)
	return func() {
		l.handed.Store(false)
		l.release()
	}
}

// keep keeps the lease past the release of every call that holds it,
// until end.
func (l *lease) keep() { l.kept.Store(true) }

func (l *lease) end() {
	l.once.Do(func() {
		close(l.stop)
		<-l.done
		if !l.abandoned.Load() && !l.settled.Load() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := l.s.st.ReleaseLease(ctx, l.requestID, l.s.replica); err != nil {
				l.s.log.Warn("release request lease", "request", l.requestID, "err", err)
			}
		}
		l.s.workMu.Lock()
		delete(l.s.working, l.requestID)
		l.s.workMu.Unlock()
	})
}

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

type leaseKey struct{}

func withLease(ctx context.Context, l *lease) context.Context {
	return context.WithValue(ctx, leaseKey{}, l)
}

func leaseOf(ctx context.Context) *lease {
	l, _ := ctx.Value(leaseKey{}).(*lease)
	return l
}

// stillOwner fails when the lease ctx works under was lost, or could not
// be renewed for its whole ttl: another replica may be working on the
// request now, and one remote call per intent matters more than finishing
// here.
func stillOwner(ctx context.Context) error {
	if l := leaseOf(ctx); l != nil && (l.lost.Load() || time.Since(time.Unix(0, l.renewed.Load())) >= l.s.leaseTTL) {
		return leaseLost(l.requestID)
	}
	return nil
}

// reasonLeaseLost is the reason of a call cut off because another replica
// took its request over.
const reasonLeaseLost = "REQUEST_LEASE_LOST"

func leaseLost(requestID string) error {
	return apierror.New(codes.Aborted, reasonLeaseLost,
		fmt.Sprintf("this orchestrator replica lost its claim on request %s; another replica continues it", requestID),
		map[string]string{"request_id": requestID})
}

// fence is what the writes made under l carry; none for no lease.
func (l *lease) fence() Fence {
	if l == nil {
		return Fence{}
	}
	return Fence{RequestID: l.requestID, Generation: l.gen}
}

// fenceOn is what a write to request id carries under ctx's lease: the
// lease's fence when it is that request's, else none.
func fenceOn(ctx context.Context, id string) Fence {
	if f := leaseOf(ctx).fence(); f.RequestID == id {
		return f
	}
	return Fence{}
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
	if l := leaseOf(ctx); l != nil && l.requestID == id {
		l.lost.Store(true)
	}
	return leaseLost(id)
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
		l.abandoned.Store(true)
	}
	return apierror.New(codes.Unavailable, reasonReplicaStopped, "the orchestrator replica stopped at "+point, nil)
}
