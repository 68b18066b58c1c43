package e2e_test

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/v0m3/v0m3/demo/scenario"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/policy"
	"github.com/v0m3/v0m3/suite"
)

// TestLargeResultArrives: a result far above gRPC's 4 MB default (8 MiB,
// read from a live server-filesystem file) that its mapping allows (32 MiB:
// server-filesystem sends the text twice, as content and as structured
// content; asset references allowed, since evidence keeps at most 256 KiB
// inline) arrives through every hop (adapter → orchestrator → evidence) and
// is recorded whole: the observation's size and digest are the file's. With
// gRPC's default message size the same call failed ADAPTER_RESOURCE_EXHAUSTED
// between the adapter and the orchestrator.
func TestLargeResultArrives(t *testing.T) {
	t.Parallel()
	node, entry := filesystemServer(t)
	root := testkit.ReachableDir(t)
	line := "Retry after the interval the server names; the migration keeps every record.\n"
	content := strings.Repeat(line, (8<<20)/len(line)+1)
	path := filepath.Join(root, "large.txt")
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	budget := policy.Limits{ResponseBytes: 256 << 20}
	s, err := suite.Start(t.Context(), suite.Config{
		DataDir:    t.TempDir(),
		Reach:      &suite.Reach{StdioRoots: []string{node}, AllowLoopback: true},
		TaskBudget: budget, RequesterBudget: budget,
	})
	if err != nil {
		t.Fatalf("start suite: %v", err)
	}
	t.Cleanup(s.Close)
	integrator := testkit.As(s, scenario.Integrator)
	conn, err := s.Connect(integrator, &registryv1.CreateConnectionRequest{
		DisplayName: "server-filesystem", Owner: "platform-team",
		Transport: &registryv1.Transport{Kind: &registryv1.Transport_Stdio{Stdio: &registryv1.StdioTransport{Command: node, Args: []string{entry, root}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := s.Adapter.Discover(integrator, &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()})
	if err != nil {
		t.Fatalf("discover: %v", err)
	}
	m, err := s.Registry.ProposeMapping(integrator, &registryv1.ProposeMappingRequest{
		Capability: scenario.Retrieve, ConnectionId: conn.GetId(), SnapshotId: snap.GetId(),
		Target:      &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: "read_text_file"},
		ArgumentMap: []*registryv1.ArgumentBinding{{RemoteField: "path", ProductField: "source", FromHandle: true}},
		Limits:      &registryv1.Limits{MaxResponseBytes: 32 << 20, MaxItems: 1, AllowedMediaTypes: []string{"text/plain"}, AssetReferenceAllowed: true},
		// The result is the file the handle named: an observation of it.
		Provenance: &registryv1.Provenance{Mode: registryv1.ProvenanceMode_PROVENANCE_MODE_HANDLE_TARGET, HandleField: "source"},
	})
	if err != nil {
		t.Fatalf("propose: %v", err)
	}
	if m, err = s.Registry.ReviewMapping(testkit.As(s, scenario.Reviewer), &registryv1.ReviewMappingRequest{MappingId: m.GetId(), Revision: m.GetRevision(), Approve: true}); err != nil ||
		m.GetState() != registryv1.MappingState_MAPPING_STATE_ACTIVE {
		t.Fatalf("review: %v, %v", m, err)
	}
	task, err := s.Orchestrator.StartTask(testkit.As(s, scenario.Alice), &orchestratorv1.StartTaskRequest{
		Profile: "source_review", Purpose: "review the large log",
		SourceScope: []*orchestratorv1.SourceRef{{Uri: path, Title: "Large log"}},
	})
	if err != nil {
		t.Fatalf("start task: %v", err)
	}
	handle := scenario.FindHandle(scenario.FindOffered(task.GetCatalogue(), scenario.Retrieve), "Large log")
	if handle == "" {
		t.Fatalf("no handle for the file in %v", task.GetCatalogue())
	}
	req, err := s.Orchestrator.SubmitToolRequest(testkit.As(s, scenario.Alice), &orchestratorv1.SubmitToolRequestRequest{
		TaskId: task.GetTask().GetId(), ProviderCallId: "call-1", Capability: scenario.Retrieve,
		Arguments: scenario.MustStruct(map[string]any{"source": handle, "query": "migration"}),
	})
	if err != nil || req.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED || req.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
		list, _ := s.Orchestrator.ListRequests(testkit.As(s, scenario.Alice), &orchestratorv1.ListRequestsRequest{TaskId: task.GetTask().GetId()})
		t.Fatalf("governed read of 8 MiB = %v, %v (recorded: %v); want executed, ok", req, err, list.GetRequests()[0].GetAttempts())
	}
	obs, err := s.Evidence.ListObservations(testkit.As(s, scenario.Auditor), &evidencev1.ListObservationsRequest{TaskId: task.GetTask().GetId()})
	if err != nil || len(obs.GetObservations()) != 1 {
		t.Fatalf("observations = %v, %v; want one", obs, err)
	}
	sum := sha256.Sum256([]byte(content))
	o := obs.GetObservations()[0]
	if o.GetSizeBytes() != int64(len(content)) || o.GetContentDigest() != "sha256:"+hex.EncodeToString(sum[:]) {
		t.Errorf("observation size %d digest %s; want the file's %d bytes, sha256:%x", o.GetSizeBytes(), o.GetContentDigest(), len(content), sum)
	}
}
