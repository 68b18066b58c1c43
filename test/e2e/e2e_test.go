// Package e2e_test runs the first experiment end to end: the real v0m3
// binary, the five services over gRPC, and the fixture MCP server as a real
// subprocess over stdio and streamable HTTP.
package e2e_test

import (
	"bufio"
	"context"
	"crypto/x509"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/demo/fixture"
	"github.com/v0m3/v0m3/demo/scenario"
	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/serve"
	"github.com/v0m3/v0m3/internal/testkit"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/suite"

	"github.com/v0m3/v0m3/services/adapter"
)

// v0m3Bin is the real binary built once for every test here: it is the
// fixture MCP server's executable and the command under test.
var v0m3Bin string

func TestMain(m *testing.M) {
	// The in-process adapter re-executes this test binary as the sandbox
	// launcher of each local server it starts.
	if adapter.IsSandboxLaunch() {
		adapter.RunSandboxLaunch()
	}
	bins, cleanup, err := testkit.BuildBinaries("github.com/v0m3/v0m3/cmd/v0m3")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	v0m3Bin = bins[0]
	code := m.Run()
	cleanup()
	os.Exit(code)
}

// People the tests act as besides scenario's, each in the groups the
// default policy gives their role.
var (
	// approver decides requests that need a person.
	approver = scenario.Person{ID: "approver@platform", Groups: []string{"approvers"}}
)

// stack is what a test talks to: clients of the services, and the
// development issuer whose tokens they accept (a testkit.Minter: call
// as a person with testkit.As).
type stack struct {
	suite.Clients
	*identity.DevIssuer
}

// stackOf is the suite's own clients and issuer.
func stackOf(s *suite.Suite) stack { return stack{Clients: s.Clients, DevIssuer: s.Dev.Issuer} }

func startSuite(t *testing.T, dataDir string) *suite.Suite {
	t.Helper()
	s, err := suite.Start(context.Background(), suite.Config{DataDir: dataDir})
	if err != nil {
		t.Fatalf("start suite: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// callLog reads the fixture server's request log: one JSON object a line.
func callLog(t *testing.T, path string) []map[string]string {
	t.Helper()
	out, err := fixture.ReadJSONLines[map[string]string](path)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func toolCalls(log []map[string]string) int {
	n := 0
	for _, e := range log {
		if e["method"] == "tools/call" {
			n++
		}
	}
	return n
}

// startHTTPFixture runs `v0m3 fixture-server --transport http` as a child
// process on an ephemeral port and returns its URL.
func startHTTPFixture(t *testing.T, args ...string) string {
	t.Helper()
	u, _ := startHTTPFixtureAt(t, "127.0.0.1:0", args...)
	return u
}

// startHTTPFixtureAt runs the HTTP fixture on addr and returns its URL and
// a function that stops it (also called at cleanup).
func startHTTPFixtureAt(t *testing.T, addr string, args ...string) (string, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, v0m3Bin, append([]string{"fixture-server", "--transport", "http", "--addr", addr}, args...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); _ = cmd.Wait() }) }
	t.Cleanup(stop)
	urlc := make(chan string, 1)
	go func() {
		re := regexp.MustCompile(`listening on (http://\S+)`)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				urlc <- m[1]
			}
		}
	}()
	select {
	case u := <-urlc:
		return u, stop
	case <-time.After(30 * time.Second):
		t.Fatal("fixture server did not report its address")
		return "", stop
	}
}

