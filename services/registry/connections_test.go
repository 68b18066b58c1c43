package registry_test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/apierror"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

func httpTransport(url string) *registryv1.Transport {
	return &registryv1.Transport{Kind: &registryv1.Transport_StreamableHttp{StreamableHttp: &registryv1.StreamableHTTPTransport{Url: url}}}
}

func stdioTransport(cmd string) *registryv1.Transport {
	return &registryv1.Transport{Kind: &registryv1.Transport_Stdio{Stdio: &registryv1.StdioTransport{Command: cmd, Args: []string{"--library", "synthetic"}}}}
}

func TestCreateConnection(t *testing.T) {
	t.Parallel()
	r := start(t)
	tests := []struct {
		name       string
		req        *registryv1.CreateConnectionRequest
		wantFields []string // empty: success
	}{
		{name: "streamable http", req: &registryv1.CreateConnectionRequest{DisplayName: "Sources", Owner: "platform", Transport: httpTransport("https://sources.example/mcp")}},
		{name: "stdio", req: &registryv1.CreateConnectionRequest{DisplayName: "Sources", Owner: "platform", Transport: stdioTransport("v0m3-fixture-sources-not-installed")}},
		{name: "direct", req: &registryv1.CreateConnectionRequest{DisplayName: "Fixture", Owner: "platform",
			Transport: &registryv1.Transport{Kind: &registryv1.Transport_Direct{Direct: &registryv1.DirectTransport{Adapter: "fixture-sources"}}}}},
		{name: "nothing", req: &registryv1.CreateConnectionRequest{}, wantFields: []string{"display_name", "owner", "transport"}},
		{name: "stdio without command", req: &registryv1.CreateConnectionRequest{DisplayName: "S", Owner: "o", Transport: stdioTransport("")},
			wantFields: []string{"transport.stdio.command"}},
		{name: "http with other scheme", req: &registryv1.CreateConnectionRequest{DisplayName: "S", Owner: "o", Transport: httpTransport("ftp://sources/mcp")},
			wantFields: []string{"transport.streamable_http.url"}},
		{name: "http without url", req: &registryv1.CreateConnectionRequest{DisplayName: "S", Owner: "o", Transport: httpTransport("")},
			wantFields: []string{"transport.streamable_http.url"}},
		{name: "http with user info", req: &registryv1.CreateConnectionRequest{DisplayName: "S", Owner: "o", Transport: httpTransport("https://u:p@sources/mcp")},
			wantFields: []string{"transport.streamable_http.url"}},
		{name: "credential value instead of reference", req: &registryv1.CreateConnectionRequest{DisplayName: "S", Owner: "o",
			Transport: httpTransport("https://sources/mcp"), CredentialRef: "ghp_notareference"}, wantFields: []string{"credential_ref"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := r.client.CreateConnection(t.Context(), tt.req)
			if len(tt.wantFields) > 0 {
				wantErr(t, err, codes.InvalidArgument, "INVALID_CONNECTION")
				if got := apierror.Fields(err); !slices.Equal(got, tt.wantFields) {
					t.Errorf("violations = %v, want %v", got, tt.wantFields)
				}
				return
			}
			if err != nil {
				t.Fatalf("CreateConnection: %v", err)
			}
			if !strings.HasPrefix(c.GetId(), "conn_") || c.GetConfigRevision() != 1 ||
				c.GetReviewState() != registryv1.ReviewState_REVIEW_STATE_PENDING ||
				c.GetState() != registryv1.ConnectionState_CONNECTION_STATE_ACTIVE ||
				!strings.HasPrefix(c.GetConfigDigest(), "sha256:") {
				t.Errorf("created connection = %v", c)
			}
			got, err := r.client.GetConnection(t.Context(), &registryv1.GetConnectionRequest{Id: c.GetId()})
			if err != nil || !proto.Equal(got, c) {
				t.Errorf("GetConnection = %v, %v; want %v", got, err, c)
			}
			revs, err := r.client.ListConfigRevisions(t.Context(), &registryv1.ListConfigRevisionsRequest{ConnectionId: c.GetId()})
			if err != nil || len(revs.GetRevisions()) != 1 || revs.GetRevisions()[0].GetConfigDigest() != c.GetConfigDigest() {
				t.Errorf("ListConfigRevisions = %v, %v", revs, err)
			}
		})
	}
}

