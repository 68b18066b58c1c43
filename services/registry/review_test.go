package registry_test

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/identity/identitytest"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// reviewConn reviews conn at its current config revision as a reviewer.
func reviewConn(t *testing.T, c registryv1.RegistryServiceClient, conn *registryv1.Connection, approve bool) *registryv1.Connection {
	t.Helper()
	out, err := c.ReviewConnection(identitytest.As(t.Context(), "reviewer", "reviewers"), &registryv1.ReviewConnectionRequest{
		ConnectionId: conn.GetId(), ConfigRevision: conn.GetConfigRevision(), Approve: approve, Note: "checked the endpoint"})
	if err != nil {
		t.Fatalf("ReviewConnection: %v", err)
	}
	return out
}

func stdioConn(t *testing.T, c registryv1.RegistryServiceClient) *registryv1.Connection {
	t.Helper()
	conn, err := c.CreateConnection(t.Context(), &registryv1.CreateConnectionRequest{
		DisplayName: "local notes", Owner: "platform",
		Transport: &registryv1.Transport{Kind: &registryv1.Transport_Stdio{Stdio: &registryv1.StdioTransport{
			Command: "/usr/local/bin/notes-mcp", Args: []string{"--read-only"}, Env: map[string]string{"NOTES_DIR": "/srv/notes"}}}},
		ImageDigest:       "sha256:" + "1111111111111111111111111111111111111111111111111111111111111111",
		WorkloadDigest:    "sha256:" + "2222222222222222222222222222222222222222222222222222222222222222",
		CredentialScope:   "read-only notes",
		CredentialRef:     "file:/var/run/secrets/v0m3/notes/token",
		CredentialVersion: "1",
	})
	if err != nil {
		t.Fatalf("CreateConnection: %v", err)
	}
	return conn
}

func TestReviewConnection(t *testing.T) {
	t.Parallel()
	r := start(t)
	conn := createHTTP(t, r.client)
	if conn.GetReviewState() != registryv1.ReviewState_REVIEW_STATE_PENDING ||
		conn.GetCreatedBy() != "integrator" || conn.GetProposedBy() != "integrator" || conn.GetReviewedBy() != "" {
		t.Fatalf("new connection: review_state %v created_by %q proposed_by %q reviewed_by %q; want PENDING, the authenticated creator, no reviewer",
			conn.GetReviewState(), conn.GetCreatedBy(), conn.GetProposedBy(), conn.GetReviewedBy())
	}
	reviewer := identitytest.As(t.Context(), "reviewer", "reviewers")

	// A review of another revision than the current one changes nothing.
	_, err := r.client.ReviewConnection(reviewer, &registryv1.ReviewConnectionRequest{ConnectionId: conn.GetId(), ConfigRevision: 2, Approve: true})
	wantErr(t, err, codes.Aborted, "CONFIG_REVISION_CONFLICT")
	if got := getConn(t, r.client, conn.GetId()); got.GetReviewState() != registryv1.ReviewState_REVIEW_STATE_PENDING || got.GetReviewedBy() != "" {
		t.Errorf("after a refused review: %v by %q, want still pending and unreviewed", got.GetReviewState(), got.GetReviewedBy())
	}

	got := reviewConn(t, r.client, conn, true)
	if got.GetReviewState() != registryv1.ReviewState_REVIEW_STATE_APPROVED || got.GetReviewedBy() != "reviewer" ||
		got.GetReviewNote() != "checked the endpoint" || got.GetReviewTime() == nil || got.GetReviewedConfigRevision() != 1 {
		t.Errorf("approved connection = state %v by %q note %q time %v revision %d", got.GetReviewState(), got.GetReviewedBy(),
			got.GetReviewNote(), got.GetReviewTime(), got.GetReviewedConfigRevision())
	}
	if stored := getConn(t, r.client, conn.GetId()); !proto.Equal(stored, got) {
		t.Errorf("stored connection %v differs from the review's answer %v", stored, got)
	}

	// A decision stands: reviewing again is refused until the configuration
	// changes.
	_, err = r.client.ReviewConnection(reviewer, &registryv1.ReviewConnectionRequest{ConnectionId: conn.GetId(), ConfigRevision: 1, Approve: false})
	wantErr(t, err, codes.FailedPrecondition, "CONNECTION_NOT_PENDING_REVIEW")

	// The review is an event watchers see.
	ctx, cancel := watchContext(t)
	defer cancel()
	stream, err := r.client.WatchEvents(ctx, &registryv1.WatchEventsRequest{AfterSequence: r.base})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []registryv1.RegistryEventType{
		registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_CONNECTION_CREATED,
		registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_CONNECTION_REVIEWED,
	} {
		ev, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if ev.GetType() != want || ev.GetConnectionId() != conn.GetId() {
			t.Errorf("event %v, want %v of %s", ev, want, conn.GetId())
		}
	}
}