// TestFirstExperiment runs the seed's first experiment through the five
// real gRPC services with the fixture as a real MCP server, over stdio and
// over streamable HTTP, and checks what a product service relies on.
func TestFirstExperiment(t *testing.T) {
	t.Parallel()
	for _, transport := range []string{"stdio", "http"} {
		t.Run(transport, func(t *testing.T) {
			t.Parallel()
			logPath := filepath.Join(testkit.WritableDir(t), "calls.jsonl")
			var tr *registryv1.Transport
			if transport == "stdio" {
				tr = scenario.StdioFixture(v0m3Bin, "--call-log", logPath)
			} else {
				tr = scenario.HTTPFixture(startHTTPFixture(t, "--call-log", logPath))
			}
			s := startSuite(t, t.TempDir())
			ctx := context.Background()
			r, err := scenario.Run(ctx, s.Clients, scenario.Config{Transport: tr, As: s.As})
			if err != nil {
				t.Fatalf("scenario: %v", err)
			}
			checkFirstExperiment(t, s, r)
			// Only the one authorized retrieval reached the server: the
			// unknown field, the export and the foreign handle were refused
			// before any MCP request was sent.
			if n := toolCalls(callLog(t, logPath)); n != 1 {
				t.Errorf("fixture received %d tools/call requests, want exactly 1 (the authorized retrieval)", n)
			}
		})
	}
}

