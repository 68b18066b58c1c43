package e2e_test

// The seed's second experiment end to end: a preview renderer (the real
// `v0m3 fixture-renderer` subprocess over stdio) behind the five real
// services, approvals bound to exact consequences, recovery from failures
// at every point of an attempt, a killed orchestrator, and removal.

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	ostore "github.com/v0m3/v0m3/services/orchestrator/store"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/v0m3/v0m3/demo/fixture/renderer"
	"github.com/v0m3/v0m3/demo/scenario"
	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/audit"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/serve"
	"github.com/v0m3/v0m3/internal/store"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/orchestrator"
	"github.com/v0m3/v0m3/suite"
)

const (
	renderPreview  = "render_preview"
	documentDigest = "sha256:document-31"
	previewSummary = "Render preview of document revision 31 using profile 4"
)

// rendererEnv is one renderer connection: its working directory and call
// log, shared by every renderer process the adapter starts for it.
type rendererEnv struct {
	workDir, callLog string
	conn             *registryv1.Connection
	mapping          *registryv1.Mapping
}

// renders counts renders the renderer actually performed.
func (r *rendererEnv) renders(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile(r.callLog)
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var e struct{ Event string }
		if line != "" && json.Unmarshal([]byte(line), &e) == nil && e.Event == "rendered" {
			n++
		}
	}
	return n
}

func (r *rendererEnv) artifacts(t *testing.T) int {
	t.Helper()
	a, err := renderer.Artifacts(r.workDir)
	if err != nil {
		t.Fatal(err)
	}
	return len(a)
}

// connectRenderer registers a renderer connection (stdio subprocess of the
// v0m3 binary), discovers it and maps render_preview onto its render tool,
// as the integrator; the reviewer reviews the connection and the mapping.
func connectRenderer(t *testing.T, c stack, args ...string) *rendererEnv {
	t.Helper()
	ctx := testkit.As(c, scenario.Integrator)
	dir := testkit.WritableDir(t)
	env := &rendererEnv{workDir: filepath.Join(dir, "work"), callLog: filepath.Join(dir, "calls.jsonl")}
	var err error
	env.conn, err = c.Registry.CreateConnection(ctx, &registryv1.CreateConnectionRequest{
		DisplayName: "V0M3 Renderer", Owner: "platform-team",
		Transport: &registryv1.Transport{Kind: &registryv1.Transport_Stdio{Stdio: &registryv1.StdioTransport{
			Command: v0m3Bin,
			Args:    append([]string{"fixture-renderer", "--transport", "stdio", "--work-dir", env.workDir, "--call-log", env.callLog}, args...),
		}}},
		CredentialScope: "local renderer; no credential",
	})
	if err != nil {
		t.Fatalf("create connection: %v", err)
	}
	env.conn, err = c.Registry.ReviewConnection(testkit.As(c, scenario.Reviewer), &registryv1.ReviewConnectionRequest{
		ConnectionId: env.conn.GetId(), ConfigRevision: env.conn.GetConfigRevision(), Approve: true})
	if err != nil {
		t.Fatalf("review connection: %v", err)
	}
	mapRenderer(t, c, env)
	return env
}