func TestReviewConnectionRefuses(t *testing.T) {
	t.Parallel()
	r := start(t)
	retired := createHTTP(t, r.client)
	if _, err := r.client.RetireConnection(t.Context(), &registryv1.RetireConnectionRequest{Id: retired.GetId()}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		req        *registryv1.ReviewConnectionRequest
		wantCode   codes.Code
		wantReason string
	}{
		{"no connection id", &registryv1.ReviewConnectionRequest{ConfigRevision: 1, Approve: true}, codes.InvalidArgument, "INVALID_REVIEW"},
		{"no config revision", &registryv1.ReviewConnectionRequest{ConnectionId: retired.GetId(), Approve: true}, codes.InvalidArgument, "INVALID_REVIEW"},
		{"unknown connection", &registryv1.ReviewConnectionRequest{ConnectionId: "conn_missing", ConfigRevision: 1, Approve: true}, codes.NotFound, "CONNECTION_UNKNOWN"},
		{"retired connection", &registryv1.ReviewConnectionRequest{ConnectionId: retired.GetId(), ConfigRevision: 1, Approve: true}, codes.FailedPrecondition, "CONNECTION_RETIRED"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := r.client.ReviewConnection(identitytest.As(t.Context(), "reviewer", "reviewers"), tt.req)
			wantErr(t, err, tt.wantCode, tt.wantReason)
		})
	}
	if got := getConn(t, r.client, retired.GetId()); got.GetReviewState() != registryv1.ReviewState_REVIEW_STATE_PENDING {
		t.Errorf("retired connection review state = %v, want unchanged PENDING", got.GetReviewState())
	}
}

