package e2e_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/demo/scenario"
	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/testkit"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/suite"
)

// TestRotationWithinScope rotates a connection's credential through the
// registry, keeping its declared scope, while an approval waits: the
// approval bound to the old config revision is refused naming the
// credentials binding and renders nothing, the mapping stays active, and
// a governed call submitted after the rotation is approved and executes
// on the new revision without anyone reviewing the mapping again. A second
// rotation that broadens the declared scope sends the mapping to review.
func TestRotationWithinScope(t *testing.T) {
	t.Parallel()
	s := startSuite(t, t.TempDir())
	c := stackOf(s)
	env := connectRendererWithCredential(t, s, "token-1")
	task := startPreviewTask(t, c).GetTask().GetId()
	// A rotation is a new version of the same reference: the file in
	// the connection's credential directory is replaced.
	rotate := func(rev int64, scope, token string) (*registryv1.Connection, error) {
		t.Helper()
		writeCredential(t, s, env.conn.GetId(), token)
		return s.Registry.UpdateConnection(testkit.As(c, scenario.Integrator), &registryv1.UpdateConnectionRequest{
			Id: env.conn.GetId(), ExpectedConfigRevision: rev, Transport: env.conn.GetTransport(),
			CredentialScope: scope, CredentialRef: "file:token", CredentialVersion: token, Reason: "credential rotation",
		})
	}
	mappingState := func() registryv1.MappingState {
		t.Helper()
		m, err := s.Registry.GetMapping(testkit.As(c, scenario.Integrator), &registryv1.GetMappingRequest{Id: env.mapping.GetId()})
		if err != nil {
			t.Fatal(err)
		}
		return m.GetState()
	}

	waiting := submitPreview(t, c, task, "call-before")
	rotated, err := rotate(env.conn.GetConfigRevision(), env.conn.GetCredentialScope(), "token-2")
	if err != nil {
		t.Fatalf("rotate within scope: %v", err)
	}
	if rotated.GetConfigRevision() != env.conn.GetConfigRevision()+1 || rotated.GetReviewState() != registryv1.ReviewState_REVIEW_STATE_APPROVED {
		t.Fatalf("after rotation: revision %d %v; want a new revision, still approved", rotated.GetConfigRevision(), rotated.GetReviewState())
	}

	_, err = approve(c, waiting.GetId(), documentDigest)
	if !apierror.Is(err, codes.FailedPrecondition, "APPROVAL_INVALIDATED") || apierror.Info(err).GetMetadata()["binding"] != "credentials" {
		t.Fatalf("approving a request reviewed under the old revision: %v; want APPROVAL_INVALIDATED naming credentials", err)
	}
	if n := env.renders(t); n != 0 {
		t.Fatalf("an invalidated approval rendered %d times", n)
	}
	if st := mappingState(); st != registryv1.MappingState_MAPPING_STATE_ACTIVE {
		t.Fatalf("mapping after a rotation within scope is %v, want ACTIVE", st)
	}

	after := submitPreview(t, c, task, "call-after")
	done, err := approve(c, after.GetId(), documentDigest)
	if err != nil || done.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
		t.Fatalf("governed call after the rotation: %v, %v; want EXECUTED", done.GetState(), err)
	}
	if n := env.renders(t); n != 1 {
		t.Errorf("renders after the rotation = %d, want 1", n)
	}

	broadened, err := rotate(rotated.GetConfigRevision(), "local renderer; may publish previews", "token-3")
	if err != nil {
		t.Fatalf("rotate with a broader scope: %v", err)
	}
	if st := mappingState(); st != registryv1.MappingState_MAPPING_STATE_REVIEW_REQUIRED {
		t.Fatalf("mapping after the declared scope changed is %v, want REVIEW_REQUIRED", st)
	}
	r, err := s.Orchestrator.SubmitToolRequest(testkit.As(c, scenario.Alice), &orchestratorv1.SubmitToolRequestRequest{
		TaskId: task, ProviderCallId: "call-broadened", Capability: renderPreview, Arguments: after.GetArguments(), DocumentDigest: documentDigest,
	})
	if !apierror.Is(err, codes.FailedPrecondition, "MAPPING_REVIEW_REQUIRED") {
		t.Errorf("submit at revision %d after a scope change = %v, %v; want MAPPING_REVIEW_REQUIRED", broadened.GetConfigRevision(), r.GetState(), err)
	}
	if n := env.renders(t); n != 1 {
		t.Errorf("renders after the scope change = %d, want still 1", n)
	}
}

