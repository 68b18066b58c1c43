package e2e_test

import (
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/v0m3/v0m3/demo/scenario"
	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/suite"
)

// world is one suite plus one fixture connection with an active mapping of
// retrieve_authorized_source onto the fixture's search tool.
type world struct {
	t        *testing.T
	s        *suite.Suite
	conn     *registryv1.Connection
	snap     *registryv1.DiscoverySnapshot
	mapping  *registryv1.Mapping
	callLog  string
	addr     string // HTTP fixture address, when the fixture is served over HTTP
	stopHTTP func()
}

var faqScope = []*orchestratorv1.SourceRef{{Uri: scenario.MigrationFAQURI, Title: "Migration FAQ"}}

// newHTTPWorld serves the fixture over streamable HTTP at a fixed address
// (so it can be restarted as a changed server behind the same endpoint),
// connects, discovers and maps it.
func newHTTPWorld(t *testing.T, fixtureArgs ...string) *world {
	t.Helper()
	w := &world{t: t, s: startSuite(t, t.TempDir()), callLog: filepath.Join(testkit.WritableDir(t), "calls.jsonl"), addr: testkit.FreeLoopbackAddr(t)}
	w.restartFixture(fixtureArgs...)
	w.connect(scenario.HTTPFixture("http://" + w.addr + "/mcp"))
	return w
}

// restartFixture stops the HTTP fixture, if running, and starts it again
// on the same address with args: the same endpoint, a changed server.
func (w *world) restartFixture(args ...string) {
	w.t.Helper()
	if w.stopHTTP != nil {
		w.stopHTTP()
	}
	_, w.stopHTTP = startHTTPFixtureAt(w.t, w.addr, append([]string{"--call-log", w.callLog}, args...)...)
}

// as returns a context carrying p's bearer token for the world's suite.

func (w *world) connect(tr *registryv1.Transport) {
	t := w.t
	t.Helper()
	var err error
	w.conn, err = w.s.Connect(testkit.As(w.s, scenario.Integrator), &registryv1.CreateConnectionRequest{
		DisplayName: "V0M3 Sources", Owner: "platform-team", Transport: tr,
	})
	if err != nil {
		t.Fatalf("create connection: %v", err)
	}
	w.snap = w.discover()
	w.mapping = w.propose("", w.snap, "search", "query")
	w.mapping = w.review(w.mapping)
}

func (w *world) discover() *registryv1.DiscoverySnapshot {
	w.t.Helper()
	snap, err := w.s.Adapter.Discover(testkit.As(w.s, scenario.Integrator), &adapterv1.DiscoverRequest{ConnectionId: w.conn.GetId()})
	if err != nil {
		w.t.Fatalf("discover: %v", err)
	}
	return snap
}

// propose proposes, as the integrator, (a new revision of) the mapping of
// the product request {source, query} onto tool: query goes to queryField,
// the source handle's target to "uri".
func (w *world) propose(mappingID string, snap *registryv1.DiscoverySnapshot, tool, queryField string) *registryv1.Mapping {
	w.t.Helper()
	m, err := w.s.Registry.ProposeMapping(testkit.As(w.s, scenario.Integrator), &registryv1.ProposeMappingRequest{
		MappingId: mappingID, Capability: scenario.Retrieve, ConnectionId: w.conn.GetId(), SnapshotId: snap.GetId(),
		Target: &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: tool},
		ArgumentMap: []*registryv1.ArgumentBinding{
			{RemoteField: queryField, ProductField: "query"},
			{RemoteField: "uri", ProductField: "source", FromHandle: true},
		},
		Limits: &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 5, AllowedMediaTypes: []string{"text/markdown"}},
	})
	if err != nil {
		w.t.Fatalf("propose mapping: %v", err)
	}
	return m
}

// review approves m as the reviewer.
func (w *world) review(m *registryv1.Mapping) *registryv1.Mapping {
	w.t.Helper()
	m, err := w.s.Registry.ReviewMapping(testkit.As(w.s, scenario.Reviewer), &registryv1.ReviewMappingRequest{
		MappingId: m.GetId(), Revision: m.GetRevision(), Approve: true,
	})
	if err != nil {
		w.t.Fatalf("review mapping: %v", err)
	}
	return m
}