func checkFirstExperiment(t *testing.T, s *suite.Suite, r *scenario.Result) {
	t.Helper()
	ctx := testkit.As(s, scenario.Auditor)

	// Discovery: the snapshot has digests for every schema and description.
	var search *registryv1.ToolIdentity
	for _, tool := range r.Snapshot.GetTools() {
		if tool.GetName() == "search" {
			search = tool
		}
	}
	if search == nil || !strings.HasPrefix(search.GetInputSchemaDigest(), "sha256:") || !strings.HasPrefix(search.GetDescriptionDigest(), "sha256:") {
		t.Fatalf("snapshot search tool lacks digests: %v", search)
	}
	if r.Snapshot.GetServerInfo().GetName() != "V0M3 Sources" || r.Snapshot.GetProtocolVersion() == "" {
		t.Errorf("snapshot server info %v protocol %q", r.Snapshot.GetServerInfo(), r.Snapshot.GetProtocolVersion())
	}
	uris := map[string]bool{}
	for _, res := range r.Snapshot.GetResources() {
		uris[res.GetUri()] = true
	}
	if !uris[scenario.MigrationFAQURI] || !uris[scenario.MigrationGuideURI] {
		t.Errorf("snapshot resources %v lack the notes", uris)
	}

	// Offered catalogue per task kind.
	if got := offeredNames(r.SourceTask.GetCatalogue()); strings.Join(got, ",") != scenario.Retrieve {
		t.Errorf("source-review task offered %v, want exactly [%s]", got, scenario.Retrieve)
	}
	if got := offeredNames(r.RewriteTask.GetCatalogue()); len(got) != 0 {
		t.Errorf("rewrite task with evidence present offered %v, want none", got)
	}
	if e := considered(r.RewriteTask.GetCatalogue(), scenario.Retrieve); e.GetReason() != policyv1.NotOfferedReason_NOT_OFFERED_REASON_NOT_NEEDED {
		t.Errorf("rewrite task: %s not offered because %v, want NOT_NEEDED", scenario.Retrieve, e.GetReason())
	}
	if e := considered(r.SourceTask.GetCatalogue(), scenario.Deliver); e.GetStage() == policyv1.EligibilityStage_ELIGIBILITY_STAGE_OFFERED || e.GetReason() == policyv1.NotOfferedReason_NOT_OFFERED_REASON_UNSPECIFIED {
		t.Errorf("source task: %s considered as %v/%v, want not offered with a reason", scenario.Deliver, e.GetStage(), e.GetReason())
	}
	// The model sees opaque handles, never the source URIs.
	catJSON, _ := protojson.Marshal(r.SourceTask.GetCatalogue())
	if strings.Contains(string(catJSON), "v0m3-sources://") {
		t.Errorf("catalogue leaks a source URI: %s", catJSON)
	}
	if h := scenario.FindHandle(scenario.FindOffered(r.SourceTask.GetCatalogue(), scenario.Retrieve), "Migration FAQ"); h == "" {
		t.Error("no handle for the Migration FAQ")
	}

	// Unknown argument field.
	if !apierror.Is(r.UnknownField, codes.InvalidArgument, "UNKNOWN_ARGUMENT_FIELD") {
		t.Errorf("unknown field: got %v, want INVALID_ARGUMENT UNKNOWN_ARGUMENT_FIELD", r.UnknownField)
	} else if f := apierror.Fields(r.UnknownField); strings.Join(f, ",") != "arguments.path" {
		t.Errorf("unknown field violations name %v, want [arguments.path]", f)
	}

	// The retrieval executed, was observed, and came back as quoted evidence.
	req := r.Retrieval
	if req.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED || req.GetIntentId() == "" {
		t.Fatalf("retrieval state %v intent %q, want EXECUTED with an intent", req.GetState(), req.GetIntentId())
	}
	obs, err := s.Evidence.ListObservations(ctx, &evidencev1.ListObservationsRequest{TaskId: r.SourceTask.GetTask().GetId()})
	if err != nil {
		t.Fatal(err)
	}
	var faqObs *evidencev1.SourceObservation
	for _, o := range obs.GetObservations() {
		if o.GetResourceUri() == scenario.MigrationFAQURI {
			faqObs = o
		}
	}
	if faqObs == nil {
		t.Fatalf("no observation of %s in %v", scenario.MigrationFAQURI, obs.GetObservations())
	}
	if faqObs.GetConnectionId() != r.Connection.GetId() || faqObs.GetMediaType() != "text/markdown" ||
		!strings.HasPrefix(faqObs.GetContentDigest(), "sha256:") || faqObs.GetRetrieveTime() == nil || faqObs.GetRequestId() == "" {
		t.Errorf("observation lacks identity: %v", faqObs)
	}
	for _, e := range req.GetExcerpts() {
		if strings.Contains(e.GetSourceLabel(), "://") {
			t.Errorf("excerpt label leaks a URI: %q", e.GetSourceLabel())
		}
	}
	if !hostileQuoted(req) {
		t.Errorf("the hostile page's sentence was not returned as quoted evidence: %v", req.GetExcerpts())
	}

	// The hostile page cannot lead to an export.
	if !apierror.Is(r.ExportRefusal, codes.PermissionDenied, "CAPABILITY_NOT_OFFERED") {
		t.Errorf("export in source task: got %v, want PERMISSION_DENIED CAPABILITY_NOT_OFFERED", r.ExportRefusal)
	}
	refusedInTrace := false
	for _, e := range r.SourceTrace.GetEvents() {
		if p := e.GetProduct(); p.GetKind() == evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_REQUEST_REFUSED && p.GetCapability() == scenario.Deliver && p.GetReason() == "CAPABILITY_NOT_OFFERED" {
			refusedInTrace = true
		}
	}
	if !refusedInTrace {
		t.Error("the refused export does not appear in the task trace")
	}
	for _, q := range r.SourceRequests {
		if q.GetCapability() == scenario.Deliver && q.GetState() != orchestratorv1.RequestState_REQUEST_STATE_REFUSED {
			t.Errorf("export request state %v, want REFUSED", q.GetState())
		}
	}

	// A handle copied into another task is refused.
	if !apierror.Is(r.ForeignHandle, codes.PermissionDenied, "HANDLE_TASK_MISMATCH") {
		t.Errorf("foreign handle: got %v, want PERMISSION_DENIED HANDLE_TASK_MISMATCH", r.ForeignHandle)
	}

	// Separation of duties: the integrator, a reviewer too, could not
	// review her own proposal; another reviewer did.
	if !apierror.Is(r.SelfReview, codes.PermissionDenied, "SELF_REVIEW") {
		t.Errorf("self-review: got %v, want PERMISSION_DENIED SELF_REVIEW", r.SelfReview)
	}
	if r.Mapping.GetReviewedBy() != scenario.Reviewer.ID || r.Mapping.GetProposedBy() != scenario.Integrator.ID {
		t.Errorf("mapping proposed by %q, reviewed by %q; want the verified callers %q and %q",
			r.Mapping.GetProposedBy(), r.Mapping.GetReviewedBy(), scenario.Integrator.ID, scenario.Reviewer.ID)
	}
	// The requester is who the token names, and nobody starts a task
	// without one.
	if got := r.SourceTask.GetTask().GetRequester().GetId(); got != scenario.Alice.ID {
		t.Errorf("source task requester %q, want the token's subject %q", got, scenario.Alice.ID)
	}
	if !apierror.Is(r.Anonymous, codes.Unauthenticated, "CREDENTIALS_MISSING") {
		t.Errorf("task without a token: got %v, want UNAUTHENTICATED CREDENTIALS_MISSING", r.Anonymous)
	}
	// Nothing is discovered before the connection's review.
	if !apierror.Is(r.Unreviewed, codes.FailedPrecondition, "CONNECTION_NOT_REVIEWED") {
		t.Errorf("discovery before review: got %v, want FAILED_PRECONDITION CONNECTION_NOT_REVIEWED", r.Unreviewed)
	}
}

