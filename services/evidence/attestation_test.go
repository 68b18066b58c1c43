package evidence_test

import (
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/grant"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/receipt"
	"github.com/v0m3/v0m3/internal/testkit"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	"github.com/v0m3/v0m3/services/evidence"
)

// issue returns credentials of service from ca.
func issue(t *testing.T, ca *identity.CA, service string) *identity.Credentials {
	t.Helper()
	c, err := ca.Issue(service)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestReceiptNeedsTheAdaptersAttestation: with its certificate, evidence
// stores a receipt only with the adapter's attestation of exactly it. A
// forged, borrowed or altered attestation is refused and nothing is
// stored, even though the caller is the orchestrator the access table
// admits.
func TestReceiptNeedsTheAdaptersAttestation(t *testing.T) {
	t.Parallel()
	ca, err := identity.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	otherCA, err := identity.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	adapterCreds := issue(t, ca, identity.Adapter)
	orchestratorCreds := issue(t, ca, identity.Orchestrator)
	e := startEnv(t, filepath.Join(t.TempDir(), "evidence.db"), testkit.NewClock(t0), func(s *evidence.Server) { s.WithCredentials(issue(t, ca, identity.Evidence)) })

	observed := receipt.Attestation{GrantID: "grant_1", AttemptID: "att_1", IntentID: "int_1", TaskID: "task_1",
		ResponseDigest: contentDigest("reply"), ArtifactDigest: contentDigest("artifact")}
	attest := func(signer *identity.Credentials, a receipt.Attestation) string {
		tok, err := receipt.Attest(signer, a, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	genuine := attest(adapterCreds, observed)
	rc := func(attestation string) *evidencev1.Receipt {
		return &evidencev1.Receipt{IdempotencyKey: "int_1", TaskId: "task_1", AttemptId: "att_1", ArtifactDigest: observed.ArtifactDigest, Attestation: attestation}
	}
	grantTok, err := grant.Sign(orchestratorCreds, grant.Grant{Type: grant.Type, ID: "grant_1", AttemptID: "att_1"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name          string
		receipt       *evidencev1.Receipt
		reason, field string
	}{
		{"no attestation", rc(""), receipt.ReasonMissing, "attestation"},
		{"not a signed token", rc("forged"), receipt.ReasonInvalid, "attestation"},
		{"signed by the orchestrator", rc(attest(orchestratorCreds, observed)), receipt.ReasonInvalid, "attestation"},
		{"signed by an adapter of another CA", rc(attest(issue(t, otherCA, identity.Adapter), observed)), receipt.ReasonInvalid, "attestation"},
		{"a grant passed off as an attestation", rc(grantTok), receipt.ReasonInvalid, "attestation"},
		{"forged artifact digest", func() *evidencev1.Receipt {
			r := rc(genuine)
			r.ArtifactDigest = "sha256:FORGED"
			return r
		}(), receipt.ReasonMismatch, "artifact_digest"},
		{"borrowed for another intent", func() *evidencev1.Receipt {
			r := rc(genuine)
			r.IdempotencyKey = "int_2"
			return r
		}(), receipt.ReasonMismatch, "idempotency_key"},
		{"another attempt", func() *evidencev1.Receipt { r := rc(genuine); r.AttemptId = "att_2"; return r }(), receipt.ReasonMismatch, "attempt_id"},
		{"another task", func() *evidencev1.Receipt { r := rc(genuine); r.TaskId = "task_2"; return r }(), receipt.ReasonMismatch, "task_id"},
		{"a delivery never observed", func() *evidencev1.Receipt { r := rc(genuine); r.DeliveryId = "d_forged"; return r }(), receipt.ReasonMismatch, "delivery_id"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.client.RecordReceipt(t.Context(), &evidencev1.RecordReceiptRequest{Receipt: tc.receipt})
			if !apierror.Is(err, codes.PermissionDenied, tc.reason) || apierror.Info(err).GetMetadata()["field"] != tc.field {
				t.Fatalf("RecordReceipt = %v (metadata %v), want PERMISSION_DENIED %s field %q", err, apierror.Info(err).GetMetadata(), tc.reason, tc.field)
			}
			for _, key := range []string{"int_1", "int_2"} {
				if _, err := e.client.GetReceipt(t.Context(), &evidencev1.GetReceiptRequest{IdempotencyKey: key}); apierror.Code(err) != codes.NotFound {
					t.Errorf("GetReceipt(%s) after a refused receipt: %v, want NOT_FOUND", key, err)
				}
			}
		})
	}

	// The genuine one is stored with its attestation, and a forged second
	// record of the same key neither replaces it nor is answered with it.
	got, err := e.client.RecordReceipt(t.Context(), &evidencev1.RecordReceiptRequest{Receipt: rc(genuine)})
	if err != nil || got.GetAttestation() != genuine || got.GetArtifactDigest() != observed.ArtifactDigest {
		t.Fatalf("genuine receipt = %v, %v", got, err)
	}
	forged := rc(genuine)
	forged.ArtifactDigest = "sha256:FORGED"
	if _, err := e.client.RecordReceipt(t.Context(), &evidencev1.RecordReceiptRequest{Receipt: forged}); !apierror.Is(err, codes.PermissionDenied, receipt.ReasonMismatch) {
		t.Errorf("forged second record: %v", err)
	}
	stored, err := e.client.GetReceipt(t.Context(), &evidencev1.GetReceiptRequest{IdempotencyKey: "int_1"})
	if err != nil || !proto.Equal(stored, got) {
		t.Errorf("stored receipt = %v, %v; want %v", stored, err, got)
	}
}
