package attack_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/v0m3/v0m3/demo/fixture/renderer"
	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/grant"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/identity/identitytest"
	"github.com/v0m3/v0m3/internal/ids"
	"github.com/v0m3/v0m3/internal/receipt"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/suite"
)

// renderCall is the adapter call an attacker makes up: the renderer's
// render tool under a mapping that does not exist, for no task.
func renderCall(t *testing.T, r *rendererEnv, mappingID string, revision int) *adapterv1.ExecuteRequest {
	t.Helper()
	args, err := structpb.NewStruct(map[string]any{"document_revision": revision, "profile": 4, "request_id": "req_attacker"})
	if err != nil {
		t.Fatal(err)
	}
	return &adapterv1.ExecuteRequest{
		ConnectionId: r.conn.GetId(), ConfigRevision: r.conn.GetConfigRevision(),
		MappingId: mappingID, MappingRevision: 1,
		Target:    &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: renderer.ToolRender},
		Arguments: args,
		Limits:    &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 4},
		TaskId:    "task_attacker", AttemptId: "att_attacker",
	}
}

// sign returns req carrying a grant for want (req itself when want is
// nil) signed by signer, living ttl.
func sign(t *testing.T, signer *identity.Credentials, req, want *adapterv1.ExecuteRequest, ttl time.Duration) *adapterv1.ExecuteRequest {
	t.Helper()
	if want == nil {
		want = req
	}
	g, err := grant.For(want, ids.New("grant"), "int_attacker", "render_preview", time.Now(), ttl)
	if err != nil {
		t.Fatal(err)
	}
	req = proto.CloneOf(req)
	if req.Grant, err = grant.Sign(signer, g); err != nil {
		t.Fatal(err)
	}
	return req
}

