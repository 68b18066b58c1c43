package attack_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/demo/fixture"
	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/suite"
)

// markingStdio is a stdio transport whose shell creates marker, then runs
// the fixture server: if the marker exists, a process was started.
func markingStdio(marker string) *registryv1.Transport {
	return &registryv1.Transport{Kind: &registryv1.Transport_Stdio{Stdio: &registryv1.StdioTransport{
		Command: "/bin/sh",
		Args:    []string{"-c", `: > "$0" && exec "$1" --transport stdio`, marker, fixtureBin},
	}}}
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return !errors.Is(err, os.ErrNotExist)
}

// refusedUnreviewed tries every adapter call that would start or contact
// conn's server, as the callers the access table admits, and checks that
// each is refused with CONNECTION_NOT_REVIEWED and no snapshot was
// recorded. untouched reports whether the server is still untouched.
func refusedUnreviewed(t *testing.T, s *suite.Suite, who person, conn *registryv1.Connection, untouched func() bool) {
	t.Helper()
	operator, orchestrator := peers(t, s, identity.Operator), peers(t, s, identity.Orchestrator)
	calls := []struct {
		name string
		call func() error
	}{
		{"Discover by " + who.ID, func() error {
			_, err := s.Adapter.Discover(testkit.As(s, who), &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()})
			return err
		}},
		{"Discover by the operator", func() error {
			_, err := operator.Adapter.Discover(context.Background(), &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()})
			return err
		}},
		{"Health by the operator", func() error {
			_, err := operator.Adapter.Health(context.Background(), &adapterv1.HealthRequest{ConnectionId: conn.GetId()})
			return err
		}},
		{"Execute by the orchestrator", func() error {
			// With a valid execution grant for exactly this call: what
			// refuses it must be the review.
			_, err := orchestrator.Adapter.Execute(context.Background(), sign(t, creds(t, s, identity.Orchestrator), &adapterv1.ExecuteRequest{
				ConnectionId: conn.GetId(), ConfigRevision: conn.GetConfigRevision(), MappingId: "map_forged", MappingRevision: 1,
				AttemptId: "att_forged", Target: &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: "search"},
				Limits: &registryv1.Limits{MaxResponseBytes: 1 << 16, MaxItems: 5},
			}, nil, time.Minute))
			return err
		}},
	}
	for _, c := range calls {
		if err := c.call(); !apierror.Is(err, codes.FailedPrecondition, "CONNECTION_NOT_REVIEWED") {
			t.Errorf("%s of unreviewed %s: err = %v (reason %q), want FAILED_PRECONDITION CONNECTION_NOT_REVIEWED",
				c.name, conn.GetId(), err, apierror.Reason(err))
		}
		if !untouched() {
			t.Fatalf("%s of unreviewed %s reached the server", c.name, conn.GetId())
		}
	}
	snaps, err := s.Registry.ListSnapshots(testkit.As(s, rita), &registryv1.ListSnapshotsRequest{ConnectionId: conn.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	for _, snap := range snaps.GetSnapshots() {
		if snap.GetConfigRevision() == conn.GetConfigRevision() {
			t.Errorf("snapshot %s recorded for unreviewed config revision %d", snap.GetId(), conn.GetConfigRevision())
		}
	}
}

func review(t *testing.T, s *suite.Suite, who person, conn *registryv1.Connection, approve bool) (*registryv1.Connection, error) {
	t.Helper()
	return s.Registry.ReviewConnection(testkit.As(s, who), &registryv1.ReviewConnectionRequest{
		ConnectionId: conn.GetId(), ConfigRevision: conn.GetConfigRevision(), Approve: approve, Note: "reviewed by " + who.ID})
}

func wantState(t *testing.T, s *suite.Suite, id string, want registryv1.ReviewState, wantReviewer string) *registryv1.Connection {
	t.Helper()
	c, err := s.Registry.GetConnection(testkit.As(s, rita), &registryv1.GetConnectionRequest{Id: id})
	if err != nil {
		t.Fatal(err)
	}
	if c.GetReviewState() != want || c.GetReviewedBy() != wantReviewer {
		t.Fatalf("connection %s: %v reviewed by %q, want %v by %q", id, c.GetReviewState(), c.GetReviewedBy(), want, wantReviewer)
	}
	return c
}

// TestUnreviewedStdioNeverStarts: a stdio connection's command does not
// run before a reviewer other than its proposer approves it, nor after a
// change of command until that change is approved; a credential-only
// change keeps the approval.
func TestUnreviewedStdioNeverStarts(t *testing.T) {
	t.Parallel()
	s := start(t)
	dir := testkit.WritableDir(t)
	first, second := filepath.Join(dir, "first"), filepath.Join(dir, "second")

	conn, err := s.Registry.CreateConnection(testkit.As(s, pat), &registryv1.CreateConnectionRequest{
		DisplayName: "notes over stdio", Owner: "platform", Transport: markingStdio(first)})
	if err != nil {
		t.Fatal(err)
	}
	if conn.GetReviewState() != registryv1.ReviewState_REVIEW_STATE_PENDING || conn.GetCreatedBy() != pat.ID || conn.GetProposedBy() != pat.ID {
		t.Fatalf("created %v by %q proposed by %q; want PENDING, both %s from the token", conn.GetReviewState(), conn.GetCreatedBy(), conn.GetProposedBy(), pat.ID)
	}
	refusedUnreviewed(t, s, pat, conn, func() bool { return !exists(first) })

	// Nobody approves their own connection, and only reviewers review.
	_, err = review(t, s, pat, conn, true)
	if !apierror.Is(err, codes.PermissionDenied, "SELF_REVIEW") {
		t.Errorf("self-review: err = %v, want PERMISSION_DENIED SELF_REVIEW", err)
	}
	_, err = review(t, s, alice, conn, true)
	if !apierror.Is(err, codes.PermissionDenied, "ROLE_NOT_GRANTED") {
		t.Errorf("review by an author: err = %v, want PERMISSION_DENIED ROLE_NOT_GRANTED", err)
	}
	wantState(t, s, conn.GetId(), registryv1.ReviewState_REVIEW_STATE_PENDING, "")
	refusedUnreviewed(t, s, pat, conn, func() bool { return !exists(first) })

	if conn, err = review(t, s, rita, conn, true); err != nil {
		t.Fatalf("review by rita: %v", err)
	}
	if _, err := s.Adapter.Discover(testkit.As(s, pat), &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()}); err != nil {
		t.Fatalf("discover after review: %v", err)
	}
	if !exists(first) {
		t.Fatal("the approved command did not run: the marker check proves nothing")
	}

	// A change of what runs is pending again, proposed by whoever made it.
	conn, err = s.Registry.UpdateConnection(testkit.As(s, pat), &registryv1.UpdateConnectionRequest{
		Id: conn.GetId(), ExpectedConfigRevision: conn.GetConfigRevision(), Transport: markingStdio(second), Reason: "new marker"})
	if err != nil {
		t.Fatal(err)
	}
	if conn.GetReviewState() != registryv1.ReviewState_REVIEW_STATE_PENDING || conn.GetConfigRevision() != 2 || conn.GetProposedBy() != pat.ID {
		t.Fatalf("after a command change: %v at revision %d proposed by %q, want PENDING at 2 by %s", conn.GetReviewState(), conn.GetConfigRevision(), conn.GetProposedBy(), pat.ID)
	}
	refusedUnreviewed(t, s, pat, conn, func() bool { return !exists(second) })
	if _, err = review(t, s, pat, conn, true); !apierror.Is(err, codes.PermissionDenied, "SELF_REVIEW") {
		t.Errorf("self-review of the change: err = %v, want PERMISSION_DENIED SELF_REVIEW", err)
	}
	if conn, err = review(t, s, rita, conn, true); err != nil {
		t.Fatalf("review of revision 2: %v", err)
	}
	if _, err := s.Adapter.Discover(testkit.As(s, pat), &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()}); err != nil || !exists(second) {
		t.Fatalf("discover after the second review: %v (marker %v)", err, exists(second))
	}

	// Rotating the credential keeps the review.
	conn, err = s.Registry.UpdateConnection(testkit.As(s, pat), &registryv1.UpdateConnectionRequest{
		Id: conn.GetId(), ExpectedConfigRevision: conn.GetConfigRevision(), Transport: conn.GetTransport(),
		CredentialScope: "read-only notes", CredentialVersion: "2", Reason: "credential rotation"})
	if err != nil {
		t.Fatal(err)
	}
	if conn.GetConfigRevision() != 3 || conn.GetReviewState() != registryv1.ReviewState_REVIEW_STATE_APPROVED || conn.GetReviewedConfigRevision() != 2 {
		t.Fatalf("after a credential rotation: revision %d %v (reviewed at %d), want 3 APPROVED (reviewed at 2)",
			conn.GetConfigRevision(), conn.GetReviewState(), conn.GetReviewedConfigRevision())
	}
	if _, err := s.Adapter.Discover(testkit.As(s, pat), &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()}); err != nil {
		t.Fatalf("discover after a credential rotation: %v", err)
	}
}

