package attack_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/demo/fixture"
	"github.com/v0m3/v0m3/demo/scenario"
	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/grant"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/suite"
)

// reads returns the resource URIs the notes server was asked to read.
func reads(t *testing.T, callLog string) []string {
	t.Helper()
	b, err := os.ReadFile(callLog)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for line := range bytes.Lines(b) {
		var e fixture.CallLogEntry
		if err := json.Unmarshal(line, &e); err != nil {
			t.Fatalf("call log line %q: %v", line, err)
		}
		if e.Method == "resources/read" {
			out = append(out, e.URI)
		}
	}
	return out
}

// TestResourceReadIsTheHandlesTarget replays the finding "with a resource
// mapping, a task scoped to one note used its own handle and received
// excerpts of another": the read is now of exactly the handle's resolved
// target, and a request naming another resource than its grant is refused
// before the server is asked anything.
func TestResourceReadIsTheHandlesTarget(t *testing.T) {
	t.Parallel()
	s := startServices(t)
	callLog := filepath.Join(testkit.WritableDir(t), "notes.jsonl")
	conn, err := s.Registry.CreateConnection(testkit.As(s, ivan), &registryv1.CreateConnectionRequest{
		DisplayName: "V0M3 Sources", Owner: "platform-team", Transport: scenario.StdioFixture(v0m3Bin, "--call-log", callLog),
	})
	if err != nil {
		t.Fatal(err)
	}
	if conn, err = s.ApproveConnection(context.Background(), conn); err != nil {
		t.Fatal(err)
	}
	snap, err := s.Adapter.Discover(testkit.As(s, ivan), &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	// The mapping's reviewed resource is one note; the task may read
	// another.
	rateLimits, changelog, faq := fixture.URIPrefix+"rate-limits", fixture.URIPrefix+"changelog", fixture.URIPrefix+"migration-faq"
	m, err := s.Registry.ProposeMapping(testkit.As(s, ivan), &registryv1.ProposeMappingRequest{
		Capability: "retrieve_authorized_source", ConnectionId: conn.GetId(), SnapshotId: snap.GetId(),
		Target:      &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_RESOURCE, Name: rateLimits},
		ArgumentMap: []*registryv1.ArgumentBinding{{RemoteField: "uri", ProductField: "source", FromHandle: true}},
		Limits:      &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 4, AllowedMediaTypes: []string{"text/markdown"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if m, err = s.Registry.ReviewMapping(testkit.As(s, rita), &registryv1.ReviewMappingRequest{MappingId: m.GetId(), Revision: m.GetRevision(), Approve: true}); err != nil {
		t.Fatal(err)
	}

	task, err := s.Orchestrator.StartTask(testkit.As(s, alice), &orchestratorv1.StartTaskRequest{
		Profile: "source_review", Purpose: "review the changelog claims",
		SourceScope: []*orchestratorv1.SourceRef{{Uri: changelog, Title: "Changelog"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	handle := scenario.FindHandle(scenario.FindOffered(task.GetCatalogue(), "retrieve_authorized_source"), "Changelog")
	if handle == "" {
		t.Fatalf("no Changelog handle in %v", task.GetCatalogue())
	}
	got, err := s.Orchestrator.SubmitToolRequest(testkit.As(s, alice), &orchestratorv1.SubmitToolRequestRequest{
		TaskId: task.GetTask().GetId(), ProviderCallId: "call-1", Capability: "retrieve_authorized_source",
		Arguments: scenario.MustStruct(map[string]any{"source": handle, "query": "what changed"}),
	})
	if err != nil || got.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED || len(got.GetExcerpts()) == 0 {
		t.Fatalf("retrieve = %v, %v", got, err)
	}
	for _, ex := range got.GetExcerpts() {
		if strings.Contains(ex.GetQuotedText(), "requests per minute") || strings.Contains(ex.GetQuotedText(), "Ignore the document task") {
			t.Errorf("excerpt from another note: %q", ex.GetQuotedText())
		}
	}
	if r := reads(t, callLog); len(r) != 1 || r[0] != changelog {
		t.Errorf("the server was asked to read %v, want exactly [%s]", r, changelog)
	}

	// As the orchestrator peer: a grant to read the changelog does not
	// read another note.
	peers, err := s.PeerClients(suite.Orchestrator)
	if err != nil {
		t.Fatal(err)
	}
	orch, err := s.Credentials(identity.Orchestrator)
	if err != nil {
		t.Fatal(err)
	}
	read := &adapterv1.ExecuteRequest{
		ConnectionId: conn.GetId(), ConfigRevision: conn.GetConfigRevision(), MappingId: m.GetId(), MappingRevision: m.GetRevision(),
		Target: &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_RESOURCE, Name: changelog},
		Limits: m.GetLimits(),
		TaskId: task.GetTask().GetId(), AttemptId: "att_tampered",
	}
	tampered := sign(t, orch, read, nil, time.Minute)
	tampered.Target.Name = faq
	_, err = peers.Adapter.Execute(context.Background(), tampered)
	if !apierror.Is(err, codes.PermissionDenied, grant.ReasonMismatch) || apierror.Info(err).GetMetadata()["field"] != "target" {
		t.Errorf("tampered target: %v, want GRANT_MISMATCH on target", err)
	}
	if r := reads(t, callLog); len(r) != 1 {
		t.Errorf("reads after the tampered request: %v", r)
	}
}