// TestGovernedReadsContinueThroughRotations makes governed retrievals
// through the orchestrator without pause while the connection's credential
// is rotated, within its declared scope, again and again: no read fails,
// and the mapping is active throughout.
func TestGovernedReadsContinueThroughRotations(t *testing.T) {
	t.Parallel()
	w := newHTTPWorld(t)
	// The connection gets its credential: a new reference, so reviewed
	// (and the mapping with it) before anything reads it.
	writeCredential(t, w.s, w.conn.GetId(), "token-start")
	conn, err := w.s.Registry.UpdateConnection(testkit.As(w.s, scenario.Integrator), &registryv1.UpdateConnectionRequest{
		Id: w.conn.GetId(), ExpectedConfigRevision: w.conn.GetConfigRevision(), Transport: w.conn.GetTransport(),
		CredentialScope: w.conn.GetCredentialScope(), CredentialRef: "file:token", CredentialVersion: "start", Reason: "credential added",
	})
	if err != nil {
		t.Fatal(err)
	}
	if w.conn, err = w.s.ApproveConnection(testkit.As(w.s, scenario.Integrator), conn); err != nil {
		t.Fatal(err)
	}
	w.snap = w.discover()
	w.mapping = w.review(w.propose(w.mapping.GetId(), w.snap, "search", "query"))
	task := w.startTask()

	stop := make(chan struct{})
	// halt tells the reader to stop, once: after the rotations, or when
	// the test fails waiting for a read.
	var halting sync.Once
	halt := func() { halting.Do(func() { close(stop) }) }
	t.Cleanup(halt)
	// succeeded counts reads as they succeed, so each rotation waits for a
	// read after the previous one instead of guessing how long one takes.
	var succeeded atomic.Int64
	type result struct{ ok, failed int }
	done := make(chan result, 1)
	go func() {
		var r result
		for i := 0; ; i++ {
			select {
			case <-stop:
				done <- r
				return
			default:
			}
			got, err := w.retrieve(task, fmt.Sprintf("call-%d", i))
			if err != nil || got.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
				r.failed++
				t.Errorf("read %d during rotation: %v %v (%s)", i, got.GetState(), err, got.GetRefusalDetail())
				continue
			}
			r.ok++
			succeeded.Add(1)
		}
	}()

	conn = w.conn
	const rotations = 6
	for i := range rotations {
		before := succeeded.Load()
		writeCredential(t, w.s, conn.GetId(), fmt.Sprintf("token-%d", i))
		var err error
		conn, err = w.s.Registry.UpdateConnection(testkit.As(w.s, scenario.Integrator), &registryv1.UpdateConnectionRequest{
			Id: conn.GetId(), ExpectedConfigRevision: conn.GetConfigRevision(), Transport: conn.GetTransport(),
			CredentialScope: conn.GetCredentialScope(), CredentialRef: "file:token", CredentialVersion: fmt.Sprint(i), Reason: "credential rotation",
		})
		if err != nil {
			t.Fatalf("rotation %d: %v", i, err)
		}
		// A read completes after each rotation before the next one, so
		// reads keep crossing rotations whatever the machine's speed.
		testkit.EventuallyWithin(t, 2*time.Minute, fmt.Sprintf("a governed read succeeds after rotation %d", i), func() bool { return succeeded.Load() != before })
	}
	halt()
	var r result
	select {
	case r = <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("the reader did not stop within 2 minutes of being told to")
	}
	if r.failed != 0 {
		t.Errorf("%d reads succeeded and %d failed across %d rotations; want none failed", r.ok, r.failed, rotations)
	}
	if st := w.mappingNow().GetState(); st != registryv1.MappingState_MAPPING_STATE_ACTIVE {
		t.Errorf("mapping after %d rotations is %v, want ACTIVE", rotations, st)
	}
}

