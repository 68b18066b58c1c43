// Package lease is how one orchestrator replica owns an in-flight request
// while it works on it: a lease in the store, renewed in the background,
// whose generation fences every write made under it, and, in memory, the
// requests a call of this replica works on, so its own recovery never
// joins in. A lease that could not be renewed is lost: another replica may
// have taken the request over, so this one must not call the adapter for
// it again.
package lease

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	ostore "github.com/v0m3/v0m3/services/orchestrator/store"
)

// Store is the part of the orchestrator's store leases live in (see
// store.Store's AcquireLease and ReleaseLease).
type Store interface {
	AcquireLease(ctx context.Context, requestID, owner string, gen int64, ttl time.Duration) (int64, error)
	ReleaseLease(ctx context.Context, requestID, owner string) error
}

// Manager takes, renews and ends one replica's leases.
type Manager struct {
	st    Store
	owner string
	ttl   time.Duration
	log   *slog.Logger
	// ctx ends when the replica closes: its leases stop renewing and are
	// taken over once they expire.
	ctx context.Context

	mu      sync.Mutex
	working map[string]bool
}

// NewManager returns the lease manager of replica owner, whose leases last
// ttl without renewal, until ctx ends.
func NewManager(ctx context.Context, st Store, owner string, ttl time.Duration, log *slog.Logger) *Manager {
	return &Manager{st: st, owner: owner, ttl: ttl, log: log, ctx: ctx, working: map[string]bool{}}
}

// Lease is this replica's claim on one request while it works on it. It is
// renewed in the background every third of its ttl until released.
type Lease struct {
	m         *Manager
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
	// them (HandOff): that call's release leaves them held.
	handed atomic.Bool
	// kept leases belong to a result held until its observation is
	// recorded: no call's release ends them.
	kept atomic.Bool
	// settled: the last write under the lease left the request executed,
	// with nothing for recovery, an approver or a settler to do. Nobody
	// needs its lease released, so End leaves it to expire with its ttl
	// (a store round trip fewer on every call's path).
	settled atomic.Bool
	once    sync.Once
}

// Own takes this replica's lease on a request. ok is false when another
// replica, or another call of this one, is working on it.
func (m *Manager) Own(ctx context.Context, requestID string) (l *Lease, ok bool, err error) {
	if !m.Reserve(requestID) {
		return nil, false, nil
	}
	gen, err := m.st.AcquireLease(ctx, requestID, m.owner, 0, m.ttl)
	if err != nil || gen == 0 {
		m.Unreserve(requestID)
		if err != nil {
			return nil, false, fmt.Errorf("take the lease of request %s: %w", requestID, err)
		}
		return nil, false, nil
	}
	return m.Leased(requestID, gen, time.Now()), true, nil
}

// Reserve marks a request as worked on by a call of this replica; false
// when another call is.
func (m *Manager) Reserve(requestID string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.working[requestID] {
		return false
	}
	m.working[requestID] = true
	return true
}

// Unreserve ends a reservation that took no lease.
func (m *Manager) Unreserve(requestID string) {
	m.mu.Lock()
	delete(m.working, requestID)
	m.mu.Unlock()
}

// Leased is the lease of generation gen a reserved request's call took
// at taken, renewed from then on.
func (m *Manager) Leased(requestID string, gen int64, taken time.Time) *Lease {
	l := &Lease{m: m, requestID: requestID, gen: gen, stop: make(chan struct{}), done: make(chan struct{})}
	l.renewed.Store(taken.UnixNano())
	go l.renew()
	return l
}

// ClaimFailed is the error of a call that could not take a request's
// lease because the store did not answer: UNAVAILABLE with a RetryInfo,
// as every store outage is (apierror.Store).
func ClaimFailed(what string) error {
	return apierror.Unavailable(apierror.ReasonStoreUnavailable, "the orchestrator could not claim "+what+"; the store is unreachable, retry in a moment", nil)
}