func (w *world) mappingNow() *registryv1.Mapping {
	w.t.Helper()
	m, err := w.s.Registry.GetMapping(testkit.As(w.s, scenario.Integrator), &registryv1.GetMappingRequest{Id: w.mapping.GetId()})
	if err != nil {
		w.t.Fatal(err)
	}
	return m
}

// startTask starts a source-review task over the FAQ as alice.
func (w *world) startTask() *orchestratorv1.StartTaskResponse {
	w.t.Helper()
	resp, err := w.s.Orchestrator.StartTask(testkit.As(w.s, scenario.Alice), &orchestratorv1.StartTaskRequest{
		Profile: "source_review", Purpose: "review", SourceScope: faqScope,
	})
	if err != nil {
		w.t.Fatalf("start task: %v", err)
	}
	return resp
}

// retrieve submits, as alice, the same product request every time: the
// FAQ's handle and the query "migration".
func (w *world) retrieve(task *orchestratorv1.StartTaskResponse, call string) (*orchestratorv1.ToolRequest, error) {
	w.t.Helper()
	handle := ""
	if o := scenario.FindOffered(task.GetCatalogue(), scenario.Retrieve); o != nil {
		handle = scenario.FindHandle(o, "Migration FAQ")
	}
	return w.s.Orchestrator.SubmitToolRequest(testkit.As(w.s, scenario.Alice), &orchestratorv1.SubmitToolRequestRequest{
		TaskId: task.GetTask().GetId(), ProviderCallId: call, Capability: scenario.Retrieve,
		Arguments: scenario.MustStruct(map[string]any{"source": handle, "query": "migration"}),
	})
}

func hostileQuoted(r *orchestratorv1.ToolRequest) bool {
	for _, e := range r.GetExcerpts() {
		if strings.Contains(e.GetQuotedText(), scenario.HostileSentence) {
			return true
		}
	}
	return false
}

func toolChange(d *registryv1.SnapshotDiff, name string) *registryv1.ItemChange {
	for _, c := range d.GetTools() {
		if c.GetName() == name {
			return c
		}
	}
	return nil
}

