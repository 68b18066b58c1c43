package identity_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/identity"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// TestCallerLimiter: each caller gets its own bucket of Burst requests
// refilled at PerSecond; a refused request says when to retry and takes
// nothing; idle callers are forgotten.
func TestCallerLimiter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0)
	l := identity.NewCallerLimiter(identity.RateLimits{Default: identity.RateLimit{PerSecond: 2, Burst: 3}}, nil)
	l.SetClock(func() time.Time { return now })

	for i := range 3 {
		if err := l.Admit(ctx, "alice", nil); err != nil {
			t.Fatalf("alice's request %d of a burst of 3: %v", i+1, err)
		}
	}
	err := l.Admit(ctx, "alice", nil)
	if !apierror.Is(err, codes.ResourceExhausted, identity.ReasonCallerRateLimited) {
		t.Fatalf("alice's 4th request at once: %v, want RESOURCE_EXHAUSTED %s", err, identity.ReasonCallerRateLimited)
	}
	// One token comes back every 0.5 s.
	if d := apierror.RetryDelay(err); d < 500*time.Millisecond || d > 502*time.Millisecond {
		t.Errorf("retry delay %s, want 0.5 s", d)
	}
	if md := apierror.Info(err).GetMetadata(); md["caller"] != "alice" || md["requests_per_second"] != "2" || md["burst"] != "3" {
		t.Errorf("metadata %v", md)
	}
	// Another caller has a bucket of its own.
	if err := l.Admit(ctx, "bob", nil); err != nil {
		t.Errorf("bob: %v", err)
	}
	// Refusals took nothing: after 0.5 s exactly one request is admitted.
	for range 5 {
		_ = l.Admit(ctx, "alice", nil)
	}
	now = now.Add(500 * time.Millisecond)
	if err := l.Admit(ctx, "alice", nil); err != nil {
		t.Errorf("alice after 0.5 s: %v", err)
	}
	if err := l.Admit(ctx, "alice", nil); err == nil {
		t.Error("alice's second request after 0.5 s admitted; one token had come back")
	}
	if got := l.Callers(); got != 2 {
		t.Errorf("%d callers remembered, want 2", got)
	}
	// A minute later both buckets are full again: the next new caller
	// sweeps them away.
	now = now.Add(time.Minute)
	if err := l.Admit(ctx, "carol", nil); err != nil {
		t.Errorf("carol: %v", err)
	}
	if got := l.Callers(); got != 1 {
		t.Errorf("%d callers remembered after a quiet minute, want 1 (carol)", got)
	}
}

// TestCallerLimiterOff: no rate, no limiter; a nil limiter admits all.
func TestCallerLimiterOff(t *testing.T) {
	t.Parallel()
	l := identity.NewCallerLimiter(identity.RateLimits{}, nil)
	if l != nil {
		t.Fatal("a zero rate made a limiter")
	}
	for range 1000 {
		if err := l.Admit(context.Background(), "alice", nil); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCallerLimitsByGroup: a group's limit replaces the default for its
// callers; a caller in several groups gets the most generous; a group
// without a rate is not limited.
func TestCallerLimitsByGroup(t *testing.T) {
	t.Parallel()
	ls := identity.RateLimits{
		Default: identity.RateLimit{PerSecond: 1, Burst: 1},
		Groups: map[string]identity.RateLimit{
			"product-services": {PerSecond: 1, Burst: 4},
			"batch":            {PerSecond: 1, Burst: 2},
			"operators":        {},
		},
	}
	for _, tc := range []struct {
		name   string
		groups []string
		admits int // at once, before the first refusal
	}{
		{"no group", nil, 1},
		{"an unlisted group", []string{"authors"}, 1},
		{"a listed group", []string{"batch"}, 2},
		{"the most generous of two", []string{"batch", "product-services"}, 4},
		{"a group without a limit", []string{"batch", "operators"}, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			now := time.Unix(1_800_000_000, 0)
			l := identity.NewCallerLimiter(ls, nil)
			l.SetClock(func() time.Time { return now })
			n := 0
			for ; n < 100; n++ {
				if err := l.Admit(context.Background(), "caller", tc.groups); err != nil {
					break
				}
			}
			if tc.admits < 0 && n != 100 || tc.admits >= 0 && n != tc.admits {
				t.Errorf("admitted %d at once, want %d (-1: all)", n, tc.admits)
			}
		})
	}
}

// countingRegistry counts the GetConnection calls its handler ran.
type countingRegistry struct {
	echoRegistry
	n *atomic.Int64
}

func (c countingRegistry) GetConnection(ctx context.Context, req *registryv1.GetConnectionRequest) (*registryv1.Connection, error) {
	c.n.Add(1)
	return c.echoRegistry.GetConnection(ctx, req)
}

// TestGuardLimitsEachCaller: behind a guard with a rate limit, a caller
// past its burst is refused before the handler runs, with a retry delay;
// other callers, and peer services however many calls they make, are
// admitted.
func TestGuardLimitsEachCaller(t *testing.T) {
	t.Parallel()
	// One request a minute after a burst of 2: nothing refills during the
	// test.
	var handled atomic.Int64
	gs := serveGuardedWith(t, identity.RateLimits{Default: identity.RateLimit{PerSecond: 1.0 / 60, Burst: 2}}, countingRegistry{n: &handled})
	dev := gs.dev
	ctx := context.Background()

	caller := gs.asCaller(t)
	alice := dev.Issuer.As(ctx, "alice", "authors")
	for i := range 2 {
		if _, err := caller.GetConnection(alice, &registryv1.GetConnectionRequest{Id: "conn_x"}); err != nil {
			t.Fatalf("alice's request %d: %v", i+1, err)
		}
	}
	_, err := caller.GetConnection(alice, &registryv1.GetConnectionRequest{Id: "conn_x"})
	if !apierror.Is(err, codes.ResourceExhausted, identity.ReasonCallerRateLimited) {
		t.Fatalf("alice's third request: %v, want RESOURCE_EXHAUSTED %s", err, identity.ReasonCallerRateLimited)
	}
	if d := apierror.RetryDelay(err); d < 59*time.Second || d > 61*time.Second {
		t.Errorf("retry delay %s, want about a minute", d)
	}
	if !strings.Contains(err.Error(), "alice") || !strings.Contains(err.Error(), "nothing was done") {
		t.Errorf("message %q does not say who was limited and that nothing was done", err)
	}
	if got := handled.Load(); got != 2 {
		t.Errorf("the handler ran %d times, want 2: a refused request must not reach it", got)
	}
	if _, err := caller.GetConnection(dev.Issuer.As(ctx, "bob"), &registryv1.GetConnectionRequest{Id: "conn_x"}); err != nil {
		t.Errorf("bob: %v", err)
	}
	operator := gs.asPeer(t, identity.Operator, dev)
	for i := range 10 {
		if _, err := operator.GetConnection(ctx, &registryv1.GetConnectionRequest{Id: "conn_x"}); err != nil {
			t.Fatalf("operator peer's call %d: %v (peers are never limited)", i+1, err)
		}
	}
}

// BenchmarkCallerLimiterAdmit is what the limit adds to each request of a
// caller within its rate.
func BenchmarkCallerLimiterAdmit(b *testing.B) {
	l := identity.NewCallerLimiter(identity.RateLimits{Default: identity.RateLimit{PerSecond: 1e12, Burst: 1 << 30}}, nil)
	ctx := context.Background()
	groups := []string{"authors"}
	b.ReportAllocs()
	for b.Loop() {
		if err := l.Admit(ctx, "alice", groups); err != nil {
			b.Fatal(err)
		}
	}
}