// mapRenderer discovers env's connection and maps render_preview onto its
// render tool as the integrator; the reviewer reviews the mapping.
func mapRenderer(t *testing.T, c stack, env *rendererEnv) {
	t.Helper()
	ctx := testkit.As(c, scenario.Integrator)
	snap, err := c.Adapter.Discover(ctx, &adapterv1.DiscoverRequest{ConnectionId: env.conn.GetId()})
	if err != nil {
		t.Fatalf("discover: %v", err)
	}
	m, err := c.Registry.ProposeMapping(ctx, &registryv1.ProposeMappingRequest{
		Capability: renderPreview, ConnectionId: env.conn.GetId(), SnapshotId: snap.GetId(),
		Target: &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: renderer.ToolRender},
		ArgumentMap: []*registryv1.ArgumentBinding{
			{RemoteField: "document_revision", ProductField: "document_revision"},
			{RemoteField: "profile", ProductField: "profile"},
		},
		Limits: &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 4, AllowedMediaTypes: []string{"text/plain"}},
		// The renderer de-duplicates by request id and answers status
		// queries: what makes a retry after a lost reply safe.
		IdempotencyKeyField: "request_id",
		StatusTool:          renderer.ToolStatus,
	})
	if err != nil {
		t.Fatalf("propose mapping: %v", err)
	}
	env.mapping, err = c.Registry.ReviewMapping(testkit.As(c, scenario.Reviewer), &registryv1.ReviewMappingRequest{
		MappingId: m.GetId(), Revision: m.GetRevision(), Approve: true,
	})
	if err != nil {
		t.Fatalf("review mapping: %v", err)
	}
}

// startPreviewTask starts a preview task as alice, an author.
func startPreviewTask(t *testing.T, c stack) *orchestratorv1.StartTaskResponse {
	t.Helper()
	resp, err := c.Orchestrator.StartTask(testkit.As(c, scenario.Alice), &orchestratorv1.StartTaskRequest{
		Profile: "preview", Purpose: "preview revision 31 before review",
	})
	if err != nil {
		t.Fatalf("start preview task: %v", err)
	}
	if got := offeredNames(resp.GetCatalogue()); strings.Join(got, ",") != renderPreview {
		t.Fatalf("preview task offered %v, want [%s]", got, renderPreview)
	}
	return resp
}

// submitPreview submits, as alice, the render of revision 31.
func submitPreview(t *testing.T, c stack, taskID, callID string) *orchestratorv1.ToolRequest {
	t.Helper()
	args, _ := structpb.NewStruct(map[string]any{"document_revision": 31, "profile": 4})
	r, err := c.Orchestrator.SubmitToolRequest(testkit.As(c, scenario.Alice), &orchestratorv1.SubmitToolRequestRequest{
		TaskId: taskID, ProviderCallId: callID, Capability: renderPreview, Arguments: args, DocumentDigest: documentDigest,
	})
	if err != nil || r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_AWAITING_APPROVAL {
		t.Fatalf("submit preview = %v, %v; want AWAITING_APPROVAL (policy requires approval for authors)", r, err)
	}
	return r
}

// approve approves request id as the approver (not alice, whose task it
// is: nobody approves their own request).
func approve(c stack, id, digest string) (*orchestratorv1.ToolRequest, error) {
	return c.Orchestrator.Approve(testkit.As(c, approver), &orchestratorv1.ApproveRequest{RequestId: id, DocumentDigest: digest})
}