// TestSchemaDriftIsAMigration: the search tool changes from {query} to
// {text, filters}. The next snapshot has a new digest, the active mapping
// needs review, pending tasks keep their evidence but cannot submit through
// it, and a reviewed new mapping revision serves the same product request.
func TestSchemaDriftIsAMigration(t *testing.T) {
	t.Parallel()
	w := newHTTPWorld(t)
	ctx := testkit.As(w.s, scenario.Integrator)
	pending := w.startTask()
	first, err := w.retrieve(pending, "call-1")
	if err != nil || first.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
		t.Fatalf("retrieval before drift: %v %v", first.GetState(), err)
	}

	w.restartFixture("--schema", "v2")
	snap2 := w.discover()
	if snap2.GetDigest() == w.snap.GetDigest() {
		t.Fatal("the snapshot after a schema change has the same digest")
	}
	diff, err := w.s.Registry.DiffSnapshots(ctx, &registryv1.DiffSnapshotsRequest{BaseSnapshotId: w.snap.GetId(), TargetSnapshotId: snap2.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	if c := toolChange(diff, "search"); c == nil || c.GetKind() != registryv1.ChangeKind_CHANGE_KIND_CHANGED || !slices.Contains(c.GetChangedDigests(), "input_schema_digest") {
		t.Fatalf("diff for search = %v, want CHANGED input_schema_digest", c)
	}
	if st := w.mappingNow().GetState(); st != registryv1.MappingState_MAPPING_STATE_REVIEW_REQUIRED {
		t.Fatalf("mapping after schema drift is %v, want REVIEW_REQUIRED", st)
	}

	// The pending task cannot submit new calls through the changed mapping,
	// and keeps its old attempt evidence.
	calls := toolCalls(callLog(t, w.callLog))
	if _, err := w.retrieve(pending, "call-2"); !apierror.Is(err, codes.FailedPrecondition, "MAPPING_REVIEW_REQUIRED") {
		t.Fatalf("submit through a drifted mapping: %v, want FAILED_PRECONDITION MAPPING_REVIEW_REQUIRED", err)
	}
	if n := toolCalls(callLog(t, w.callLog)); n != calls {
		t.Errorf("a refused request reached the server (%d tools/call, want %d)", n, calls)
	}
	old, err := w.s.Orchestrator.GetRequest(testkit.As(w.s, scenario.Alice), &orchestratorv1.GetRequestRequest{Id: first.GetId()})
	if err != nil || old.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED || len(old.GetAttempts()) != 1 || len(old.GetExcerpts()) == 0 {
		t.Fatalf("the pending task lost its earlier evidence: %v %v", old, err)
	}

	// A new revision of the adapter map, reviewed, serves the same product
	// request: query now goes to "text".
	rev2 := w.review(w.propose(w.mapping.GetId(), snap2, "search", "text"))
	if rev2.GetRevision() != 2 || rev2.GetState() != registryv1.MappingState_MAPPING_STATE_ACTIVE || rev2.GetInputSchemaDigest() == w.mapping.GetInputSchemaDigest() {
		t.Fatalf("new mapping revision %d %v schema %s", rev2.GetRevision(), rev2.GetState(), rev2.GetInputSchemaDigest())
	}
	fresh := w.startTask()
	if o := scenario.FindOffered(fresh.GetCatalogue(), scenario.Retrieve); o == nil || o.GetMappingRevision() != 2 {
		t.Fatalf("a new task is not offered the capability at mapping revision 2: %v", fresh.GetCatalogue())
	}
	again, err := w.retrieve(fresh, "call-1")
	if err != nil || again.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED || !hostileQuoted(again) || again.GetMappingRevision() != 2 {
		t.Fatalf("the same product request through revision 2: %v %v", again, err)
	}
	// The task offered revision 1 stays refused: its mapping was superseded.
	if _, err := w.retrieve(pending, "call-3"); apierror.Code(err) != codes.FailedPrecondition {
		t.Errorf("the old task submitting after the new revision: %v, want FAILED_PRECONDITION", err)
	}
}

// TestDescriptionDriftNeedsReview: only the description changes, to claim
// it can search private notes. No type breaks, yet the mapping needs review
// before the new text is used, and private notes stay out of reach because
// scope is local policy.
func TestDescriptionDriftNeedsReview(t *testing.T) {
	t.Parallel()
	w := newHTTPWorld(t)
	ctx := testkit.As(w.s, scenario.Integrator)
	w.restartFixture("--description", "private")
	snap2 := w.discover()
	diff, err := w.s.Registry.DiffSnapshots(ctx, &registryv1.DiffSnapshotsRequest{BaseSnapshotId: w.snap.GetId(), TargetSnapshotId: snap2.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	if c := toolChange(diff, "search"); c == nil || strings.Join(c.GetChangedDigests(), ",") != "description_digest" {
		t.Fatalf("diff for search = %v, want only description_digest changed", c)
	}
	if st := w.mappingNow().GetState(); st != registryv1.MappingState_MAPPING_STATE_REVIEW_REQUIRED {
		t.Fatalf("mapping after description drift is %v, want REVIEW_REQUIRED", st)
	}
	// Until reviewed, no task is offered the capability.
	blocked := w.startTask()
	if o := scenario.FindOffered(blocked.GetCatalogue(), scenario.Retrieve); o != nil {
		t.Fatal("a capability whose mapping needs review was offered")
	}
	if e := considered(blocked.GetCatalogue(), scenario.Retrieve); e.GetReason() != policyv1.NotOfferedReason_NOT_OFFERED_REASON_REGISTRATION_MISSING {
		t.Errorf("not offered because %v, want REGISTRATION_MISSING", e.GetReason())
	}

	// Reviewers see the new remote text with its digest; the model still
	// sees only the local description.
	rev2 := w.review(w.propose(w.mapping.GetId(), snap2, "search", "query"))
	if !strings.Contains(rev2.GetRemoteDescription(), "private") || rev2.GetDescriptionDigest() == w.mapping.GetDescriptionDigest() {
		t.Fatalf("reviewed revision shows %q / %s", rev2.GetRemoteDescription(), rev2.GetDescriptionDigest())
	}
	task := w.startTask()
	cat, _ := protojson.Marshal(task.GetCatalogue())
	if strings.Contains(string(cat), "private") || strings.Contains(string(cat), "Search all notes") {
		t.Errorf("remote description entered model context: %s", cat)
	}

	// A request for private notes fails at handle resolution: the model can
	// only name sources through handles of this task's scope.
	calls := toolCalls(callLog(t, w.callLog))
	for _, source := range []string{"v0m3-sources://notes/private-drafts", "private notes", "h_" + strings.Repeat("a", 52)} {
		_, err := w.s.Orchestrator.SubmitToolRequest(testkit.As(w.s, scenario.Alice), &orchestratorv1.SubmitToolRequestRequest{
			TaskId: task.GetTask().GetId(), ProviderCallId: "private-" + source, Capability: scenario.Retrieve,
			Arguments: scenario.MustStruct(map[string]any{"source": source, "query": "private drafts"}),
		})
		if apierror.Reason(err) != "HANDLE_UNKNOWN" {
			t.Errorf("request for private notes with source %q: %v, want HANDLE_UNKNOWN", source, err)
		}
	}
	if n := toolCalls(callLog(t, w.callLog)); n != calls {
		t.Errorf("a request for private notes reached the server")
	}
}

// TestRenamedToolNeedsReview: the tool is renamed; the mapped tool is gone.
func TestRenamedToolNeedsReview(t *testing.T) {
	t.Parallel()
	w := newHTTPWorld(t)
	ctx := testkit.As(w.s, scenario.Integrator)
	w.restartFixture("--tool-name", "find_notes")
	snap2 := w.discover()
	diff, err := w.s.Registry.DiffSnapshots(ctx, &registryv1.DiffSnapshotsRequest{BaseSnapshotId: w.snap.GetId(), TargetSnapshotId: snap2.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	if c := toolChange(diff, "search"); c.GetKind() != registryv1.ChangeKind_CHANGE_KIND_REMOVED {
		t.Errorf("search: %v, want REMOVED", c)
	}
	if c := toolChange(diff, "find_notes"); c.GetKind() != registryv1.ChangeKind_CHANGE_KIND_ADDED {
		t.Errorf("find_notes: %v, want ADDED", c)
	}
	if st := w.mappingNow().GetState(); st != registryv1.MappingState_MAPPING_STATE_REVIEW_REQUIRED {
		t.Fatalf("mapping after rename is %v, want REVIEW_REQUIRED", st)
	}
	rev2 := w.review(w.propose(w.mapping.GetId(), snap2, "find_notes", "query"))
	got, err := w.retrieve(w.startTask(), "call-1")
	if err != nil || !hostileQuoted(got) || got.GetMappingRevision() != rev2.GetRevision() {
		t.Fatalf("retrieval through the renamed tool: %v %v", got, err)
	}
}

// TestConfigMoveNeedsReview: the same friendly name moves to another
// executable; that is a new config revision and its mappings need review.
func TestConfigMoveNeedsReview(t *testing.T) {
	t.Parallel()
	w := &world{t: t, s: startSuite(t, t.TempDir())}
	ctx := testkit.As(w.s, scenario.Integrator)
	w.connect(scenario.StdioFixture(v0m3Bin))
	task := w.startTask()

	moved := filepath.Join(testkit.ReachableDir(t), "v0m3-moved")
	copyFile(t, v0m3Bin, moved)
	conn, err := w.s.Registry.UpdateConnection(ctx, &registryv1.UpdateConnectionRequest{
		Id: w.conn.GetId(), ExpectedConfigRevision: w.conn.GetConfigRevision(),
		Transport: scenario.StdioFixture(moved), Reason: "moved to another executable",
	})
	if err != nil {
		t.Fatal(err)
	}
	if conn.GetConfigRevision() != 2 || conn.GetDisplayName() != "V0M3 Sources" || conn.GetId() != w.conn.GetId() ||
		conn.GetReviewState() != registryv1.ReviewState_REVIEW_STATE_PENDING {
		t.Fatalf("moved connection: %v, want revision 2 of the same connection, pending review", conn)
	}
	if st := w.mappingNow().GetState(); st != registryv1.MappingState_MAPPING_STATE_REVIEW_REQUIRED {
		t.Fatalf("mapping after the move is %v, want REVIEW_REQUIRED", st)
	}
	if _, err := w.retrieve(task, "call-1"); !apierror.Is(err, codes.FailedPrecondition, "MAPPING_REVIEW_REQUIRED") {
		t.Fatalf("submit after the move: %v, want MAPPING_REVIEW_REQUIRED", err)
	}
	revs, err := w.s.Registry.ListConfigRevisions(ctx, &registryv1.ListConfigRevisionsRequest{ConnectionId: conn.GetId()})
	if err != nil || len(revs.GetRevisions()) != 2 || revs.GetRevisions()[1].GetReason() != "moved to another executable" {
		t.Fatalf("config revisions: %v %v", revs, err)
	}
}

// TestSameNameTwoServers: two servers both call themselves "V0M3 Sources";
// they are two connections, and every record names the one that served.
func TestSameNameTwoServers(t *testing.T) {
	t.Parallel()
	w := &world{t: t, s: startSuite(t, t.TempDir())}
	ctx := testkit.As(w.s, scenario.Integrator)
	w.connect(scenario.StdioFixture(v0m3Bin))
	other, err := w.s.Connect(ctx, &registryv1.CreateConnectionRequest{
		DisplayName: "V0M3 Sources", Owner: "another-team", Transport: scenario.StdioFixture(v0m3Bin, "--library", "b"),
	})
	if err != nil {
		t.Fatal(err)
	}
	otherSnap, err := w.s.Adapter.Discover(ctx, &adapterv1.DiscoverRequest{ConnectionId: other.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	if other.GetId() == w.conn.GetId() || otherSnap.GetServerInfo().GetName() != w.snap.GetServerInfo().GetName() {
		t.Fatalf("two servers with one name: ids %s %s, names %q %q", w.conn.GetId(), other.GetId(), w.snap.GetServerInfo().GetName(), otherSnap.GetServerInfo().GetName())
	}
	for _, r := range otherSnap.GetResources() {
		if strings.HasPrefix(r.GetUri(), "v0m3-sources://notes/") {
			t.Fatalf("the second library shares source identities with the first: %s", r.GetUri())
		}
	}
	task := w.startTask()
	got, err := w.retrieve(task, "call-1")
	if err != nil || got.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
		t.Fatalf("retrieve: %v %v", got, err)
	}
	obs, err := w.s.Evidence.ListObservations(testkit.As(w.s, scenario.Auditor), &evidencev1.ListObservationsRequest{TaskId: task.GetTask().GetId()})
	if err != nil || len(obs.GetObservations()) == 0 {
		t.Fatalf("observations: %v %v", obs, err)
	}
	for _, o := range obs.GetObservations() {
		if o.GetConnectionId() != w.conn.GetId() {
			t.Errorf("observation names connection %s, want the mapped %s", o.GetConnectionId(), w.conn.GetId())
		}
	}
	tr, err := w.s.Evidence.GetTrace(testkit.As(w.s, scenario.Auditor), &evidencev1.GetTraceRequest{TaskId: task.GetTask().GetId()})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range tr.GetEvents() {
		if p := e.GetProtocol(); p != nil && p.GetConnectionId() != w.conn.GetId() {
			t.Errorf("protocol trace names connection %s, want %s", p.GetConnectionId(), w.conn.GetId())
		}
	}
	// A mapping onto the second server is its own decision, pending review,
	// and does not make the first one's task use it.
	m2, err := w.s.Registry.ProposeMapping(ctx, &registryv1.ProposeMappingRequest{
		Capability: scenario.Retrieve, ConnectionId: other.GetId(), SnapshotId: otherSnap.GetId(),
		Target: &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: "search"},
		ArgumentMap: []*registryv1.ArgumentBinding{
			{RemoteField: "query", ProductField: "query"},
			{RemoteField: "uri", ProductField: "source", FromHandle: true},
		},
		Limits: &registryv1.Limits{MaxResponseBytes: 1 << 16, MaxItems: 5},
	})
	if err != nil || m2.GetConnectionId() != other.GetId() || m2.GetState() != registryv1.MappingState_MAPPING_STATE_PENDING_REVIEW {
		t.Fatalf("mapping onto the second server: %v %v", m2, err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