// TestApprovalsFollowServingRevision rotates a connection's credential the
// way the operator does (keep_serving: the new revision serves once its
// workload rolled out) while approvals wait. An approval given while the
// previous revision still serves is valid and executes on it; once the
// operator reports the rollout, an approval bound to the previous revision
// is refused naming the credentials binding and renders nothing, the
// mapping stays active, and a new request executes at the new revision.
func TestApprovalsFollowServingRevision(t *testing.T) {
	t.Parallel()
	s := startSuite(t, t.TempDir())
	c := stackOf(s)
	env := connectRenderer(t, c)
	task := startPreviewTask(t, c).GetTask().GetId()
	operator, err := s.PeerClients(identity.Operator)
	if err != nil {
		t.Fatal(err)
	}

	before := submitPreview(t, c, task, "call-before")
	rotated, err := s.Registry.UpdateConnection(testkit.As(c, scenario.Integrator), &registryv1.UpdateConnectionRequest{
		Id: env.conn.GetId(), ExpectedConfigRevision: env.conn.GetConfigRevision(), Transport: env.conn.GetTransport(),
		CredentialScope: env.conn.GetCredentialScope(), CredentialVersion: "secret@2", Reason: "credential rotation", KeepServing: true,
	})
	if err != nil {
		t.Fatalf("rotate keeping the serving revision: %v", err)
	}
	if rotated.GetConfigRevision() != 2 || rotated.GetServingConfigRevision() != 1 {
		t.Fatalf("after the rotation: latest %d serving %d; want 2, 1", rotated.GetConfigRevision(), rotated.GetServingConfigRevision())
	}
	done, err := approve(c, before.GetId(), documentDigest)
	if err != nil || done.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
		t.Fatalf("approval while revision 1 still serves: %v, %v; want EXECUTED", done.GetState(), err)
	}
	if n := env.renders(t); n != 1 {
		t.Fatalf("renders = %d, want 1", n)
	}

	waiting := submitPreview(t, c, task, "call-waiting")
	if _, err := operator.Registry.ReportRollout(context.Background(), &registryv1.ReportRolloutRequest{
		Id: env.conn.GetId(), ConfigRevision: 2, Ready: true}); err != nil {
		t.Fatalf("report the rollout: %v", err)
	}
	_, err = approve(c, waiting.GetId(), documentDigest)
	if !apierror.Is(err, codes.FailedPrecondition, "APPROVAL_INVALIDATED") || apierror.Info(err).GetMetadata()["binding"] != "credentials" {
		t.Fatalf("approving a request bound to revision 1 once revision 2 serves: %v; want APPROVAL_INVALIDATED naming credentials", err)
	}
	if n := env.renders(t); n != 1 {
		t.Fatalf("an invalidated approval rendered: renders = %d, want still 1", n)
	}
	m, err := s.Registry.GetMapping(testkit.As(c, scenario.Integrator), &registryv1.GetMappingRequest{Id: env.mapping.GetId()})
	if err != nil || m.GetState() != registryv1.MappingState_MAPPING_STATE_ACTIVE {
		t.Fatalf("mapping after the rotation: %v, %v; want ACTIVE", m.GetState(), err)
	}

	after := submitPreview(t, c, task, "call-after")
	if after.GetApproval().GetConfigRevision() != 2 {
		t.Errorf("a request after the rollout asks an approval bound to revision %d, want 2", after.GetApproval().GetConfigRevision())
	}
	done, err = approve(c, after.GetId(), documentDigest)
	if err != nil || done.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
		t.Fatalf("governed call at revision 2: %v, %v; want EXECUTED", done.GetState(), err)
	}
}

// writeCredential replaces the file "token" in connection id's credential
// directory under s's adapter's credential root (what "file:token" names),
// atomically, as a mounted Secret's update does.
func writeCredential(t *testing.T, s *suite.Suite, id, value string) {
	t.Helper()
	dir := s.CredentialDir(id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, ".token.tmp")
	if err := os.WriteFile(tmp, []byte(value+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "token")); err != nil {
		t.Fatal(err)
	}
}

// connectRendererWithCredential is connectRenderer for a connection
// whose credential is "file:token" in its credential directory, holding
// token, approved with it.
func connectRendererWithCredential(t *testing.T, s *suite.Suite, token string) *rendererEnv {
	t.Helper()
	c := stackOf(s)
	dir := testkit.WritableDir(t)
	env := &rendererEnv{workDir: filepath.Join(dir, "work"), callLog: filepath.Join(dir, "calls.jsonl")}
	var err error
	env.conn, err = c.Registry.CreateConnection(testkit.As(c, scenario.Integrator), &registryv1.CreateConnectionRequest{
		DisplayName: "V0M3 Renderer", Owner: "platform-team",
		Transport: &registryv1.Transport{Kind: &registryv1.Transport_Stdio{Stdio: &registryv1.StdioTransport{
			Command: v0m3Bin,
			Args:    []string{"fixture-renderer", "--transport", "stdio", "--work-dir", env.workDir, "--call-log", env.callLog},
		}}},
		CredentialScope: "local renderer; no credential", CredentialRef: "file:token", CredentialVersion: token,
	})
	if err != nil {
		t.Fatalf("create connection: %v", err)
	}
	writeCredential(t, s, env.conn.GetId(), token)
	env.conn, err = c.Registry.ReviewConnection(testkit.As(c, scenario.Reviewer), &registryv1.ReviewConnectionRequest{
		ConnectionId: env.conn.GetId(), ConfigRevision: env.conn.GetConfigRevision(), Approve: true})
	if err != nil {
		t.Fatalf("review connection: %v", err)
	}
	mapRenderer(t, c, env)
	return env
}
