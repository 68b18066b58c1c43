package e2e_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/v0m3/v0m3/demo/scenario"
	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/adapter"
	"github.com/v0m3/v0m3/suite"
)

// filesystemServer returns node and the installed server-filesystem's
// entry point (testkit.ThirdPartyMCP: without an install it skips
// loudly, or fails in CI).
func filesystemServer(t *testing.T) (node, entry string) {
	t.Helper()
	dir := testkit.ThirdPartyMCP(t)
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal(err)
	}
	return node, filepath.Join(dir, "server-filesystem", "dist", "index.js")
}

// TestTypedArgumentMapReadMultipleFiles: server-filesystem's
// read_multiple_files takes an array of paths. A mapping binding the
// source handle to "paths" as a string is refused at review with a
// violation saying a string cannot fit an array, and nothing is stored;
// binding it to /paths/0 passes review, and a governed call sends the
// handle's target as a one-element array and reads the file.
func TestTypedArgumentMapReadMultipleFiles(t *testing.T) {
	t.Parallel()
	node, entry := filesystemServer(t)
	root := testkit.ReachableDir(t) // the server runs under a uid of its own
	content := "# Migration guide\n\nRetry after the interval the server names.\n"
	path := filepath.Join(root, "guide.md")
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	// Recording fixtures keeps what the server answered, sanitized: the
	// test reads the governed call's result there.
	fixtures := t.TempDir()
	s, err := suite.Start(t.Context(), suite.Config{
		DataDir:  t.TempDir(),
		Reach:    &suite.Reach{StdioRoots: []string{node}, AllowLoopback: true},
		Fixtures: &adapter.Fixtures{Dir: fixtures, Mode: adapter.FixturesRecord},
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
	const tool = "read_multiple_files"
	if !slices.ContainsFunc(snap.GetTools(), func(ti *registryv1.ToolIdentity) bool { return ti.GetName() == tool }) {
		t.Fatalf("server-filesystem %s lists no %s", testkit.FilesystemVersion, tool)
	}
	proposal := func(remote string) *registryv1.ProposeMappingRequest {
		return &registryv1.ProposeMappingRequest{
			Capability: scenario.Retrieve, ConnectionId: conn.GetId(), SnapshotId: snap.GetId(),
			Target:      &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: tool},
			ArgumentMap: []*registryv1.ArgumentBinding{{RemoteField: remote, ProductField: "source", FromHandle: true}},
			Limits:      &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 1, AllowedMediaTypes: []string{"text/plain"}},
		}
	}

	// The flat string binding: refused at review, nothing stored.
	_, err = s.Registry.ProposeMapping(integrator, proposal("paths"))
	if !apierror.Is(err, codes.InvalidArgument, "INVALID_MAPPING") {
		t.Fatalf("flat binding to paths: %v, want INVALID_ARGUMENT INVALID_MAPPING", err)
	}
	var said string
	for _, d := range status.Convert(err).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				if v.GetField() == "argument_map[0].remote_field" {
					said = v.GetDescription()
				}
			}
		}
	}
	if !strings.Contains(said, `a string) cannot fit remote "paths" (array)`) || !strings.Contains(said, "/paths/-") {
		t.Errorf("argument_map[0].remote_field says %q; want that a string cannot fit the array, and how to send one", said)
	}
	if list, err := s.Registry.ListMappings(integrator, &registryv1.ListMappingsRequest{ConnectionId: conn.GetId()}); err != nil || len(list.GetMappings()) != 0 {
		t.Fatalf("mappings after the refused proposal = %v, %v; want none", list, err)
	}

	// The handle as the first element: accepted and reviewed.
	m, err := s.Registry.ProposeMapping(integrator, proposal("/paths/0"))
	if err != nil {
		t.Fatalf("propose /paths/0: %v", err)
	}
	if m, err = s.Registry.ReviewMapping(testkit.As(s, scenario.Reviewer), &registryv1.ReviewMappingRequest{MappingId: m.GetId(), Revision: m.GetRevision(), Approve: true}); err != nil ||
		m.GetState() != registryv1.MappingState_MAPPING_STATE_ACTIVE {
		t.Fatalf("review: %v, %v", m, err)
	}

	// A governed call: alice's task may read the guide, by handle.
	task, err := s.Orchestrator.StartTask(testkit.As(s, scenario.Alice), &orchestratorv1.StartTaskRequest{
		//lint:ignore SA1019 profiles are read by StartTask once issue 13's planner lands; the kind names the same default profile.
		Kind: orchestratorv1.TaskKind_TASK_KIND_SOURCE_REVIEW, Purpose: "review the migration guide",
		SourceScope: []*orchestratorv1.SourceRef{{Uri: path, Title: "Migration guide"}},
	})
	if err != nil {
		t.Fatalf("start task: %v", err)
	}
	handle := scenario.FindHandle(scenario.FindOffered(task.GetCatalogue(), scenario.Retrieve), "Migration guide")
	if handle == "" {
		t.Fatalf("no handle for the guide in %v", task.GetCatalogue())
	}
	req, err := s.Orchestrator.SubmitToolRequest(testkit.As(s, scenario.Alice), &orchestratorv1.SubmitToolRequestRequest{
		TaskId: task.GetTask().GetId(), ProviderCallId: "call-1", Capability: scenario.Retrieve,
		Arguments: scenario.MustStruct(map[string]any{"source": handle, "query": "retry interval"}),
	})
	if err != nil || req.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED || req.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
		t.Fatalf("governed call = %v, %v; want executed, ok", req, err)
	}

	// What was sent: the handle's target as a one-element array, in the
	// protocol trace (never the handle token).
	trace, err := s.Evidence.GetTrace(testkit.As(s, scenario.Auditor), &evidencev1.GetTraceRequest{TaskId: task.GetTask().GetId()})
	if err != nil {
		t.Fatal(err)
	}
	var sent []string
	for _, e := range trace.GetEvents() {
		if p := e.GetProtocol(); p != nil && p.GetMethod() == "tools/call" {
			raw, _ := json.Marshal(p.GetSafeArguments().AsMap())
			sent = append(sent, string(raw))
		}
	}
	wantArgs, _ := json.Marshal(map[string]any{"paths": []string{path}})
	if len(sent) != 1 || sent[0] != string(wantArgs) {
		t.Errorf("tools/call arguments in the trace = %v, want [%s]", sent, wantArgs)
	}

	// What the server answered: the file's content (the recorded fixture
	// of the call holds the response the adapter returned).
	call := recordedCall(t, fixtures, tool)
	if got, _ := json.Marshal(call.Provenance["safe_arguments"]); string(got) != string(wantArgs) {
		t.Errorf("recorded arguments = %s, want %s", got, wantArgs)
	}
	raw, err := json.Marshal(call.Response)
	if err != nil {
		t.Fatal(err)
	}
	resp := &adapterv1.ExecuteResponse{}
	if err := protojson.Unmarshal(raw, resp); err != nil {
		t.Fatalf("recorded response: %v", err)
	}
	if want := path + ":\n" + content + "\n"; len(resp.GetItems()) != 1 || resp.GetItems()[0].GetText() != want {
		t.Errorf("the server answered %v, want the file's content %q", resp.GetItems(), want)
	}
}

// recordedFixture is the part of a recorded fixture file read here.
type recordedFixture struct {
	Kind       string         `json:"kind"`
	Identity   map[string]any `json:"identity"`
	Provenance map[string]any `json:"provenance"`
	Response   any            `json:"response"`
}

// recordedCall returns the one recorded call of tool in dir.
func recordedCall(t *testing.T, dir, tool string) recordedFixture {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var found []recordedFixture
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		var f recordedFixture
		if err := json.Unmarshal(b, &f); err != nil {
			t.Fatalf("fixture %s: %v", e.Name(), err)
		}
		if f.Kind == "call" && f.Identity["target_name"] == tool {
			found = append(found, f)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d recorded calls of %s in %s, want 1", len(found), tool, dir)
	}
	return found[0]
}
