package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/types/known/structpb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/v0m3/v0m3/demo/fixture/renderer"
	"github.com/v0m3/v0m3/demo/scenario"
	"github.com/v0m3/v0m3/internal/identity"
	v1alpha1 "github.com/v0m3/v0m3/operator/api/v1alpha1"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/suite"
)

// The rotation table shows each server's serving and latest revision, its
// rollout's progress, credential version and whether its latest rotation
// is still rolling, done or failed.
func TestPrintRotation(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	done := metav1.NewTime(now.Add(-time.Minute))
	servers := []v1alpha1.MCPServer{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "mcp", Name: "search"}, Status: v1alpha1.MCPServerStatus{
			ConfigRevision: 3, ServingConfigRevision: 2, DesiredReplicas: 2, UpdatedReadyReplicas: 1, CredentialVersion: "search-token@812",
			Conditions: []metav1.Condition{{Type: v1alpha1.ConditionCredentialsReady, Reason: v1alpha1.ReasonRotationInProgress}},
			Rotation:   &v1alpha1.RotationStatus{FromRevision: 2, ToRevision: 3, CredentialVersion: "search-token@812", StartTime: metav1.NewTime(now.Add(-30 * time.Second))},
		}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "mcp", Name: "links"}, Status: v1alpha1.MCPServerStatus{
			ConfigRevision: 2, ServingConfigRevision: 2, DesiredReplicas: 1, UpdatedReadyReplicas: 1, CredentialVersion: "links-key@77",
			Conditions: []metav1.Condition{{Type: v1alpha1.ConditionCredentialsReady, Reason: v1alpha1.ReasonCredentialsCurrent}},
			Rotation:   &v1alpha1.RotationStatus{FromRevision: 1, ToRevision: 2, StartTime: metav1.NewTime(now.Add(-2 * time.Minute)), CompletionTime: &done},
		}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "mcp", Name: "render"}, Status: v1alpha1.MCPServerStatus{ConfigRevision: 1}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "mcp", Name: "notes"}, Status: v1alpha1.MCPServerStatus{
			ConfigRevision: 5, ServingConfigRevision: 4, DesiredReplicas: 1, CredentialVersion: "notes-token@9",
			Conditions: []metav1.Condition{{Type: v1alpha1.ConditionCredentialsReady, Reason: v1alpha1.ReasonRotationFailed}},
			Rotation: &v1alpha1.RotationStatus{FromRevision: 4, ToRevision: 5, StartTime: metav1.NewTime(now.Add(-11 * time.Minute)),
				Failure: "ProgressDeadlineExceeded: ReplicaSet notes-5 has timed out progressing"},
		}},
	}
	var out bytes.Buffer
	if err := printRotation(&out, servers, nil, now); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 5 {
		t.Fatalf("got %d lines:\n%s", len(lines), out.String())
	}
	for i, want := range [][]string{
		{"search", "2", "3", "1/2", "search-token@812", "RotationInProgress", "2 -> 3", "30s ago", "in progress", "-"},
		{"links", "2", "2", "1/1", "links-key@77", "CredentialsCurrent", "1 -> 2", "2m0s ago", "1m0s later", "-"},
		{"render", "-", "1", "-", "-"},
		{"notes", "4", "5", "0/1", "notes-token@9", "RotationFailed", "4 -> 5", "11m0s ago", "failed", "-"},
	} {
		// tabwriter pads columns with at least two spaces.
		if got := columns.Split(lines[i+1], -1)[1 : len(want)+1]; strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("line %q: columns %q, want %q", lines[i+1], got, want)
		}
	}
}

var columns = regexp.MustCompile(`\s{2,}`)