// counting serves a real MCP server (the fixture, go-sdk) over streamable
// HTTP and counts every request that reaches it.
type counting struct {
	n atomic.Int64
	h http.Handler
}

func (c *counting) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.n.Add(1)
	c.h.ServeHTTP(w, r)
}

// TestUnreviewedEndpointNeverContacted: no request reaches an HTTP
// connection's endpoint before review, nor a changed endpoint before its
// change is reviewed, whoever created it.
func TestUnreviewedEndpointNeverContacted(t *testing.T) {
	t.Parallel()
	s := start(t)
	srv, err := fixture.NewServer(fixture.Options{})
	if err != nil {
		t.Fatal(err)
	}
	count := &counting{h: mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)}
	ts := httptest.NewServer(count)
	t.Cleanup(ts.Close)
	endpoint := func(path string) *registryv1.Transport {
		return &registryv1.Transport{Kind: &registryv1.Transport_StreamableHttp{StreamableHttp: &registryv1.StreamableHTTPTransport{Url: ts.URL + path}}}
	}
	untouched := func(n int64) func() bool { return func() bool { return count.n.Load() == n } }

	conn, err := s.Registry.CreateConnection(testkit.As(s, ivan), &registryv1.CreateConnectionRequest{
		DisplayName: "notes over http", Owner: "platform", Transport: endpoint("/mcp")})
	if err != nil {
		t.Fatal(err)
	}
	refusedUnreviewed(t, s, ivan, conn, untouched(0))
	if conn, err = review(t, s, rita, conn, true); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Adapter.Discover(testkit.As(s, ivan), &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()}); err != nil {
		t.Fatalf("discover after review: %v", err)
	}
	if count.n.Load() == 0 {
		t.Fatal("discovery of the approved endpoint sent nothing: the counter proves nothing")
	}

	conn, err = s.Registry.UpdateConnection(testkit.As(s, ivan), &registryv1.UpdateConnectionRequest{
		Id: conn.GetId(), ExpectedConfigRevision: conn.GetConfigRevision(), Transport: endpoint("/elsewhere"), Reason: "moved"})
	if err != nil {
		t.Fatal(err)
	}
	if conn.GetReviewState() != registryv1.ReviewState_REVIEW_STATE_PENDING {
		t.Fatalf("after an endpoint change: %v, want PENDING", conn.GetReviewState())
	}
	refusedUnreviewed(t, s, ivan, conn, untouched(count.n.Load()))

	// A connection the operator creates is pending too, proposed by the
	// operator's service identity, which no person's id can be.
	op := peers(t, s, identity.Operator)
	byOperator, err := op.Registry.CreateConnection(context.Background(), &registryv1.CreateConnectionRequest{
		DisplayName: "installed by the operator", Owner: "platform", Transport: endpoint("/operator")})
	if err != nil {
		t.Fatal(err)
	}
	const operatorID = "spiffe://v0m3/service/operator"
	if byOperator.GetReviewState() != registryv1.ReviewState_REVIEW_STATE_PENDING || byOperator.GetCreatedBy() != operatorID || byOperator.GetProposedBy() != operatorID {
		t.Fatalf("operator's connection: %v created by %q proposed by %q", byOperator.GetReviewState(), byOperator.GetCreatedBy(), byOperator.GetProposedBy())
	}
	refusedUnreviewed(t, s, ivan, byOperator, untouched(count.n.Load()))
	// A peer service cannot review: the access table admits only people.
	_, err = op.Registry.ReviewConnection(context.Background(), &registryv1.ReviewConnectionRequest{
		ConnectionId: byOperator.GetId(), ConfigRevision: 1, Approve: true})
	if apierror.Code(err) != codes.PermissionDenied && apierror.Code(err) != codes.Unauthenticated {
		t.Errorf("review by the operator service: err = %v, want refused by the access table", err)
	}
	wantState(t, s, byOperator.GetId(), registryv1.ReviewState_REVIEW_STATE_PENDING, "")
}