func creds(t *testing.T, s *suite.Suite, service string) *identity.Credentials {
	t.Helper()
	c, err := s.Credentials(service)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestExecuteWithMadeUpMappingRunsNothing replays the finding "Execute
// called directly with a made-up mapping id ran the renderer". A caller
// without the orchestrator's certificate is refused by the access table;
// the orchestrator's own certificate without a valid execution grant for
// exactly this call is refused by the grant check. Either way no renderer
// process starts, nothing is rendered, no trace is written and the
// connection is unchanged.
func TestExecuteWithMadeUpMappingRunsNothing(t *testing.T) {
	t.Parallel()
	s := startServices(t)
	r := newRenderer(t, s, s.Clients, false)
	call := renderCall(t, r, "map_made_up", 31)

	// Callers that are not the orchestrator service.
	if _, err := s.Adapter.Execute(testkit.As(s, mallory), call); !apierror.Is(err, codes.PermissionDenied, "PEER_NOT_ALLOWED") {
		t.Errorf("a token in every group: %v, want PEER_NOT_ALLOWED", err)
	}
	for _, peer := range []string{identity.Registry, identity.Policy, identity.Evidence, identity.Operator} {
		c, err := s.PeerClients(peer)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Adapter.Execute(context.Background(), call); !apierror.Is(err, codes.PermissionDenied, "PEER_NOT_ALLOWED") {
			t.Errorf("as the %s service: %v, want PEER_NOT_ALLOWED", peer, err)
		}
	}

	// The orchestrator's certificate, without the grant for this call.
	impostor := identitytest.Credentials(t, identity.Orchestrator)[0]
	orchestrator := creds(t, s, identity.Orchestrator)
	other := renderCall(t, r, "map_made_up", 32)
	tests := []struct {
		name          string
		req           *adapterv1.ExecuteRequest
		reason, field string
	}{
		{"no grant", call, grant.ReasonMissing, ""},
		{"a forged grant", func() *adapterv1.ExecuteRequest { c := proto.CloneOf(call); c.Grant = "e30.e30.AAAA"; return c }(), grant.ReasonInvalid, ""},
		{"signed by an orchestrator certificate of another CA", sign(t, impostor, call, nil, time.Minute), grant.ReasonInvalid, ""},
		{"signed by the operator", sign(t, creds(t, s, identity.Operator), call, nil, time.Minute), grant.ReasonInvalid, ""},
		{"signed by the adapter", sign(t, creds(t, s, identity.Adapter), call, nil, time.Minute), grant.ReasonInvalid, ""},
		{"expired", sign(t, orchestrator, call, nil, -time.Minute), grant.ReasonExpired, ""},
		{"granted for other arguments", sign(t, orchestrator, call, other, time.Minute), grant.ReasonMismatch, "arguments"},
		{"granted for another mapping", sign(t, orchestrator, call, renderCall(t, r, "map_reviewed", 31), time.Minute), grant.ReasonMismatch, "mapping_id"},
	}
	peers, err := s.PeerClients(suite.Orchestrator)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests {
		_, err := peers.Adapter.Execute(context.Background(), tc.req)
		if !apierror.Is(err, codes.PermissionDenied, tc.reason) || apierror.Info(err).GetMetadata()["field"] != tc.field {
			t.Errorf("%s: %v (metadata %v), want PERMISSION_DENIED %s field %q", tc.name, err, apierror.Info(err).GetMetadata(), tc.reason, tc.field)
		}
	}

	// Nothing happened.
	if r.started() {
		t.Error("a renderer process started")
	}
	if a := r.artifacts(t); len(a) != 0 {
		t.Errorf("artifacts: %v", a)
	}
	conn, err := s.Registry.GetConnection(testkit.As(s, audrey), &registryv1.GetConnectionRequest{Id: r.conn.GetId()})
	if err != nil || !proto.Equal(conn, r.conn) {
		t.Errorf("connection after the attack = %v, %v; want unchanged %v", conn, err, r.conn)
	}
	tr, err := s.Evidence.GetTrace(testkit.As(s, audrey), &evidencev1.GetTraceRequest{TaskId: "task_attacker"})
	if len(tr.GetEvents()) != 0 || (err != nil && apierror.Code(err) != codes.NotFound) {
		t.Errorf("trace of the made-up task = %v, %v", tr, err)
	}
}

// TestGrantIsSpentOnce: the one call a grant names runs once over mutual
// TLS, and its result is attested by the adapter; the same request sent
// again is refused and renders nothing more.
func TestGrantIsSpentOnce(t *testing.T) {
	t.Parallel()
	s := startServices(t)
	r := newRenderer(t, s, s.Clients, true)
	call := renderCall(t, r, r.mapping.GetId(), 31)
	call.MappingRevision = r.mapping.GetRevision()
	granted := sign(t, creds(t, s, identity.Orchestrator), call, nil, time.Minute)
	peers, err := s.PeerClients(suite.Orchestrator)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := peers.Adapter.Execute(context.Background(), granted)
	if err != nil || resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
		t.Fatalf("granted call = %v, %v", resp, err)
	}
	a, err := receipt.Verify(creds(t, s, identity.Orchestrator), resp.GetReceiptAttestation())
	artifact, _ := receipt.Fields(resp.GetStructuredContent())
	if err != nil || a.AttemptID != call.GetAttemptId() || a.IntentID != "int_attacker" || a.ArtifactDigest != artifact || artifact == "" ||
		a.ResponseDigest != resp.GetResponseDigest() {
		t.Errorf("attestation %+v (%v), artifact %s", a, err, artifact)
	}
	if _, err := peers.Adapter.Execute(context.Background(), granted); !apierror.Is(err, codes.PermissionDenied, grant.ReasonUsed) {
		t.Errorf("replayed grant: %v, want GRANT_USED", err)
	}
	if calls, renders := r.calls(t); calls != 1 || renders != 1 {
		t.Errorf("renderer received %d calls and rendered %d times; want 1 and 1", calls, renders)
	}
}
