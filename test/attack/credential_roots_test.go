package attack_test

import (
	"context"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

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

// bearers serves the fixture over streamable HTTP and keeps every
// Authorization header that reaches it: what the adapter handed the
// server.
type bearers struct {
	mu   sync.Mutex
	seen []string
	h    http.Handler
}

func (b *bearers) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.mu.Lock()
	b.seen = append(b.seen, r.Header.Get("Authorization"))
	b.mu.Unlock()
	b.h.ServeHTTP(w, r)
}

func (b *bearers) all() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.seen)
}

// TestCredentialMoveIsReviewedAndRooted: one platform member cannot have
// the adapter read a file no reviewer approved for the connection. A new
// credential reference sends the connection back to review, so nothing
// runs until someone else approves it; a new version of the same
// reference is a rotation. And even an approved reference is read only
// inside the connection's own directory under the adapter's credential
// roots: a host file, the adapter's own files or another connection's
// secret are refused before they are opened, and the server receives
// nothing.
func TestCredentialMoveIsReviewedAndRooted(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	s, err := suite.Start(context.Background(), suite.Config{
		DataDir: dataDir,
		Reach:   &suite.Reach{StdioRoots: []string{filepath.Dir(fixtureBin)}, AllowLoopback: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	// The default credential root: DataDir/credentials.
	root := filepath.Join(dataDir, "credentials")

	srv, err := fixture.NewServer(fixture.Options{})
	if err != nil {
		t.Fatal(err)
	}
	seen := &bearers{h: mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)}
	ts := httptest.NewServer(seen)
	t.Cleanup(ts.Close)
	transport := &registryv1.Transport{Kind: &registryv1.Transport_StreamableHttp{StreamableHttp: &registryv1.StreamableHTTPTransport{Url: ts.URL + "/mcp"}}}

	plant := func(connID, name, value string) string {
		t.Helper()
		dir := filepath.Join(root, connID)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(value+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	discover := func(conn *registryv1.Connection) error {
		_, err := s.Adapter.Discover(testkit.As(s, pat), &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()})
		return err
	}
	update := func(who person, conn *registryv1.Connection, ref, version string) (*registryv1.Connection, error) {
		return s.Registry.UpdateConnection(testkit.As(s, who), &registryv1.UpdateConnectionRequest{
			Id: conn.GetId(), ExpectedConfigRevision: conn.GetConfigRevision(), Transport: transport,
			CredentialScope: "read-only notes", CredentialRef: ref, CredentialVersion: version, Reason: "credential change"})
	}

	// Another team's connection, whose secret the attacker is after.
	neighbour, err := s.Registry.CreateConnection(testkit.As(s, ivan), &registryv1.CreateConnectionRequest{
		DisplayName: "another team's notes", Owner: "team-b", Transport: transport})
	if err != nil {
		t.Fatal(err)
	}
	neighbourSecret := plant(neighbour.GetId(), "token", "team-b-secret-0123456789")

	// pat's connection, approved by rita with its own secret, in its
	// directory under the root.
	conn, err := s.Registry.CreateConnection(testkit.As(s, pat), &registryv1.CreateConnectionRequest{
		DisplayName: "notes", Owner: "platform", Transport: transport})
	if err != nil {
		t.Fatal(err)
	}
	ownRef := "file:" + plant(conn.GetId(), "token", "own-secret-v1-0123456789")
	if conn, err = update(pat, conn, ownRef, "1"); err != nil {
		t.Fatal(err)
	}
	if conn, err = review(t, s, rita, conn, true); err != nil {
		t.Fatal(err)
	}
	if err := discover(conn); err != nil {
		t.Fatalf("discover with the approved credential: %v", err)
	}
	if got := seen.all(); !slices.Contains(got, "Bearer own-secret-v1-0123456789") {
		t.Fatalf("the server saw %q, not the approved credential: the observation proves nothing", got)
	}

	// (c) A new version of the same reference is a rotation: no review.
	plant(conn.GetId(), "token", "own-secret-v2-0123456789")
	if conn, err = update(pat, conn, ownRef, "2"); err != nil {
		t.Fatal(err)
	}
	if conn.GetReviewState() != registryv1.ReviewState_REVIEW_STATE_APPROVED || conn.GetConfigRevision() != 3 || conn.GetReviewedConfigRevision() != 2 {
		t.Fatalf("after a rotation: %v at revision %d (reviewed at %d), want APPROVED at 3 (reviewed at 2)",
			conn.GetReviewState(), conn.GetConfigRevision(), conn.GetReviewedConfigRevision())
	}
	if err := discover(conn); err != nil {
		t.Fatalf("discover after a rotation: %v", err)
	}
	if got := seen.all(); !slices.Contains(got, "Bearer own-secret-v2-0123456789") {
		t.Fatalf("after a rotation the server saw %q, not the new version", got)
	}

	// A file of the adapter's own: a key of its development PKI.
	var ownFile string
	_ = filepath.WalkDir(filepath.Join(dataDir, "pki"), func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && ownFile == "" {
			ownFile = path
		}
		return nil
	})
	if ownFile == "" {
		t.Fatal("no file under the adapter's pki directory")
	}

	for _, target := range []struct{ name, ref string }{
		{"a host file", "file:/etc/machine-id"},
		{"the adapter's own file", "file:" + ownFile},
		{"another connection's secret", "file:" + neighbourSecret},
		{"the adapter's ServiceAccount token", "file:/var/run/secrets/kubernetes.io/serviceaccount/token"},
	} {
		t.Run(target.name, func(t *testing.T) {
			before := len(seen.all())
			untouched := func() bool { return len(seen.all()) == before }

			// (b) The move alone sends the connection back to review,
			// proposed by the mover, who cannot approve it.
			moved, err := update(pat, conn, target.ref, "3")
			if err != nil {
				t.Fatal(err)
			}
			if moved.GetReviewState() != registryv1.ReviewState_REVIEW_STATE_PENDING || moved.GetProposedBy() != pat.ID ||
				moved.GetConfigRevision() != conn.GetConfigRevision()+1 {
				t.Fatalf("after moving the credential: %v proposed by %q at revision %d, want PENDING by %s at %d",
					moved.GetReviewState(), moved.GetProposedBy(), moved.GetConfigRevision(), pat.ID, conn.GetConfigRevision()+1)
			}
			refusedUnreviewed(t, s, pat, moved, untouched)
			if _, err := review(t, s, pat, moved, true); !apierror.Is(err, codes.PermissionDenied, "SELF_REVIEW") {
				t.Fatalf("self-review of the move: err = %v, want PERMISSION_DENIED SELF_REVIEW", err)
			}
			// The earlier approval (of another reference) is rita's.
			wantState(t, s, moved.GetId(), registryv1.ReviewState_REVIEW_STATE_PENDING, rita.ID)

			// (a) Even a reviewer's approval reads nothing outside the
			// connection's directory: refused before anything is opened.
			approved, err := review(t, s, rita, moved, true)
			if err != nil {
				t.Fatal(err)
			}
			conn = approved
			err = discover(approved)
			if !apierror.Is(err, codes.FailedPrecondition, "CREDENTIAL_REF_NOT_ALLOWED") {
				t.Fatalf("discover with %s: err = %v (reason %q), want FAILED_PRECONDITION CREDENTIAL_REF_NOT_ALLOWED", target.ref, err, apierror.Reason(err))
			}
			if !strings.Contains(err.Error(), filepath.Join(root, conn.GetId())) {
				t.Errorf("the refusal does not say where the credential must be: %v", err)
			}
			_, err = peers(t, s, identity.Operator).Adapter.Health(context.Background(), &adapterv1.HealthRequest{ConnectionId: conn.GetId()})
			if !apierror.Is(err, codes.FailedPrecondition, "CREDENTIAL_REF_NOT_ALLOWED") {
				t.Errorf("health with %s: err = %v, want FAILED_PRECONDITION CREDENTIAL_REF_NOT_ALLOWED", target.ref, err)
			}
			if !untouched() {
				t.Fatalf("the server was contacted with %s: %q", target.ref, seen.all()[before:])
			}
			snaps, err := s.Registry.ListSnapshots(testkit.As(s, rita), &registryv1.ListSnapshotsRequest{ConnectionId: conn.GetId()})
			if err != nil {
				t.Fatal(err)
			}
			for _, snap := range snaps.GetSnapshots() {
				if snap.GetConfigRevision() == approved.GetConfigRevision() {
					t.Errorf("snapshot %s recorded for the refused revision %d", snap.GetId(), approved.GetConfigRevision())
				}
			}
		})
	}

	// A relative name that climbs out of the directory is refused by the
	// registry at once: no revision, nothing to review.
	_, err = update(pat, conn, "file:../"+neighbour.GetId()+"/token", "4")
	if !apierror.Is(err, codes.InvalidArgument, "INVALID_CONNECTION") {
		t.Errorf("a climbing reference: err = %v (reason %q), want INVALID_ARGUMENT INVALID_CONNECTION", err, apierror.Reason(err))
	}
	if got := wantState(t, s, conn.GetId(), registryv1.ReviewState_REVIEW_STATE_APPROVED, rita.ID); got.GetConfigRevision() != conn.GetConfigRevision() {
		t.Errorf("a refused update made revision %d", got.GetConfigRevision())
	}
	for _, h := range seen.all() {
		if strings.Contains(h, "team-b-secret") {
			t.Fatalf("the other team's secret reached the server: %q", h)
		}
	}
}
