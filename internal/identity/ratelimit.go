package identity

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/v0m3/v0m3/internal/apierror"
)

// ReasonCallerRateLimited is the reason of a request refused because its
// caller sent requests faster than the server admits from one caller.
const ReasonCallerRateLimited = "CALLER_RATE_LIMITED"

// RateLimit is how fast a server admits the requests of one authenticated
// product or admin caller: a token bucket of Burst requests refilled at
// PerSecond.
type RateLimit struct {
	// PerSecond is the sustained rate; zero or less admits without limit.
	PerSecond float64
	// Burst is how many requests may come at once after a quiet spell;
	// less than one means one.
	Burst int
}

// unlimited reports whether l admits everything.
func (l RateLimit) unlimited() bool { return l.PerSecond <= 0 }

// moreGenerous reports whether l admits more than o.
func (l RateLimit) moreGenerous(o RateLimit) bool {
	switch {
	case o.unlimited():
		return false
	case l.unlimited():
		return true
	}
	return l.PerSecond > o.PerSecond || (l.PerSecond == o.PerSecond && l.Burst > o.Burst)
}

// RateLimits say how fast a server admits each caller's requests. They
// bound what one identity can make a server do (store writes, CPU) before
// any budget is looked at; peer services are never limited.
type RateLimits struct {
	// Default is the limit of a caller in none of Groups.
	Default RateLimit
	// Groups gives the callers of a group (as their token says) a limit
	// of their own, e.g. a product service acting for many users; a
	// caller in several gets the most generous.
	Groups map[string]RateLimit
}

// For returns the limit of a caller in groups.
func (ls RateLimits) For(groups []string) RateLimit {
	var (
		best  RateLimit
		found bool
	)
	for _, g := range groups {
		if l, ok := ls.Groups[g]; ok && (!found || l.moreGenerous(best)) {
			best, found = l, true
		}
	}
	if !found {
		return ls.Default
	}
	return best
}

// DefaultRateLimits are the limits a service applies unless configured
// otherwise (--caller-rate, --caller-burst, --caller-rate-groups): far
// above what a person or an agent working on tasks sends, far below what
// a script flooding the API does; product services, which start tasks and
// submit requests for many users under one identity (task.act_for), get
// twenty times as much.
var DefaultRateLimits = RateLimits{
	Default: RateLimit{PerSecond: 50, Burst: 100},
	Groups:  map[string]RateLimit{"product-services": {PerSecond: 1000, Burst: 2000}},
}

// sweepEvery is how often, at most, the limiter forgets callers whose
// bucket refilled: a full bucket is what a new caller gets anyway.
const sweepEvery = time.Minute

// CallerLimiter admits each caller's requests at its limit. It is in
// memory, per server: behind n replicas a caller gets up to n times the
// rate, which is what a rate limit (unlike a budget) may allow. A nil
// *CallerLimiter admits everything.
type CallerLimiter struct {
	limits RateLimits
	now    func() time.Time
	log    *slog.Logger

	mu        sync.Mutex
	callers   map[string]*bucket
	lastSweep time.Time
}

// bucket is one caller's tokens at its limit; refusing says its last
// request was refused, so a flood is logged once, when it starts, not per
// request.
type bucket struct {
	*rate.Limiter
	limit    RateLimit
	refusing bool
}

// NewCallerLimiter returns a limiter admitting each caller at ls, or nil
// (no limit) when ls limits nobody. log (nil discards) hears when a
// caller starts being refused.
func NewCallerLimiter(ls RateLimits, log *slog.Logger) *CallerLimiter {
	limits := ls.Default.PerSecond > 0
	for _, l := range ls.Groups {
		limits = limits || l.PerSecond > 0
	}
	if !limits {
		return nil
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &CallerLimiter{limits: ls, now: time.Now, log: log, callers: map[string]*bucket{}}
}

// Admit takes one request of the caller id (in groups) from its bucket.
// When the bucket is empty nothing is taken and the error is
// RESOURCE_EXHAUSTED, CALLER_RATE_LIMITED, with a RetryInfo saying when
// one request will be admitted again.
func (l *CallerLimiter) Admit(ctx context.Context, id string, groups []string) error {
	if l == nil {
		return nil
	}
	limit := l.limits.For(groups)
	if limit.unlimited() {
		return nil
	}
	limit.Burst = max(limit.Burst, 1)
	now := l.now()
	l.mu.Lock()
	b := l.callers[id]
	switch {
	case b == nil:
		l.sweepLocked(now)
		b = &bucket{Limiter: rate.NewLimiter(rate.Limit(limit.PerSecond), limit.Burst), limit: limit}
		l.callers[id] = b
	case b.limit != limit:
		// The caller's groups changed (a new token): its tokens so far
		// stay, at the new rate.
		b.SetLimitAt(now, rate.Limit(limit.PerSecond))
		b.SetBurstAt(now, limit.Burst)
		b.limit = limit
	}
	r := b.ReserveN(now, 1)
	wait := r.DelayFrom(now)
	if wait > 0 {
		r.CancelAt(now) // a refused request takes nothing from the bucket
	}
	started := wait > 0 && !b.refusing
	b.refusing = wait > 0
	l.mu.Unlock()
	if wait == 0 {
		return nil
	}
	if started {
		l.log.WarnContext(ctx, "caller rate limited: refusing its requests until its rate falls",
			"caller", id, "requests_per_second", limit.PerSecond, "burst", limit.Burst)
	}
	return refusal(id, limit, wait)
}

// sweepLocked forgets the callers whose bucket is full again, at most once
// per sweepEvery, so the map holds only recently busy callers.
func (l *CallerLimiter) sweepLocked(now time.Time) {
	if now.Sub(l.lastSweep) < sweepEvery {
		return
	}
	l.lastSweep = now
	for id, b := range l.callers {
		if b.TokensAt(now) >= float64(b.limit.Burst) {
			delete(l.callers, id)
		}
	}
}

func refusal(id string, limit RateLimit, wait time.Duration) error {
	wait = wait.Round(time.Millisecond) + time.Millisecond // never a zero delay
	per := strconv.FormatFloat(limit.PerSecond, 'g', -1, 64)
	err := apierror.New(codes.ResourceExhausted, ReasonCallerRateLimited,
		fmt.Sprintf("too many requests from %s: this server admits %s a second from this caller (bursts of %d); nothing was done, retry in %s",
			id, per, limit.Burst, wait),
		map[string]string{"caller": id, "requests_per_second": per, "burst": strconv.Itoa(limit.Burst)})
	if d, derr := status.Convert(err).WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(wait)}); derr == nil {
		return d.Err()
	}
	return err
}

// Callers returns how many callers the limiter currently remembers.
func (l *CallerLimiter) Callers() int {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.callers)
}