func TestListConnectionsOldestFirst(t *testing.T) {
	t.Parallel()
	r := start(t)
	var want []string
	for range 3 {
		want = append(want, createHTTP(t, r.client).GetId())
	}
	list, err := r.client.ListConnections(t.Context(), &registryv1.ListConnectionsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range list.GetConnections() {
		got = append(got, c.GetId())
	}
	if !slices.Equal(got, want) {
		t.Errorf("ListConnections = %v, want %v", got, want)
	}
	_, err = r.client.GetConnection(t.Context(), &registryv1.GetConnectionRequest{Id: "conn_missing"})
	wantErr(t, err, codes.NotFound, "CONNECTION_UNKNOWN")
}

func TestStdioExecutableDigest(t *testing.T) {
	t.Parallel()
	r := start(t)
	bin := filepath.Join(t.TempDir(), "fixture-server")
	content := []byte("#!/bin/sh\necho fixture\n")
	if err := os.WriteFile(bin, content, 0o755); err != nil {
		t.Fatal(err)
	}
	c, err := r.client.CreateConnection(t.Context(), &registryv1.CreateConnectionRequest{
		DisplayName: "Local sources", Owner: "platform", Transport: stdioTransport(bin)})
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(content)
	if got, want := c.GetTransport().GetStdio().GetExecutableDigest(), "sha256:"+hex.EncodeToString(sum[:]); got != want {
		t.Errorf("executable_digest = %q, want %q", got, want)
	}

	// Replacing the executable changes the configuration: a new revision.
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho changed\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	u, err := r.client.UpdateConnection(t.Context(), &registryv1.UpdateConnectionRequest{
		Id: c.GetId(), ExpectedConfigRevision: 1, Transport: stdioTransport(bin), Reason: "server upgrade"})
	if err != nil {
		t.Fatal(err)
	}
	if u.GetConfigRevision() != 2 || u.GetConfigDigest() == c.GetConfigDigest() {
		t.Errorf("after executable change: revision %d digest %s (was %s)", u.GetConfigRevision(), u.GetConfigDigest(), c.GetConfigDigest())
	}
}

func TestUpdateConnection(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		update       func(c *registryv1.Connection) *registryv1.UpdateConnectionRequest
		wantRevision int64
		// keepsMappings: the new revision is a rotation within the declared
		// credential scope, so the active mapping stays active.
		keepsMappings bool
		// pending: what runs, is reached or where the credential is read
		// changed, so the connection itself is pending review again.
		pending    bool
		wantCode   codes.Code
		wantReason string
	}{
		{
			name: "display name, owner and sandbox only",
			update: func(c *registryv1.Connection) *registryv1.UpdateConnectionRequest {
				return &registryv1.UpdateConnectionRequest{Id: c.GetId(), ExpectedConfigRevision: 1, DisplayName: "Renamed", Owner: "sre",
					Sandbox: &registryv1.SandboxConstraints{WorkingDir: "/srv", MinimalEnvironment: true}}
			},
			wantRevision: 1,
		},
		{
			name: "same configuration resubmitted",
			update: func(c *registryv1.Connection) *registryv1.UpdateConnectionRequest {
				return &registryv1.UpdateConnectionRequest{Id: c.GetId(), ExpectedConfigRevision: 1, Transport: c.GetTransport(),
					CredentialScope: c.GetCredentialScope(), CredentialRef: c.GetCredentialRef(), CredentialVersion: c.GetCredentialVersion()}
			},
			wantRevision: 1,
		},
		{
			name: "credential rotation",
			update: func(c *registryv1.Connection) *registryv1.UpdateConnectionRequest {
				return &registryv1.UpdateConnectionRequest{Id: c.GetId(), ExpectedConfigRevision: 1, Transport: c.GetTransport(),
					CredentialScope: c.GetCredentialScope(), CredentialRef: c.GetCredentialRef(), CredentialVersion: "2", Reason: "credential rotation"}
			},
			wantRevision: 2, keepsMappings: true,
		},
		{
			// A new reference hands the server another secret: reviewed
			// like a new endpoint, whatever the change calls itself.
			name: "credential moved to another reference, same scope",
			update: func(c *registryv1.Connection) *registryv1.UpdateConnectionRequest {
				return &registryv1.UpdateConnectionRequest{Id: c.GetId(), ExpectedConfigRevision: 1, Transport: c.GetTransport(),
					CredentialScope: c.GetCredentialScope(), CredentialRef: c.GetCredentialRef() + "-2", CredentialVersion: "1", Reason: "credential rotation"}
			},
			wantRevision: 2, pending: true,
		},
		{
			name: "credential reference removed",
			update: func(c *registryv1.Connection) *registryv1.UpdateConnectionRequest {
				return &registryv1.UpdateConnectionRequest{Id: c.GetId(), ExpectedConfigRevision: 1, Transport: c.GetTransport(),
					CredentialScope: c.GetCredentialScope(), CredentialVersion: "2"}
			},
			// Nothing is read any more: no new secret to review.
			wantRevision: 2, keepsMappings: true,
		},
		{
			name: "credential reference leaving its directory",
			update: func(c *registryv1.Connection) *registryv1.UpdateConnectionRequest {
				return &registryv1.UpdateConnectionRequest{Id: c.GetId(), ExpectedConfigRevision: 1, Transport: c.GetTransport(),
					CredentialScope: c.GetCredentialScope(), CredentialRef: "file:../con_other/token", CredentialVersion: "1"}
			},
			wantCode: codes.InvalidArgument, wantReason: "INVALID_CONNECTION",
		},
		{
			name: "credential scope broadened",
			update: func(c *registryv1.Connection) *registryv1.UpdateConnectionRequest {
				return &registryv1.UpdateConnectionRequest{Id: c.GetId(), ExpectedConfigRevision: 1, Transport: c.GetTransport(),
					CredentialScope: "read-write access to the synthetic library", CredentialRef: c.GetCredentialRef(), CredentialVersion: "2", Reason: "credential rotation"}
			},
			wantRevision: 2,
		},
		{
			name: "credential scope dropped",
			update: func(c *registryv1.Connection) *registryv1.UpdateConnectionRequest {
				return &registryv1.UpdateConnectionRequest{Id: c.GetId(), ExpectedConfigRevision: 1, Transport: c.GetTransport(),
					CredentialRef: c.GetCredentialRef(), CredentialVersion: "2"}
			},
			wantRevision: 2,
		},
		{
			name: "image change with the same credential scope",
			update: func(c *registryv1.Connection) *registryv1.UpdateConnectionRequest {
				return &registryv1.UpdateConnectionRequest{Id: c.GetId(), ExpectedConfigRevision: 1, Transport: c.GetTransport(), ImageDigest: "sha256:" + strings.Repeat("b", 64),
					CredentialScope: c.GetCredentialScope(), CredentialRef: c.GetCredentialRef(), CredentialVersion: "2"}
			},
			wantRevision: 2, pending: true,
		},
		{
			name: "endpoint change",
			update: func(c *registryv1.Connection) *registryv1.UpdateConnectionRequest {
				return &registryv1.UpdateConnectionRequest{Id: c.GetId(), ExpectedConfigRevision: 1, Transport: httpTransport("http://sources-v2.mcp.svc:8080/mcp"),
					CredentialScope: c.GetCredentialScope(), CredentialRef: c.GetCredentialRef(), CredentialVersion: c.GetCredentialVersion()}
			},
			wantRevision: 2, pending: true,
		},
		{
			name: "stale expected revision",
			update: func(c *registryv1.Connection) *registryv1.UpdateConnectionRequest {
				return &registryv1.UpdateConnectionRequest{Id: c.GetId(), ExpectedConfigRevision: 7, DisplayName: "x"}
			},
			wantCode: codes.Aborted, wantReason: "CONFIG_REVISION_CONFLICT",
		},
		{
			name: "missing expected revision",
			update: func(c *registryv1.Connection) *registryv1.UpdateConnectionRequest {
				return &registryv1.UpdateConnectionRequest{Id: c.GetId(), DisplayName: "x"}
			},
			wantCode: codes.InvalidArgument, wantReason: "INVALID_CONNECTION",
		},
		{
			name: "unknown connection",
			update: func(*registryv1.Connection) *registryv1.UpdateConnectionRequest {
				return &registryv1.UpdateConnectionRequest{Id: "conn_missing", ExpectedConfigRevision: 1, DisplayName: "x"}
			},
			wantCode: codes.NotFound, wantReason: "CONNECTION_UNKNOWN",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := start(t)
			conn, _, m := activeSetup(t, r.client)
			req := tt.update(conn)
			got, err := r.client.UpdateConnection(t.Context(), req)
			if tt.wantReason != "" {
				wantErr(t, err, tt.wantCode, tt.wantReason)
				return
			}
			if err != nil {
				t.Fatalf("UpdateConnection: %v", err)
			}
			if got.GetConfigRevision() != tt.wantRevision {
				t.Errorf("config_revision = %d, want %d", got.GetConfigRevision(), tt.wantRevision)
			}
			// Without keep_serving a new revision serves at once.
			if got.GetServingConfigRevision() != got.GetConfigRevision() {
				t.Errorf("serving_config_revision = %d, want %d", got.GetServingConfigRevision(), got.GetConfigRevision())
			}
			if req.GetDisplayName() != "" && got.GetDisplayName() != req.GetDisplayName() {
				t.Errorf("display_name = %q, want %q", got.GetDisplayName(), req.GetDisplayName())
			}
			revs, err := r.client.ListConfigRevisions(t.Context(), &registryv1.ListConfigRevisionsRequest{ConnectionId: conn.GetId()})
			if err != nil {
				t.Fatal(err)
			}
			if n := int64(len(revs.GetRevisions())); n != tt.wantRevision {
				t.Errorf("%d config revisions, want %d", n, tt.wantRevision)
			}
			last := revs.GetRevisions()[len(revs.GetRevisions())-1]
			if last.GetConfigDigest() != got.GetConfigDigest() || last.GetRevision() != got.GetConfigRevision() {
				t.Errorf("latest revision record %v does not match connection %v", last, got)
			}
			if tt.wantRevision > 1 && last.GetReviewRequired() != tt.pending {
				t.Errorf("revision %d review_required = %v, want %v", last.GetRevision(), last.GetReviewRequired(), tt.pending)
			}

			// A rotation within the declared scope keeps the mapping in
			// use; any other new configuration sends it back to review.
			_, err = r.client.ResolveMapping(t.Context(), &registryv1.ResolveMappingRequest{Capability: m.GetCapability(), MappingId: m.GetId()})
			if tt.wantRevision == 1 || tt.keepsMappings {
				if err != nil {
					t.Errorf("mapping stopped resolving: %v", err)
				}
				if tt.keepsMappings {
					wantRevisedEvent(t, r.client, conn.GetId(), "stay active")
				}
				return
			}
			wantRevisedEvent(t, r.client, conn.GetId(), "replaced revision 1")
			wantErr(t, err, codes.FailedPrecondition, "MAPPING_REVIEW_REQUIRED")
			if !strings.Contains(err.Error(), "config revision 2") {
				t.Errorf("error %q does not say what changed", err)
			}
			// The CAS holds: the old revision can no longer be used.
			_, err = r.client.UpdateConnection(t.Context(), &registryv1.UpdateConnectionRequest{Id: conn.GetId(), ExpectedConfigRevision: 1, DisplayName: "again"})
			wantErr(t, err, codes.Aborted, "CONFIG_REVISION_CONFLICT")
		})
	}
}