// waitRotation returns once no listed server is rotating, and fails naming
// the servers still rolling out when the wait ends first.
func TestWaitRotation(t *testing.T) {
	t.Parallel()
	rolling := v1alpha1.MCPServer{ObjectMeta: metav1.ObjectMeta{Namespace: "mcp", Name: "search"}, Status: v1alpha1.MCPServerStatus{
		ConfigRevision: 3,
		Conditions:     []metav1.Condition{{Type: v1alpha1.ConditionCredentialsReady, Reason: v1alpha1.ReasonRotationInProgress}},
		Rotation:       &v1alpha1.RotationStatus{FromRevision: 2, ToRevision: 3, StartTime: metav1.Now()},
	}}
	current := *rolling.DeepCopy()
	done := metav1.Now()
	current.Status.Rotation.CompletionTime = &done
	current.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionCredentialsReady, Reason: v1alpha1.ReasonCredentialsCurrent}}
	failed := *rolling.DeepCopy()
	failed.Status.Rotation.Failure = "the pods were not available within 10m0s of the credential change"
	failed.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionCredentialsReady, Reason: v1alpha1.ReasonRotationFailed}}
	idle := v1alpha1.MCPServer{ObjectMeta: metav1.ObjectMeta{Namespace: "mcp", Name: "render"}, Status: v1alpha1.MCPServerStatus{ConfigRevision: 1}}

	tests := []struct {
		name    string
		states  [][]v1alpha1.MCPServer // what each successive list returns; the last repeats
		wantErr string
	}{
		{"completes after rolling", [][]v1alpha1.MCPServer{{rolling, idle}, {rolling, idle}, {current, idle}}, ""},
		{"nothing rotating", [][]v1alpha1.MCPServer{{idle}}, ""},
		{"still rolling when the wait ends", [][]v1alpha1.MCPServer{{rolling, idle}}, "mcp/search still rolling out"},
		{"fails at once when a rotation failed", [][]v1alpha1.MCPServer{{rolling, idle}, {failed, idle}}, "mcp/search: the pods were not available within 10m0s"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
			defer cancel()
			calls := 0
			list := func(context.Context) ([]v1alpha1.MCPServer, error) {
				s := tc.states[min(calls, len(tc.states)-1)]
				calls++
				return s, nil
			}
			var out bytes.Buffer
			err := waitRotation(ctx, list, 10*time.Millisecond, func(s []v1alpha1.MCPServer) error { return printRotation(&out, s, nil, time.Now()) })
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("wait: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("wait = %v; want an error saying %q", err, tc.wantErr)
			}
			if !strings.Contains(out.String(), "NAMESPACE") {
				t.Errorf("no table printed:\n%s", out.String())
			}
		})
	}

	// A list that fails ends the wait with its error.
	boom := errors.New("list MCPServers: connection refused")
	if err := waitRotation(t.Context(), func(context.Context) ([]v1alpha1.MCPServer, error) { return nil, boom }, time.Millisecond, func(s []v1alpha1.MCPServer) error { return printRotation(io.Discard, s, nil, time.Now()) }); !errors.Is(err, boom) {
		t.Errorf("wait with a failing list = %v, want %v", err, boom)
	}
}

