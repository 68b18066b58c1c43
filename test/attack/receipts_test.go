package attack_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/demo/scenario"
	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/identity/identitytest"
	"github.com/v0m3/v0m3/internal/ids"
	"github.com/v0m3/v0m3/internal/receipt"
	"github.com/v0m3/v0m3/internal/serve"
	"github.com/v0m3/v0m3/internal/testkit"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	"github.com/v0m3/v0m3/suite"
)

const (
	forgedDigest   = "sha256:FORGED0000000000000000000000000000000000000000000000000000000000"
	documentDigest = "sha256:document-31"
)

// startOrchestratorProcess runs `v0m3 orchestrator` on dataDir and addr
// against the suite's services, with the orchestrator certificate the
// suite issued and the suite's development token issuer.
func startOrchestratorProcess(t *testing.T, s *suite.Suite, dataDir, addr string) *exec.Cmd {
	t.Helper()
	if _, err := s.Credentials(suite.Orchestrator); err != nil { // writes its files
		t.Fatal(err)
	}
	pki := filepath.Join(s.Dev.Dir, suite.Orchestrator)
	cmd := exec.Command(v0m3Bin, "orchestrator", "--listen", addr, "--data-dir", dataDir, "--log-level", "warn",
		"--registry-addr", s.Addr[suite.Registry], "--policy-addr", s.Addr[suite.Policy],
		"--evidence-addr", s.Addr[suite.Evidence], "--adapter-addr", s.Addr[suite.Adapter],
		"--tls-ca-file", filepath.Join(pki, "ca.crt"), "--tls-cert-file", filepath.Join(pki, "tls.crt"), "--tls-key-file", filepath.Join(pki, "tls.key"),
		"--oidc-issuer", identity.DevIssuerName, "--oidc-jwks-file", s.Dev.JWKSFile)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

func waitServing(t *testing.T, s *suite.Suite, c orchestratorv1.OrchestratorServiceClient) {
	t.Helper()
	testkit.EventuallySucceeds(t, "the orchestrator serves (NOT_FOUND for a task nobody started)", func() error {
		_, err := c.GetTask(testkit.As(s, audrey), &orchestratorv1.GetTaskRequest{Id: "task_probe"})
		if apierror.Code(err) == codes.NotFound {
			return nil
		}
		return fmt.Errorf("orchestrator not serving: %v", err)
	})
}

// TestForgedReceiptIsRefusedAndNeverTrusted replays the finding "a forged
// receipt under an intent's key; after an orchestrator restart the request
// became EXECUTED with artifact_digest sha256:FORGED and no render
// happened". The orchestrator process is killed while a render is held
// open; the attacker then tries to record a receipt under the intent's key,
// as a caller, as another peer and as the orchestrator peer with forged
// attestations: every attempt is refused and nothing is stored. The
// restarted orchestrator settles the request by the renderer's own,
// adapter-attested answer: the real artifact, rendered once.
func TestForgedReceiptIsRefusedAndNeverTrusted(t *testing.T) {
	t.Parallel()
	s := startServices(t, suite.Registry, suite.Policy, suite.Evidence, suite.Adapter)
	dataDir, addr := t.TempDir(), testkit.FreeLoopbackAddr(t)
	first := startOrchestratorProcess(t, s, dataDir, addr)
	cc, err := serve.Dial(addr, s.CallerDialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	c := s.Clients
	c.Orchestrator = orchestratorv1.NewOrchestratorServiceClient(cc)
	waitServing(t, s, c.Orchestrator)

	r := newRenderer(t, s, c, true, "--delay", "60s")
	task, err := c.Orchestrator.StartTask(testkit.As(s, alice), &orchestratorv1.StartTaskRequest{
		Profile: "preview", Purpose: "preview revision 31 before review",
	})
	if err != nil {
		t.Fatal(err)
	}
	req, err := c.Orchestrator.SubmitToolRequest(testkit.As(s, alice), &orchestratorv1.SubmitToolRequestRequest{
		TaskId: task.GetTask().GetId(), ProviderCallId: "call-1", Capability: "render_preview",
		Arguments: scenario.MustStruct(map[string]any{"document_revision": 31, "profile": 4}), DocumentDigest: documentDigest,
	})
	if err != nil || req.GetState() != orchestratorv1.RequestState_REQUEST_STATE_AWAITING_APPROVAL {
		t.Fatalf("submit = %v, %v", req, err)
	}
	approved := make(chan error, 1)
	go func() {
		_, err := c.Orchestrator.Approve(testkit.As(s, bob), &orchestratorv1.ApproveRequest{RequestId: req.GetId(), DocumentDigest: documentDigest})
		approved <- err
	}()
	testkit.Eventually(t, "the render starts", func() bool {
		if _, renders := r.calls(t); renders > 0 {
			return true
		}
		select {
		case err := <-approved:
			t.Fatalf("approval returned before the render was held open: %v", err)
		default:
		}
		return false
	})
	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()
	<-approved

	// The attacker forges a receipt for the intent.
	forged := func(attestation string) *evidencev1.RecordReceiptRequest {
		return &evidencev1.RecordReceiptRequest{Receipt: &evidencev1.Receipt{
			IdempotencyKey: req.GetIntentId(), TaskId: task.GetTask().GetId(), AttemptId: "att_forged", ArtifactDigest: forgedDigest, Attestation: attestation,
		}}
	}
	if _, err := s.Evidence.RecordReceipt(testkit.As(s, mallory), forged("")); !apierror.Is(err, codes.PermissionDenied, "PEER_NOT_ALLOWED") {
		t.Errorf("RecordReceipt with a token in every group: %v, want PEER_NOT_ALLOWED", err)
	}
	adapterPeer, err := s.PeerClients(suite.Adapter)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := adapterPeer.Evidence.RecordReceipt(context.Background(), forged("")); !apierror.Is(err, codes.PermissionDenied, "PEER_NOT_ALLOWED") {
		t.Errorf("RecordReceipt as the adapter peer: %v, want PEER_NOT_ALLOWED", err)
	}
	impostor := identitytest.Credentials(t, identity.Adapter)[0]
	attest := func(signer *identity.Credentials, intent string) string {
		tok, err := receipt.Attest(signer, receipt.Attestation{GrantID: ids.New("grant"), AttemptID: "att_forged", IntentID: intent,
			TaskID: task.GetTask().GetId(), ResponseDigest: forgedDigest, ArtifactDigest: forgedDigest}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	orchPeer, err := s.PeerClients(suite.Orchestrator)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, attestation, reason string
	}{
		{"no attestation", "", receipt.ReasonMissing},
		{"attested by the orchestrator itself", attest(creds(t, s, identity.Orchestrator), req.GetIntentId()), receipt.ReasonInvalid},
		{"attested by an adapter certificate of another CA", attest(impostor, req.GetIntentId()), receipt.ReasonInvalid},
		{"the adapter's attestation of another intent", attest(creds(t, s, identity.Adapter), "int_other"), receipt.ReasonMismatch},
	} {
		if _, err := orchPeer.Evidence.RecordReceipt(context.Background(), forged(tc.attestation)); !apierror.Is(err, codes.PermissionDenied, tc.reason) {
			t.Errorf("RecordReceipt as the orchestrator peer, %s: %v, want %s", tc.name, err, tc.reason)
		}
	}
	if _, err := orchPeer.Evidence.GetReceipt(context.Background(), &evidencev1.GetReceiptRequest{IdempotencyKey: req.GetIntentId()}); apierror.Code(err) != codes.NotFound {
		t.Fatalf("receipt after the attack: %v, want NOT_FOUND", err)
	}

	// Restart: recovery settles by the renderer's attested status.
	startOrchestratorProcess(t, s, dataDir, addr)
	waitServing(t, s, c.Orchestrator)
	var got *orchestratorv1.ToolRequest
	testkit.Eventually(t, "the restarted orchestrator recovers the request to EXECUTED", func() bool {
		got, err = c.Orchestrator.GetRequest(testkit.As(s, alice), &orchestratorv1.GetRequestRequest{Id: req.GetId()})
		if err != nil && apierror.Code(err) != codes.Unavailable {
			t.Fatal(err)
		}
		if got.GetState() == orchestratorv1.RequestState_REQUEST_STATE_FAILED {
			t.Fatalf("recovered request = %v", got)
		}
		return got.GetState() == orchestratorv1.RequestState_REQUEST_STATE_EXECUTED
	})
	artifacts := r.artifacts(t)
	if len(artifacts) != 1 || got.GetArtifactDigest() != "sha256:"+strings.TrimSuffix(artifacts[0], ".html") {
		t.Errorf("executed with artifact %s; the renderer holds %v", got.GetArtifactDigest(), artifacts)
	}
	if _, renders := r.calls(t); renders != 1 {
		t.Errorf("rendered %d times, want once", renders)
	}
	rc, err := orchPeer.Evidence.GetReceipt(context.Background(), &evidencev1.GetReceiptRequest{IdempotencyKey: req.GetIntentId()})
	if err != nil || rc.GetId() != got.GetReceiptId() || rc.GetArtifactDigest() != got.GetArtifactDigest() {
		t.Fatalf("receipt = %v, %v", rc, err)
	}
	if a, err := receipt.Check(creds(t, s, identity.Evidence), rc); err != nil || a.AttemptID != got.GetAttempts()[0].GetId() {
		t.Errorf("stored receipt attestation: %+v, %v", a, err)
	}
}