func TestRetireConnectionKeepsEverythingReadable(t *testing.T) {
	t.Parallel()
	r := start(t)
	ctx := t.Context()
	conn, snap, m := activeSetup(t, r.client)

	retired, err := r.client.RetireConnection(ctx, &registryv1.RetireConnectionRequest{Id: conn.GetId(), Reason: "server removed"})
	if err != nil {
		t.Fatal(err)
	}
	if retired.GetState() != registryv1.ConnectionState_CONNECTION_STATE_RETIRED || retired.GetRetireTime() == nil {
		t.Errorf("retired connection = %v", retired)
	}
	if again, err := r.client.RetireConnection(ctx, &registryv1.RetireConnectionRequest{Id: conn.GetId()}); err != nil || !proto.Equal(again, retired) {
		t.Errorf("retiring twice = %v, %v; want it unchanged", again, err)
	}

	// Everything stays readable.
	if got, err := r.client.GetConnection(ctx, &registryv1.GetConnectionRequest{Id: conn.GetId()}); err != nil || got.GetState() != registryv1.ConnectionState_CONNECTION_STATE_RETIRED {
		t.Errorf("GetConnection after retire = %v, %v", got, err)
	}
	if got, err := r.client.GetSnapshot(ctx, &registryv1.GetSnapshotRequest{Id: snap.GetId()}); err != nil || !proto.Equal(got, snap) {
		t.Errorf("GetSnapshot after retire = %v, %v", got, err)
	}
	if got, err := r.client.ListSnapshots(ctx, &registryv1.ListSnapshotsRequest{ConnectionId: conn.GetId()}); err != nil || len(got.GetSnapshots()) != 1 {
		t.Errorf("ListSnapshots after retire = %v, %v", got, err)
	}
	if got, err := r.client.ListConfigRevisions(ctx, &registryv1.ListConfigRevisionsRequest{ConnectionId: conn.GetId()}); err != nil || len(got.GetRevisions()) != 1 {
		t.Errorf("ListConfigRevisions after retire = %v, %v", got, err)
	}
	gm, err := r.client.GetMapping(ctx, &registryv1.GetMappingRequest{Id: m.GetId()})
	if err != nil || gm.GetState() != registryv1.MappingState_MAPPING_STATE_RETIRED || !strings.Contains(gm.GetStateReason(), "server removed") {
		t.Errorf("mapping after retire = %v, %v", gm, err)
	}

	// And nothing can use or change it.
	_, err = r.client.ResolveMapping(ctx, &registryv1.ResolveMappingRequest{Capability: m.GetCapability(), MappingId: m.GetId()})
	wantErr(t, err, codes.FailedPrecondition, "MAPPING_RETIRED")
	_, err = r.client.UpdateConnection(ctx, &registryv1.UpdateConnectionRequest{Id: conn.GetId(), ExpectedConfigRevision: 1, DisplayName: "x"})
	wantErr(t, err, codes.FailedPrecondition, "CONNECTION_RETIRED")
	_, err = r.client.RecordSnapshot(ctx, &registryv1.RecordSnapshotRequest{Snapshot: &registryv1.DiscoverySnapshot{ConnectionId: conn.GetId(), ConfigRevision: 1}})
	wantErr(t, err, codes.FailedPrecondition, "CONNECTION_RETIRED")
	_, err = r.client.ProposeMapping(ctx, proposal(snap))
	wantErr(t, err, codes.FailedPrecondition, "CONNECTION_RETIRED")

	list, err := r.client.ListConnections(ctx, &registryv1.ListConnectionsRequest{})
	if err != nil || len(list.GetConnections()) != 0 {
		t.Errorf("ListConnections without retired = %v, %v", list, err)
	}
	list, err = r.client.ListConnections(ctx, &registryv1.ListConnectionsRequest{IncludeRetired: true})
	if err != nil || len(list.GetConnections()) != 1 {
		t.Errorf("ListConnections with retired = %v, %v", list, err)
	}
}