// TestRotationInvalidatedApprovals runs the real services and the real
// renderer MCP server: a request waits for approval bound to a
// connection's revision 1; the connection is rotated the operator's way
// (the new revision serves once its rollout is reported). The
// INVALIDATED column counts that approval only once revision 2 serves,
// and only for its server; a request bound to revision 2 is not counted.
// It counts the tasks the caller may read: an auditor and the task's
// requester see 1, another author 0. An orchestrator that cannot be
// reached is an error, not a 0.
func TestRotationInvalidatedApprovals(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dir := t.TempDir()
	s, err := suite.Start(ctx, suite.Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	rend, err := renderer.NewServer(renderer.Options{WorkDir: filepath.Join(t.TempDir(), "work")})
	if err != nil {
		t.Fatal(err)
	}
	mcpSrv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return rend }, nil))
	t.Cleanup(mcpSrv.Close)

	integrator := s.As(ctx, scenario.Integrator.ID, scenario.Integrator.Groups...)
	reviewer := s.As(ctx, scenario.Reviewer.ID, scenario.Reviewer.Groups...)
	alice := s.As(ctx, scenario.Alice.ID, scenario.Alice.Groups...)
	connect := func(name string) *registryv1.Connection {
		t.Helper()
		c, err := s.Registry.CreateConnection(integrator, &registryv1.CreateConnectionRequest{
			DisplayName: name, Owner: "platform-team", CredentialScope: "renders previews of the caller's documents",
			Transport: &registryv1.Transport{Kind: &registryv1.Transport_StreamableHttp{StreamableHttp: &registryv1.StreamableHTTPTransport{Url: mcpSrv.URL}}},
		})
		if err != nil {
			t.Fatalf("create connection: %v", err)
		}
		if c, err = s.Registry.ReviewConnection(reviewer, &registryv1.ReviewConnectionRequest{ConnectionId: c.GetId(), ConfigRevision: c.GetConfigRevision(), Approve: true}); err != nil {
			t.Fatalf("review connection: %v", err)
		}
		return c
	}
	conn, other := connect("renderer"), connect("other renderer")
	snap, err := s.Adapter.Discover(integrator, &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()})
	if err != nil {
		t.Fatalf("discover: %v", err)
	}
	m, err := s.Registry.ProposeMapping(integrator, &registryv1.ProposeMappingRequest{
		Capability: "render_preview", ConnectionId: conn.GetId(), SnapshotId: snap.GetId(),
		Target: &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: renderer.ToolRender},
		ArgumentMap: []*registryv1.ArgumentBinding{
			{RemoteField: "document_revision", ProductField: "document_revision"},
			{RemoteField: "profile", ProductField: "profile"},
		},
		Limits:              &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 4, AllowedMediaTypes: []string{"text/plain"}},
		IdempotencyKeyField: "request_id", StatusTool: renderer.ToolStatus,
	})
	if err != nil {
		t.Fatalf("propose mapping: %v", err)
	}
	if _, err := s.Registry.ReviewMapping(reviewer, &registryv1.ReviewMappingRequest{MappingId: m.GetId(), Revision: m.GetRevision(), Approve: true}); err != nil {
		t.Fatalf("review mapping: %v", err)
	}
	task, err := s.Orchestrator.StartTask(alice, &orchestratorv1.StartTaskRequest{Profile: "preview", Purpose: "preview revision 31 before review"})
	if err != nil {
		t.Fatalf("start task: %v", err)
	}
	submit := func(callID string, rev int64) {
		t.Helper()
		args, _ := structpb.NewStruct(map[string]any{"document_revision": 31, "profile": 4})
		r, err := s.Orchestrator.SubmitToolRequest(alice, &orchestratorv1.SubmitToolRequestRequest{
			TaskId: task.GetTask().GetId(), ProviderCallId: callID, Capability: "render_preview", Arguments: args, DocumentDigest: "sha256:document-31"})
		if err != nil || r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_AWAITING_APPROVAL || r.GetApproval().GetConfigRevision() != rev {
			t.Fatalf("submit = %v (approval at revision %d), %v; want AWAITING_APPROVAL at revision %d", r.GetState(), r.GetApproval().GetConfigRevision(), err, rev)
		}
	}
	submit("call-bound-to-1", 1)

	// The MCPServers as the operator reports them: connection and serving
	// revision (their Kubernetes side is proven in test/e2e).
	servers := func() []v1alpha1.MCPServer {
		t.Helper()
		var out []v1alpha1.MCPServer
		for _, id := range []string{conn.GetId(), other.GetId()} {
			c, err := s.Registry.GetConnection(integrator, &registryv1.GetConnectionRequest{Id: id})
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, v1alpha1.MCPServer{ObjectMeta: metav1.ObjectMeta{Namespace: "mcp", Name: c.GetDisplayName()},
				Status: v1alpha1.MCPServerStatus{ConnectionID: id, ConfigRevision: c.GetConfigRevision(), ServingConfigRevision: c.GetServingConfigRevision()}})
		}
		return out
	}
	// table counts as a member of groups through the flags `v0m3 rotation`
	// parses, and returns the INVALIDATED column by server name.
	table := func(addr, sub string, groups ...string) (map[string]string, error) {
		t.Helper()
		tok, err := s.Dev.Issuer.Mint(sub, groups, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		fs := newFlags("rotation", io.Discard)
		f := addOrchestratorFlags(fs)
		if err := parse(fs, []string{"--orchestrator-addr", addr, "--token", tok, "--tls-ca-file", filepath.Join(dir, "pki", "ca.crt")}); err != nil {
			t.Fatal(err)
		}
		count, closeConn, err := f.counter(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer closeConn()
		list := servers()
		n, err := count(list)
		if err != nil {
			return nil, err
		}
		var out bytes.Buffer
		if err := printRotation(&out, list, n, time.Now()); err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n")[1:] {
			cols := columns.Split(l, -1)
			got[cols[1]] = cols[len(cols)-1]
		}
		return got, nil
	}
	orch := s.Addr[suite.Orchestrator]
	check := func(when, sub string, groups []string, want map[string]string) {
		t.Helper()
		got, err := table(orch, sub, groups...)
		if err != nil {
			t.Fatalf("%s, %s counts: %v", when, sub, err)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s, INVALIDATED for %s = %v, want %v", when, sub, got, want)
		}
	}
	auditor := []string{"auditors"}
	check("before any rotation", "auditor@platform", auditor, map[string]string{"renderer": "0", "other renderer": "0"})

	if _, err := s.Registry.UpdateConnection(integrator, &registryv1.UpdateConnectionRequest{
		Id: conn.GetId(), ExpectedConfigRevision: 1, Transport: conn.GetTransport(), CredentialScope: conn.GetCredentialScope(),
		CredentialVersion: "secret@2", Reason: "credential rotation", KeepServing: true,
	}); err != nil {
		t.Fatalf("rotate: %v", err)
	}
	// Revision 1 still serves until the rollout is reported: the approval
	// is still valid.
	check("while revision 1 still serves", "auditor@platform", auditor, map[string]string{"renderer": "0", "other renderer": "0"})
	operator, err := s.PeerClients(identity.Operator)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := operator.Registry.ReportRollout(ctx, &registryv1.ReportRolloutRequest{Id: conn.GetId(), ConfigRevision: 2, Ready: true}); err != nil {
		t.Fatalf("report the rollout: %v", err)
	}
	submit("call-bound-to-2", 2)
	check("once revision 2 serves", "auditor@platform", auditor, map[string]string{"renderer": "1", "other renderer": "0"})
	check("once revision 2 serves", scenario.Alice.ID, scenario.Alice.Groups, map[string]string{"renderer": "1", "other renderer": "0"})
	// Another author reads only her own tasks: none of alice's count.
	check("once revision 2 serves", "carol", []string{"authors"}, map[string]string{"renderer": "0", "other renderer": "0"})

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	if got, err := table(closed, "auditor@platform", auditor...); err == nil || !strings.Contains(err.Error(), closed) {
		t.Errorf("counting through a closed orchestrator address = %v, %v; want an error naming %s", got, err, closed)
	}
}