func offeredNames(c *orchestratorv1.OfferedCatalogue) []string {
	var out []string
	for _, o := range c.GetOffered() {
		out = append(out, o.GetName())
	}
	return out
}

func considered(c *orchestratorv1.OfferedCatalogue, name string) *policyv1.CapabilityEligibility {
	for _, e := range c.GetConsidered() {
		if e.GetCapability() == name {
			return e
		}
	}
	return nil
}

// TestStateSurvivesRestart stops the whole suite and starts it again on the
// same data directory: every accepted record is still readable.
func TestStateSurvivesRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := context.Background()
	s, err := suite.Start(ctx, suite.Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	r, err := scenario.Run(ctx, s.Clients, scenario.Config{Transport: scenario.StdioFixture(v0m3Bin), As: s.As})
	if err != nil {
		s.Close()
		t.Fatalf("scenario: %v", err)
	}
	task := r.SourceTask.GetTask().GetId()
	before := snapshotState(t, stackOf(s), r)
	s.Close()

	s2 := startSuite(t, dir)
	after := snapshotState(t, stackOf(s2), r)
	for k, v := range before {
		if after[k] != v {
			t.Errorf("after restart %s differs:\nbefore %s\nafter  %s", k, v, after[k])
		}
	}
	// The restarted suite keeps working on the old task: resubmitting the
	// same provider call returns the same intent.
	again, err := s2.Orchestrator.SubmitToolRequest(testkit.As(s2, scenario.Alice), &orchestratorv1.SubmitToolRequestRequest{
		TaskId: task, ProviderCallId: "call-1", Capability: scenario.Retrieve,
		Arguments: r.Retrieval.GetArguments(),
	})
	if err != nil {
		t.Fatalf("resubmit after restart: %v", err)
	}
	if again.GetIntentId() != r.Retrieval.GetIntentId() {
		t.Errorf("resubmitted call has intent %s, want %s", again.GetIntentId(), r.Retrieval.GetIntentId())
	}
}

// snapshotState reads every record the scenario created, as JSON strings.
func snapshotState(t *testing.T, c stack, r *scenario.Result) map[string]string {
	t.Helper()
	// Each record read by who may read it: the platform its registry
	// records, the requester her task, an auditor the evidence.
	ctx := testkit.As(c, scenario.Integrator)
	out := map[string]string{}
	task := r.SourceTask.GetTask().GetId()
	conn, err := c.Registry.GetConnection(ctx, &registryv1.GetConnectionRequest{Id: r.Connection.GetId()})
	out["connection"] = mustJSON(t, conn, err)
	snap, err := c.Registry.GetSnapshot(ctx, &registryv1.GetSnapshotRequest{Id: r.Snapshot.GetId()})
	out["snapshot"] = mustJSON(t, snap, err)
	m, err := c.Registry.GetMapping(ctx, &registryv1.GetMappingRequest{Id: r.Mapping.GetId()})
	out["mapping"] = mustJSON(t, m, err)
	ctx = testkit.As(c, scenario.Alice)
	tk, err := c.Orchestrator.GetTask(ctx, &orchestratorv1.GetTaskRequest{Id: task})
	out["task"] = mustJSON(t, tk, err)
	cat, err := c.Orchestrator.GetCatalogue(ctx, &orchestratorv1.GetCatalogueRequest{TaskId: task})
	out["catalogue"] = mustJSON(t, cat, err)
	req, err := c.Orchestrator.GetRequest(ctx, &orchestratorv1.GetRequestRequest{Id: r.Retrieval.GetId()})
	out["request"] = mustJSON(t, req, err)
	ctx = testkit.As(c, scenario.Auditor)
	obs, err := c.Evidence.ListObservations(ctx, &evidencev1.ListObservationsRequest{TaskId: task})
	out["observations"] = mustJSON(t, obs, err)
	tr, err := c.Evidence.GetTrace(ctx, &evidencev1.GetTraceRequest{TaskId: task})
	out["trace"] = mustJSON(t, tr, err)
	if len(obs.GetObservations()) == 0 || len(tr.GetEvents()) == 0 {
		t.Fatalf("nothing recorded: %d observations, %d trace events", len(obs.GetObservations()), len(tr.GetEvents()))
	}
	return out
}