func TestUpdateConnectionCompareAndSetUnderContention(t *testing.T) {
	t.Parallel()
	r := start(t)
	conn := createHTTP(t, r.client)
	const writers = 8
	errs := make(chan error, writers)
	for i := range writers {
		go func() {
			_, err := r.client.UpdateConnection(t.Context(), &registryv1.UpdateConnectionRequest{
				Id: conn.GetId(), ExpectedConfigRevision: 1, Transport: conn.GetTransport(),
				CredentialRef: conn.GetCredentialRef(), CredentialVersion: fmt.Sprintf("rotated-%d", i)})
			errs <- err
		}()
	}
	var ok, conflicts int
	for range writers {
		switch err := <-errs; {
		case err == nil:
			ok++
		case apierror.Is(err, codes.Aborted, "CONFIG_REVISION_CONFLICT"):
			conflicts++
		default:
			t.Errorf("unexpected error: %v", err)
		}
	}
	if ok != 1 || conflicts != writers-1 {
		t.Errorf("%d updates succeeded and %d conflicted; want exactly one winner", ok, conflicts)
	}
	revs, err := r.client.ListConfigRevisions(t.Context(), &registryv1.ListConfigRevisionsRequest{ConnectionId: conn.GetId()})
	if err != nil || len(revs.GetRevisions()) != 2 {
		t.Errorf("config revisions = %v, %v; want 2", revs, err)
	}
}
