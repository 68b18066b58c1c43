package testkit_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/testkit"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// TestClock: a still clock reads its start until advanced; an offset
// clock runs with the wall clock, ahead by what was advanced.
func TestClock(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	c := testkit.NewClock(t0)
	if !c.Now().Equal(t0) {
		t.Fatalf("Now = %v, want %v", c.Now(), t0)
	}
	c.Advance(time.Hour)
	if !c.Now().Equal(t0.Add(time.Hour)) {
		t.Fatalf("after Advance(1h) Now = %v", c.Now())
	}
	o := testkit.NewOffsetClock()
	o.Advance(time.Hour)
	if d := time.Until(o.Now()); d < 59*time.Minute || d > 61*time.Minute {
		t.Fatalf("offset clock is %v ahead of the wall clock, want an hour", d)
	}
}

// TestWithin: a condition that comes to hold is seen; one that never
// does is reported once the bound passes.
func TestWithin(t *testing.T) {
	t.Parallel()
	n := 0
	if !testkit.Within(time.Minute, func() bool { n++; return n == 3 }) {
		t.Fatal("a condition that held on the third poll was not seen")
	}
	if testkit.Within(20*time.Millisecond, func() bool { return false }) {
		t.Fatal("a condition that never held was reported as held")
	}
}

type whoAmI struct {
	registryv1.UnimplementedRegistryServiceServer
}

func (whoAmI) GetConnection(ctx context.Context, _ *registryv1.GetConnectionRequest) (*registryv1.Connection, error) {
	c, _ := identity.CallerFrom(ctx)
	return &registryv1.Connection{Owner: c.ID, DisplayName: identity.PeerFrom(ctx)}, nil
}

// TestServeGuarded: the harness serves behind the real guard: a peer the
// access table admits is known by its certificate, a person by a token,
// and a caller without one is refused before the handler.
func TestServeGuarded(t *testing.T) {
	t.Parallel()
	g := testkit.ServeGuarded(t, identity.Registry, func(s *grpc.Server) { registryv1.RegisterRegistryServiceServer(s, whoAmI{}) })
	ctx := context.Background()
	got, err := registryv1.NewRegistryServiceClient(g.Peer(t, identity.Operator)).GetConnection(ctx, &registryv1.GetConnectionRequest{Id: "conn_x"})
	if err != nil || got.GetDisplayName() != identity.Operator {
		t.Fatalf("as the operator peer: %v, %v", got, err)
	}
	caller := registryv1.NewRegistryServiceClient(g.Caller(t))
	got, err = caller.GetConnection(testkit.As(g, testkit.Person{ID: "alice", Groups: []string{"authors"}}), &registryv1.GetConnectionRequest{Id: "conn_x"})
	if err != nil || got.GetOwner() != "alice" {
		t.Fatalf("as alice: %v, %v", got, err)
	}
	if _, err := caller.GetConnection(ctx, &registryv1.GetConnectionRequest{Id: "conn_x"}); !apierror.Is(err, codes.Unauthenticated, "CREDENTIALS_MISSING") {
		t.Fatalf("without a token: %v, want CREDENTIALS_MISSING", err)
	}
	g.Stop()
	if _, err := caller.GetConnection(testkit.As(g, testkit.Person{ID: "alice"}), &registryv1.GetConnectionRequest{Id: "conn_x"}); err == nil {
		t.Fatalf("after Stop: %v, want the connection closed", err)
	}
}