// TestConfigRevisionReview: a revision that changes what runs, what is
// reached or where the credential is read needs a new review, proposed by
// whoever changed it; a new credential version or scope keeps the
// decision.
func TestConfigRevisionReview(t *testing.T) {
	t.Parallel()
	stdio := func(c *registryv1.Connection) *registryv1.StdioTransport {
		return proto.CloneOf(c.GetTransport().GetStdio())
	}
	tests := []struct {
		name       string
		change     func(c *registryv1.Connection, u *registryv1.UpdateConnectionRequest)
		wantReview bool
	}{
		{"credential version", func(_ *registryv1.Connection, u *registryv1.UpdateConnectionRequest) { u.CredentialVersion = "2" }, false},
		// A new reference hands the server another secret: a second
		// person approves it before the adapter reads it.
		{"credential reference", func(_ *registryv1.Connection, u *registryv1.UpdateConnectionRequest) {
			u.CredentialRef = "file:/var/run/secrets/v0m3/notes/token-2"
		}, true},
		{"credential reference dropped", func(_ *registryv1.Connection, u *registryv1.UpdateConnectionRequest) { u.CredentialRef = "" }, false},
		{"credential scope", func(_ *registryv1.Connection, u *registryv1.UpdateConnectionRequest) {
			u.CredentialScope = "read-only notes, 2026"
		}, false},
		{"command", func(c *registryv1.Connection, u *registryv1.UpdateConnectionRequest) {
			st := stdio(c)
			st.Command = "/bin/sh"
			u.Transport = &registryv1.Transport{Kind: &registryv1.Transport_Stdio{Stdio: st}}
		}, true},
		{"arguments", func(c *registryv1.Connection, u *registryv1.UpdateConnectionRequest) {
			st := stdio(c)
			st.Args = []string{"--read-write"}
			u.Transport = &registryv1.Transport{Kind: &registryv1.Transport_Stdio{Stdio: st}}
		}, true},
		{"environment", func(c *registryv1.Connection, u *registryv1.UpdateConnectionRequest) {
			st := stdio(c)
			st.Env["NOTES_DIR"] = "/"
			u.Transport = &registryv1.Transport{Kind: &registryv1.Transport_Stdio{Stdio: st}}
		}, true},
		{"endpoint", func(_ *registryv1.Connection, u *registryv1.UpdateConnectionRequest) {
			u.Transport = httpTransport("http://notes.mcp.svc:8080/mcp")
		}, true},
		{"image digest", func(_ *registryv1.Connection, u *registryv1.UpdateConnectionRequest) {
			u.ImageDigest = "sha256:" + "3333333333333333333333333333333333333333333333333333333333333333"
		}, true},
		{"workload digest", func(_ *registryv1.Connection, u *registryv1.UpdateConnectionRequest) {
			u.WorkloadDigest = "sha256:" + "4444444444444444444444444444444444444444444444444444444444444444"
		}, true},
	}
	for _, tt := range tests {
		for _, decision := range []bool{true, false} {
			name := tt.name + "/after approval"
			if !decision {
				name = tt.name + "/after rejection"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				r := start(t)
				reviewed := reviewConn(t, r.client, stdioConn(t, r.client), decision)
				u := &registryv1.UpdateConnectionRequest{
					Id: reviewed.GetId(), ExpectedConfigRevision: 1, Transport: reviewed.GetTransport(),
					ImageDigest: reviewed.GetImageDigest(), WorkloadDigest: reviewed.GetWorkloadDigest(),
					CredentialScope: reviewed.GetCredentialScope(), CredentialRef: reviewed.GetCredentialRef(),
					CredentialVersion: reviewed.GetCredentialVersion(), Reason: tt.name,
				}
				tt.change(reviewed, u)
				got, err := r.client.UpdateConnection(identitytest.As(t.Context(), "sre", "platform"), u)
				if err != nil {
					t.Fatalf("UpdateConnection: %v", err)
				}
				if got.GetConfigRevision() != 2 {
					t.Fatalf("config_revision = %d, want 2", got.GetConfigRevision())
				}
				revs, err := r.client.ListConfigRevisions(t.Context(), &registryv1.ListConfigRevisionsRequest{ConnectionId: got.GetId()})
				if err != nil {
					t.Fatal(err)
				}
				first, last := revs.GetRevisions()[0], revs.GetRevisions()[1]
				if first.GetCreatedBy() != "integrator" || !first.GetReviewRequired() || last.GetCreatedBy() != "sre" || last.GetReviewRequired() != tt.wantReview {
					t.Errorf("revisions by %q (review required %v) and %q (%v); want integrator (true) and sre (%v)",
						first.GetCreatedBy(), first.GetReviewRequired(), last.GetCreatedBy(), last.GetReviewRequired(), tt.wantReview)
				}
				if !tt.wantReview {
					if got.GetReviewState() != reviewed.GetReviewState() || got.GetProposedBy() != "integrator" || got.GetReviewedConfigRevision() != 1 {
						t.Errorf("after a credential-only change: %v proposed by %q, reviewed at %d; want the decision kept (%v, integrator, 1)",
							got.GetReviewState(), got.GetProposedBy(), got.GetReviewedConfigRevision(), reviewed.GetReviewState())
					}
					return
				}
				if got.GetReviewState() != registryv1.ReviewState_REVIEW_STATE_PENDING || got.GetProposedBy() != "sre" || got.GetCreatedBy() != "integrator" {
					t.Fatalf("after changing the %s: %v proposed by %q created by %q; want PENDING proposed by sre, created by integrator",
						tt.name, got.GetReviewState(), got.GetProposedBy(), got.GetCreatedBy())
				}
				// The earlier decision cannot be reused for the new revision; a
				// review of the new one decides it.
				_, err = r.client.ReviewConnection(identitytest.As(t.Context(), "reviewer", "reviewers"),
					&registryv1.ReviewConnectionRequest{ConnectionId: got.GetId(), ConfigRevision: 1, Approve: true})
				wantErr(t, err, codes.Aborted, "CONFIG_REVISION_CONFLICT")
				if again := reviewConn(t, r.client, got, true); again.GetReviewState() != registryv1.ReviewState_REVIEW_STATE_APPROVED || again.GetReviewedConfigRevision() != 2 {
					t.Errorf("re-review: %v at revision %d, want APPROVED at 2", again.GetReviewState(), again.GetReviewedConfigRevision())
				}
			})
		}
	}
}

func getConn(t *testing.T, c registryv1.RegistryServiceClient, id string) *registryv1.Connection {
	t.Helper()
	got, err := c.GetConnection(t.Context(), &registryv1.GetConnectionRequest{Id: id})
	if err != nil {
		t.Fatal(err)
	}
	return got
}
