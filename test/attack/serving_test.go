package attack_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/demo/fixture"
	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// TestOnlyTheOperatorMovesTheServingRevision: while a rotation's workload
// rolls out, nobody but the operator can declare the new revision serving
// (a person, even the connection's integrator or a reviewer, or another
// V0M3 service), nor report its rollout failed; and a call granted at the
// revision not yet serving reaches nothing. Every refusal leaves the
// connection as it was.
func TestOnlyTheOperatorMovesTheServingRevision(t *testing.T) {
	t.Parallel()
	s := start(t)
	srv, err := fixture.NewServer(fixture.Options{})
	if err != nil {
		t.Fatal(err)
	}
	count := &counting{h: mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)}
	ts := httptest.NewServer(count)
	t.Cleanup(ts.Close)
	transport := &registryv1.Transport{Kind: &registryv1.Transport_StreamableHttp{StreamableHttp: &registryv1.StreamableHTTPTransport{Url: ts.URL + "/mcp"}}}
	conn, err := s.Registry.CreateConnection(testkit.As(s, ivan), &registryv1.CreateConnectionRequest{
		DisplayName: "notes over http", Owner: "platform", Transport: transport, CredentialScope: "read-only", CredentialVersion: "secret@1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := review(t, s, rita, conn, true); err != nil {
		t.Fatal(err)
	}
	rolling, err := s.Registry.UpdateConnection(testkit.As(s, ivan), &registryv1.UpdateConnectionRequest{
		Id: conn.GetId(), ExpectedConfigRevision: 1, Transport: transport, CredentialScope: "read-only", CredentialVersion: "secret@2", KeepServing: true})
	if err != nil || rolling.GetServingConfigRevision() != 1 || rolling.GetConfigRevision() != 2 {
		t.Fatalf("rotation keeping the serving revision: %v (serving %d of %d)", err, rolling.GetServingConfigRevision(), rolling.GetConfigRevision())
	}

	ready := &registryv1.ReportRolloutRequest{Id: conn.GetId(), ConfigRevision: 2, Ready: true}
	failed := &registryv1.ReportRolloutRequest{Id: conn.GetId(), ConfigRevision: 2, Detail: "forged failure"}
	for _, c := range []struct {
		name   string
		report func(*registryv1.ReportRolloutRequest) error
	}{
		{"the integrator", func(r *registryv1.ReportRolloutRequest) error {
			_, err := s.Registry.ReportRollout(testkit.As(s, ivan), r)
			return err
		}},
		{"a reviewer", func(r *registryv1.ReportRolloutRequest) error {
			_, err := s.Registry.ReportRollout(testkit.As(s, rita), r)
			return err
		}},
		{"the orchestrator", func(r *registryv1.ReportRolloutRequest) error {
			_, err := peers(t, s, identity.Orchestrator).Registry.ReportRollout(context.Background(), r)
			return err
		}},
		{"the adapter", func(r *registryv1.ReportRolloutRequest) error {
			_, err := peers(t, s, identity.Adapter).Registry.ReportRollout(context.Background(), r)
			return err
		}},
	} {
		for _, r := range []*registryv1.ReportRolloutRequest{ready, failed} {
			if err := c.report(r); apierror.Code(err) != codes.PermissionDenied && apierror.Code(err) != codes.Unauthenticated {
				t.Errorf("ReportRollout (ready %v) by %s: %v; want refused by the access table", r.GetReady(), c.name, err)
			}
		}
	}
	after, err := s.Registry.GetConnection(testkit.As(s, rita), &registryv1.GetConnectionRequest{Id: conn.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(after, rolling) {
		t.Errorf("refused reports changed the connection:\n%v\nwas\n%v", after, rolling)
	}

	// A grant at the revision not yet serving: refused before anything is
	// sent.
	before := count.n.Load()
	_, err = peers(t, s, identity.Orchestrator).Adapter.Execute(context.Background(), sign(t, creds(t, s, identity.Orchestrator), &adapterv1.ExecuteRequest{
		ConnectionId: conn.GetId(), ConfigRevision: 2, MappingId: "map_forged", MappingRevision: 1,
		AttemptId: "att_forged", Target: &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: "search"},
		Limits: &registryv1.Limits{MaxResponseBytes: 1 << 16, MaxItems: 5},
	}, nil, time.Minute))
	if !apierror.Is(err, codes.FailedPrecondition, "CONFIG_REVISION_CHANGED") {
		t.Errorf("Execute at the revision not yet serving: %v; want CONFIG_REVISION_CHANGED", err)
	}
	if n := count.n.Load(); n != before {
		t.Errorf("the server received %d requests for a call at a revision not serving", n-before)
	}

	// The operator may.
	if out, err := peers(t, s, identity.Operator).Registry.ReportRollout(context.Background(), ready); err != nil || out.GetServingConfigRevision() != 2 {
		t.Errorf("ReportRollout by the operator: %v (serving %d), want revision 2 serving", err, out.GetServingConfigRevision())
	}
}