// TestPreviewApprovalWatched runs the second experiment through the real
// services and renderer while a product service watches the task.
func TestPreviewApprovalWatched(t *testing.T) {
	t.Parallel()
	s := startSuite(t, t.TempDir())
	c := stackOf(s)
	env := connectRenderer(t, c)
	task := startPreviewTask(t, c).GetTask().GetId()
	// The bound only keeps a regression from hanging the package.
	ctx, cancel := context.WithTimeout(testkit.As(c, scenario.Alice), 2*time.Minute)
	defer cancel()
	stream, err := s.Orchestrator.WatchTask(ctx, &orchestratorv1.WatchTaskRequest{TaskId: task})
	if err != nil {
		t.Fatal(err)
	}

	r := submitPreview(t, c, task, "call-1")
	ap, err := s.Orchestrator.GetApproval(testkit.As(c, approver), &orchestratorv1.GetApprovalRequest{RequestId: r.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	if ap.GetSummary() != previewSummary || ap.GetDocumentDigest() != documentDigest || ap.GetMappingId() != env.mapping.GetId() ||
		ap.GetConfigRevision() != env.conn.GetConfigRevision() || !strings.HasPrefix(ap.GetPolicyRevision(), "sha256:") {
		t.Errorf("approval = %v", ap)
	}
	if env.renders(t) != 0 {
		t.Fatal("rendered before approval")
	}
	// Separation of duties: alice may not approve her own request. The
	// refusal is traced, and the request still awaits a person.
	_, err = s.Orchestrator.Approve(testkit.As(c, scenario.Alice), &orchestratorv1.ApproveRequest{RequestId: r.GetId(), DocumentDigest: documentDigest})
	if !apierror.Is(err, codes.PermissionDenied, "SELF_APPROVAL") {
		t.Fatalf("alice approving her own request = %v, want PERMISSION_DENIED SELF_APPROVAL", err)
	}
	if got, err := s.Orchestrator.GetRequest(testkit.As(c, scenario.Alice), &orchestratorv1.GetRequestRequest{Id: r.GetId()}); err != nil ||
		got.GetState() != orchestratorv1.RequestState_REQUEST_STATE_AWAITING_APPROVAL || got.GetApproval().GetUseTime() != nil {
		t.Fatalf("after the refused self-approval the request is %v (%v), want AWAITING_APPROVAL with its approval unused", got, err)
	}
	if env.renders(t) != 0 {
		t.Fatal("a refused self-approval rendered")
	}
	if !traced(t, c, task, evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_POLICY_DECISION, "SELF_APPROVAL") {
		t.Error("the refused self-approval is not in the task's trace")
	}
	done, err := approve(c, r.GetId(), documentDigest)
	if err != nil || done.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED || !strings.HasPrefix(done.GetArtifactDigest(), "sha256:") {
		t.Fatalf("approve = %v, %v", done, err)
	}
	if done.GetApproval().GetApprover() != approver.ID {
		t.Errorf("approval recorded approver %q, want the verified caller %q", done.GetApproval().GetApprover(), approver.ID)
	}
	rc, err := receiptOf(t, s, r.GetIntentId())
	if err != nil || rc.GetArtifactDigest() != done.GetArtifactDigest() || rc.GetId() != done.GetReceiptId() {
		t.Errorf("receipt = %v, %v", rc, err)
	}
	att := done.GetAttempts()[0]
	if len(done.GetAttempts()) != 1 || att.GetStage() != adapterv1.DeliveryStage_DELIVERY_STAGE_COMMITTED || att.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
		t.Errorf("attempts = %v", done.GetAttempts())
	}
	// The approver's retry (as after a lost reply) replays the executed
	// request; another approver learns the approval was used.
	if again, err := approve(c, r.GetId(), documentDigest); err != nil || again.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED || again.GetReceiptId() != done.GetReceiptId() {
		t.Errorf("the approver's retry = %v, %v; want the executed request replayed", again, err)
	}
	other := scenario.Person{ID: "second-approver@platform", Groups: []string{"approvers"}}
	_, err = s.Orchestrator.Approve(testkit.As(c, other), &orchestratorv1.ApproveRequest{RequestId: r.GetId(), DocumentDigest: documentDigest})
	if !apierror.Is(err, codes.FailedPrecondition, "APPROVAL_ALREADY_USED") {
		t.Errorf("another approver's approval = %v, want APPROVAL_ALREADY_USED", err)
	}
	if env.renders(t) != 1 || env.artifacts(t) != 1 {
		t.Errorf("renders %d, artifacts %d; want 1 each", env.renders(t), env.artifacts(t))
	}

	// The watcher saw the flow in order, with the review surface in
	// product terms.
	want := []string{"task.started", "catalogue.offered", "request.received", "request.awaiting_approval", "request.approved", "request.executed"}
	var got []string
	for len(got) < len(want) {
		ev, err := stream.Recv()
		if err != nil {
			t.Fatalf("watch: %v after %v", err, got)
		}
		got = append(got, ev.GetType())
		if ev.GetType() == "request.awaiting_approval" && ev.GetDetail() != previewSummary {
			t.Errorf("awaiting approval detail = %q", ev.GetDetail())
		}
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("watched %v, want %v", got, want)
	}
}

// receiptOf reads the receipt recorded under an intent's key as the
// orchestrator, its only reader.
func receiptOf(t *testing.T, s *suite.Suite, intentID string) (*evidencev1.Receipt, error) {
	t.Helper()
	peer, err := s.PeerClients(suite.Orchestrator)
	if err != nil {
		t.Fatal(err)
	}
	return peer.Evidence.GetReceipt(context.Background(), &evidencev1.GetReceiptRequest{IdempotencyKey: intentID})
}

// traced reports whether task's trace, read by an auditor, holds a product
// event of kind with reason.
func traced(t *testing.T, c stack, task string, kind evidencev1.ProductEventKind, reason string) bool {
	t.Helper()
	tr, err := c.Evidence.GetTrace(testkit.As(c, scenario.Auditor), &evidencev1.GetTraceRequest{TaskId: task})
	if err != nil {
		t.Fatalf("trace of %s: %v", task, err)
	}
	for _, e := range tr.GetEvents() {
		if p := e.GetProduct(); p.GetKind() == kind && p.GetReason() == reason {
			return true
		}
	}
	return false
}

// TestPreviewApprovalInvalidatedByRealChanges changes a document and then
// rotates the renderer's credentials between review and approval.
func TestPreviewApprovalInvalidatedByRealChanges(t *testing.T) {
	t.Parallel()
	s := startSuite(t, t.TempDir())
	c := stackOf(s)
	env := connectRenderer(t, c)
	task := startPreviewTask(t, c).GetTask().GetId()

	r := submitPreview(t, c, task, "call-doc")
	_, err := approve(c, r.GetId(), "sha256:document-31-edited")
	if !apierror.Is(err, codes.FailedPrecondition, "APPROVAL_INVALIDATED") || apierror.Info(err).GetMetadata()["binding"] != "document" {
		t.Errorf("document changed: %v", err)
	}

	r = submitPreview(t, c, task, "call-creds")
	if _, err := s.Registry.UpdateConnection(testkit.As(c, scenario.Integrator), &registryv1.UpdateConnectionRequest{
		Id: env.conn.GetId(), ExpectedConfigRevision: env.conn.GetConfigRevision(), Transport: env.conn.GetTransport(),
		CredentialVersion: "2", Reason: "rotate",
	}); err != nil {
		t.Fatal(err)
	}
	_, err = approve(c, r.GetId(), documentDigest)
	if !apierror.Is(err, codes.FailedPrecondition, "APPROVAL_INVALIDATED") || apierror.Info(err).GetMetadata()["binding"] != "credentials" {
		t.Errorf("credentials rotated: %v", err)
	}
	if env.renders(t) != 0 {
		t.Errorf("an invalidated approval rendered %d times", env.renders(t))
	}
}

// startWithOrchestrator runs registry, policy, evidence and adapter as a
// suite and the orchestrator in-process with its own options.
func startWithOrchestrator(t *testing.T, deps orchestrator.Deps) stack {
	t.Helper()
	dir := t.TempDir()
	s, err := suite.Start(context.Background(), suite.Config{DataDir: dir, Services: []string{suite.Registry, suite.Policy, suite.Evidence, suite.Adapter}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	db, err := store.Open(filepath.Join(dir, "orchestrator.db"))
	if err != nil {
		t.Fatal(err)
	}
	peers, err := s.PeerClients(suite.Orchestrator)
	if err != nil {
		t.Fatal(err)
	}
	guard, err := s.Guard(suite.Orchestrator, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	deps.Registry, deps.Policy, deps.Adapter, deps.Evidence = peers.Registry, peers.Policy, peers.Adapter, peers.Evidence
	// Its own certificate signs the execution grants the adapter requires.
	deps.Credentials = guard.Creds
	o := orchestrator.NewServer(ostore.NewBoltStore(db), deps, slog.New(slog.DiscardHandler))
	// Privileged calls are audited in evidence, as the suite's own
	// orchestrator does.
	srv := serve.New(suite.Orchestrator, slog.New(slog.DiscardHandler), guard,
		grpc.ChainUnaryInterceptor(audit.UnaryServer(audit.New(peers.Evidence, suite.Orchestrator, nil, slog.New(slog.DiscardHandler)))))
	orchestratorv1.RegisterOrchestratorServiceServer(srv.GRPC, o)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = srv.Serve(ctx, lis); close(done) }()
	conn, err := serve.Dial(lis.Addr().String(), s.CallerDialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(); cancel(); <-done; o.Close(); _ = db.Close() })
	c := stackOf(s)
	c.Orchestrator = orchestratorv1.NewOrchestratorServiceClient(conn)
	return c
}

// TestRendererFaults: a renderer that fails before the request reaches it,
// one that dies after committing the artifact and before replying, and
// one that replies after the client has gone; each ends in the right
// outcome, and none renders twice.
func TestRendererFaults(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		args     []string
		state    orchestratorv1.RequestState
		outcome  adapterv1.Outcome
		attempts int
		renders  int
		resolved string // in the last attempt's resolution
		// timeout bounds each attempt. The renderer that replies late
		// needs it below its 4 s delay; the one that is down needs room
		// for the adapter's connect retries on a loaded machine, which
		// the outcome does not depend on.
		timeout time.Duration
	}{
		{"down before the request reaches it", []string{"--down-if-exists", "DOWN"}, orchestratorv1.RequestState_REQUEST_STATE_FAILED,
			adapterv1.Outcome_OUTCOME_UNAVAILABLE, 2, 0, "no automatic attempt left", 20 * time.Second},
		{"dies after committing the artifact", []string{"--mode", renderer.ModeCrashAfterRender}, orchestratorv1.RequestState_REQUEST_STATE_EXECUTED,
			adapterv1.Outcome_OUTCOME_OK, 1, 1, "server's status", 2 * time.Second},
		{"replies after the client has gone", []string{"--delay", "4s"}, orchestratorv1.RequestState_REQUEST_STATE_EXECUTED,
			adapterv1.Outcome_OUTCOME_OK, 1, 1, "server's status", 2 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := startWithOrchestrator(t, orchestrator.Deps{AttemptTimeout: tc.timeout})
			down := filepath.Join(testkit.WritableDir(t), "down")
			args := append([]string(nil), tc.args...)
			for i, a := range args {
				if a == "DOWN" {
					args[i] = down
				}
			}
			env := connectRenderer(t, c, args...)
			// Discovered and mapped while healthy; from now on a renderer
			// with --down-if-exists exits before reading any request.
			if err := os.WriteFile(down, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			task := startPreviewTask(t, c).GetTask().GetId()
			r := submitPreview(t, c, task, "call-1")
			got, err := approve(c, r.GetId(), documentDigest)
			if err != nil {
				t.Fatalf("approve: %v", err)
			}
			last := got.GetAttempts()[len(got.GetAttempts())-1]
			if got.GetState() != tc.state || got.GetOutcome() != tc.outcome || len(got.GetAttempts()) != tc.attempts || !strings.Contains(last.GetResolution(), tc.resolved) {
				t.Errorf("request = %v", got)
			}
			if env.renders(t) != tc.renders || env.artifacts(t) != tc.renders {
				t.Errorf("renders %d, artifacts %d; want %d", env.renders(t), env.artifacts(t), tc.renders)
			}
			if tc.renders == 1 && got.GetArtifactDigest() == "" {
				t.Error("executed without an artifact digest")
			}
		})
	}
}

// startOrchestratorProcess runs `v0m3 orchestrator` against the suite's
// services, on dataDir, listening on addr, with the orchestrator
// certificate in tls and accepting the suite's development tokens.
func startOrchestratorProcess(t *testing.T, s *suite.Suite, tls identity.Files, dataDir, addr string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(v0m3Bin, "orchestrator", "--listen", addr, "--data-dir", dataDir, "--log-level", "warn",
		"--registry-addr", s.Addr[suite.Registry], "--policy-addr", s.Addr[suite.Policy],
		"--evidence-addr", s.Addr[suite.Evidence], "--adapter-addr", s.Addr[suite.Adapter],
		"--tls-ca-file", tls.CA, "--tls-cert-file", tls.Cert, "--tls-key-file", tls.Key,
		"--oidc-issuer", identity.DevIssuerName, "--oidc-audience", identity.DevAudience, "--oidc-jwks-file", s.Dev.JWKSFile)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

// TestOrchestratorKilledMidAttempt kills the orchestrator process while a
// render is in flight (the artifact is durable, the renderer holds its
// reply), restarts it on the same data directory, and checks that it
// recovers from the last persisted stage with no second render.
func TestOrchestratorKilledMidAttempt(t *testing.T) {
	t.Parallel()
	s, err := suite.Start(context.Background(), suite.Config{DataDir: t.TempDir(), Services: []string{suite.Registry, suite.Policy, suite.Evidence, suite.Adapter}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	tls, err := s.Dev.CA.WriteFiles(t.TempDir(), suite.Orchestrator)
	if err != nil {
		t.Fatal(err)
	}
	dataDir, addr := t.TempDir(), testkit.FreeLoopbackAddr(t)
	first := startOrchestratorProcess(t, s, tls, dataDir, addr)
	conn, err := serve.Dial(addr, s.CallerDialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := stackOf(s)
	c.Orchestrator = orchestratorv1.NewOrchestratorServiceClient(conn)
	waitServing(t, c)

	env := connectRenderer(t, c, "--delay", "60s")
	task := startPreviewTask(t, c).GetTask().GetId()
	r := submitPreview(t, c, task, "call-1")
	approved := make(chan error, 1)
	go func() { _, err := approve(c, r.GetId(), documentDigest); approved <- err }()
	testkit.Eventually(t, "the render starts", func() bool {
		if env.renders(t) > 0 {
			return true
		}
		select {
		case err := <-approved:
			t.Fatalf("approval returned before the render was held open: %v", err)
		default:
		}
		return false
	})
	// The artifact is durable; the reply is held. Kill mid-attempt.
	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()
	select {
	case <-approved:
	case <-time.After(time.Minute):
		t.Fatal("the approval call never ended after its orchestrator was killed")
	}
	startOrchestratorProcess(t, s, tls, dataDir, addr)
	waitServing(t, c)

	var got *orchestratorv1.ToolRequest
	testkit.EventuallyWithin(t, 2*time.Minute, "the restarted orchestrator recovers the request to EXECUTED", func() bool {
		got, err = c.Orchestrator.GetRequest(testkit.As(c, scenario.Alice), &orchestratorv1.GetRequestRequest{Id: r.GetId()})
		if err != nil && apierror.Code(err) != codes.Unavailable {
			t.Fatal(err)
		}
		if got.GetState() == orchestratorv1.RequestState_REQUEST_STATE_FAILED {
			t.Fatalf("recovered request failed: %v", got)
		}
		return got.GetState() == orchestratorv1.RequestState_REQUEST_STATE_EXECUTED
	})
	att := got.GetAttempts()[0]
	if len(got.GetAttempts()) != 1 || att.GetStage() != adapterv1.DeliveryStage_DELIVERY_STAGE_COMMITTED ||
		!strings.Contains(att.GetResolution(), "recovered") || got.GetReceiptId() == "" {
		t.Errorf("recovered request = %v", got)
	}
	if env.renders(t) != 1 || env.artifacts(t) != 1 {
		t.Errorf("renders %d, artifacts %d after restart; want exactly 1", env.renders(t), env.artifacts(t))
	}
}

// waitServing waits until the orchestrator answers an authenticated caller.
func waitServing(t *testing.T, c stack) {
	t.Helper()
	testkit.EventuallySucceeds(t, "the orchestrator serves (NOT_FOUND for a task nobody started)", func() error {
		_, err := c.Orchestrator.GetTask(testkit.As(c, scenario.Alice), &orchestratorv1.GetTaskRequest{Id: "task_probe"})
		if apierror.Code(err) == codes.NotFound {
			return nil
		}
		return fmt.Errorf("orchestrator not serving: %v", err)
	})
}

// TestRetiringRendererStopsTaskInFlight retires the renderer connection
// through the real registry while one preview is committed and another
// waits for approval.
func TestRetiringRendererStopsTaskInFlight(t *testing.T) {
	t.Parallel()
	s := startSuite(t, t.TempDir())
	c := stackOf(s)
	env := connectRenderer(t, c)
	task := startPreviewTask(t, c).GetTask().GetId()
	// The bound only keeps a regression from hanging the package.
	ctx, cancel := context.WithTimeout(testkit.As(c, scenario.Alice), 2*time.Minute)
	defer cancel()
	stream, err := s.Orchestrator.WatchTask(ctx, &orchestratorv1.WatchTaskRequest{TaskId: task})
	if err != nil {
		t.Fatal(err)
	}
	first := submitPreview(t, c, task, "call-1")
	committed, err := approve(c, first.GetId(), documentDigest)
	if err != nil || committed.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
		t.Fatalf("approve = %v, %v", committed, err)
	}
	pending := submitPreview(t, c, task, "call-2")

	if _, err := s.Registry.RetireConnection(testkit.As(c, scenario.Integrator), &registryv1.RetireConnectionRequest{Id: env.conn.GetId(), Reason: "renderer removed"}); err != nil {
		t.Fatal(err)
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			t.Fatalf("watch: %v", err)
		}
		if ev.GetType() == "task.connection_unavailable" {
			break
		}
	}
	tk, err := s.Orchestrator.GetTask(ctx, &orchestratorv1.GetTaskRequest{Id: task})
	if err != nil || tk.GetState() != orchestratorv1.TaskState_TASK_STATE_CONNECTION_UNAVAILABLE || !strings.Contains(tk.GetCheckpoint(), first.GetId()) {
		t.Errorf("task = %v, %v", tk, err)
	}
	p, _ := s.Orchestrator.GetRequest(ctx, &orchestratorv1.GetRequestRequest{Id: pending.GetId()})
	if p.GetState() != orchestratorv1.RequestState_REQUEST_STATE_REFUSED || p.GetRefusalReason() != "CONNECTION_UNAVAILABLE" {
		t.Errorf("pending request = %v", p)
	}
	if _, err := approve(c, pending.GetId(), documentDigest); !apierror.Is(err, codes.FailedPrecondition, "REQUEST_NOT_AWAITING_APPROVAL") {
		t.Errorf("approving after removal = %v", err)
	}
	// Accepted results, receipts and traces stay readable.
	got, err := s.Orchestrator.GetRequest(ctx, &orchestratorv1.GetRequestRequest{Id: first.GetId()})
	if err != nil || got.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED || got.GetArtifactDigest() == "" {
		t.Errorf("committed request after removal = %v, %v", got, err)
	}
	if rc, err := receiptOf(t, s, first.GetIntentId()); err != nil || rc.GetArtifactDigest() != got.GetArtifactDigest() {
		t.Errorf("receipt after removal = %v, %v", rc, err)
	}
	tr, err := s.Evidence.GetTrace(testkit.As(c, scenario.Auditor), &evidencev1.GetTraceRequest{TaskId: task})
	if err != nil || len(tr.GetEvents()) == 0 {
		t.Errorf("trace after removal = %v, %v", tr, err)
	}
	if env.renders(t) != 1 {
		t.Errorf("renders = %d", env.renders(t))
	}
}