func mustJSON(t *testing.T, m proto.Message, err error) string {
	t.Helper()
	if err != nil {
		t.Fatalf("read after restart: %v", err)
	}
	b, err := protojson.MarshalOptions{}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestDemoCommand runs `v0m3 demo` as a user would and checks that it
// reports every stage and exits 0.
func TestDemoCommand(t *testing.T) {
	t.Parallel()
	out, err := exec.Command(v0m3Bin, "demo").CombinedOutput()
	if err != nil {
		t.Fatalf("v0m3 demo: %v\n%s", err, out)
	}
	for _, stage := range []string{"== connect ==", "== discovered ==", "== registered ==", "== offered ==", "== requested ==", "== executed ==", "== observed ==", "== refused ==", "CAPABILITY_NOT_OFFERED", "SELF_REVIEW", "CREDENTIALS_MISSING", "demo complete"} {
		if !strings.Contains(string(out), stage) {
			t.Errorf("demo output lacks %q:\n%s", stage, out)
		}
	}
}

// TestDevServesHealth starts `v0m3 dev` on ephemeral ports and checks every
// service answers grpc.health.v1 as SERVING over TLS with the certificate
// of its development CA, and nothing over plaintext.
func TestDevServesHealth(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	dataDir := t.TempDir()
	cmd := exec.CommandContext(ctx, v0m3Bin, "dev", "--port-base", "0", "--data-dir", dataDir)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	// A process that never prints its addresses is killed, which ends
	// the scan, rather than hanging the package.
	scanDeadline := time.AfterFunc(2*time.Minute, cancel)
	addrs := map[string]string{}
	sc := bufio.NewScanner(stdout)
	re := regexp.MustCompile(`^\s+(\w+)\s+(\S+:\d+)$`)
	for sc.Scan() && len(addrs) < len(suite.Names) {
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			addrs[m[1]] = m[2]
		}
	}
	scanDeadline.Stop()
	roots := devRoots(t, dataDir)
	for _, name := range suite.Names {
		addr := addrs[name]
		if addr == "" {
			t.Fatalf("v0m3 dev did not print the %s address", name)
		}
		conn, err := serve.Dial(addr, identity.CallerDialOptions(roots)...)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		conn.Close()
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("%s health: %v %v", name, resp.GetStatus(), err)
		}
		plain, err := serve.Dial(addr, identity.CallerDialOptions(nil)...)
		if err != nil {
			t.Fatal(err)
		}
		resp, err = healthpb.NewHealthClient(plain).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(false))
		plain.Close()
		if err == nil {
			t.Errorf("%s answered health over plaintext (%v); want TLS only", name, resp.GetStatus())
		}
	}
}

// devRoots returns the CA a `v0m3 dev` on dataDir wrote for its callers.
func devRoots(t *testing.T, dataDir string) *x509.CertPool {
	t.Helper()
	pem, err := os.ReadFile(filepath.Join(dataDir, "pki", "ca.crt"))
	if err != nil {
		t.Fatalf("v0m3 dev's CA: %v", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		t.Fatalf("v0m3 dev's CA file holds no certificate")
	}
	return roots
}