func (l *Lease) renew() {
	defer close(l.done)
	m := l.m
	t := time.NewTicker(max(m.ttl/3, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-m.ctx.Done():
			// A closing replica stops renewing: its requests are taken
			// over once their leases expire.
			return
		case <-t.C:
		}
		gen, err := m.st.AcquireLease(m.ctx, l.requestID, m.owner, l.gen, m.ttl)
		if err == nil && gen == 0 {
			l.lost.Store(true)
			m.log.Error("lease of an in-flight request lost to another replica", "request", l.requestID)
			return
		}
		if err != nil {
			m.log.Warn("renew request lease", "request", l.requestID, "err", err)
			continue
		}
		l.renewed.Store(time.Now().UnixNano())
	}
}

// RequestID is the request the lease is on.
func (l *Lease) RequestID() string { return l.requestID }

// Release ends the lease (unless it was abandoned) and stops its renewal;
// a lease handed off or kept is left to the work it was given to.
func (l *Lease) Release() {
	if l == nil || l.handed.Load() || l.kept.Load() {
		return
	}
	l.End()
}

// HandOff passes the lease to work that continues after the call that
// took it returns (return_immediately): that call's deferred Release
// leaves it held, and the work calls the returned func when it ends, so
// no other replica's recovery takes the request over while it runs.
func (l *Lease) HandOff() (release func()) {
	if l == nil {
		return func() {}
	}
	l.handed.Store(true)
	return func() {
		l.handed.Store(false)
		l.Release()
	}
}

// Keep keeps the lease past the release of every call that holds it,
// until End.
func (l *Lease) Keep() { l.kept.Store(true) }

// Lose marks the lease lost: a write under it was fenced.
func (l *Lease) Lose() { l.lost.Store(true) }

// Abandon leaves the lease to expire, as a replica that died would.
func (l *Lease) Abandon() { l.abandoned.Store(true) }

// Settled says whether the last write under the lease left its request
// with nothing for anyone to do (see End).
func (l *Lease) Settled(settled bool) { l.settled.Store(settled) }

// End stops the renewal and releases the lease in the store, unless it
// was abandoned or its request settled, and ends the reservation.
func (l *Lease) End() {
	l.once.Do(func() {
		close(l.stop)
		<-l.done
		m := l.m
		if !l.abandoned.Load() && !l.settled.Load() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := m.st.ReleaseLease(ctx, l.requestID, m.owner); err != nil {
				m.log.Warn("release request lease", "request", l.requestID, "err", err)
			}
		}
		m.Unreserve(l.requestID)
	})
}

type leaseKey struct{}

// With returns ctx working under l.
func With(ctx context.Context, l *Lease) context.Context {
	return context.WithValue(ctx, leaseKey{}, l)
}

// Of returns the lease ctx works under, or nil.
func Of(ctx context.Context) *Lease {
	l, _ := ctx.Value(leaseKey{}).(*Lease)
	return l
}

// StillOwner fails when the lease ctx works under was lost, or could not
// be renewed for its whole ttl: another replica may be working on the
// request now, and one remote call per intent matters more than finishing
// here.
func StillOwner(ctx context.Context) error {
	if l := Of(ctx); l != nil && (l.lost.Load() || time.Since(time.Unix(0, l.renewed.Load())) >= l.m.ttl) {
		return Lost(l.requestID)
	}
	return nil
}

// ReasonLost is the reason of a call cut off because another replica
// took its request over.
const ReasonLost = "REQUEST_LEASE_LOST"

// Lost is the error of a call whose lease on requestID was lost.
func Lost(requestID string) error {
	return apierror.New(codes.Aborted, ReasonLost,
		fmt.Sprintf("this orchestrator replica lost its claim on request %s; another replica continues it", requestID),
		map[string]string{"request_id": requestID})
}

// Fence is what the writes made under l carry; none for no lease.
func (l *Lease) Fence() ostore.Fence {
	if l == nil {
		return ostore.Fence{}
	}
	return ostore.Fence{RequestID: l.requestID, Generation: l.gen}
}

// FenceOn is what a write to request id carries under ctx's lease: the
// lease's fence when it is that request's, else none.
func FenceOn(ctx context.Context, id string) ostore.Fence {
	if f := Of(ctx).Fence(); f.RequestID == id {
		return f
	}
	return ostore.Fence{}
}
