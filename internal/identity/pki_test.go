package identity_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/v0m3/v0m3/internal/identity"
)

// TestSignedStatementNamesItsSigner: a statement signed by one service
// verifies as that service only, not with another CA, and not once
// tampered with.
func TestSignedStatementNamesItsSigner(t *testing.T) {
	t.Parallel()
	dev, err := identity.NewDev(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	other, err := identity.NewDev(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	orch, err := dev.Credentials(identity.Orchestrator)
	if err != nil {
		t.Fatal(err)
	}
	adapter, err := dev.Credentials(identity.Adapter)
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := other.Credentials(identity.Orchestrator)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := orch.Sign([]byte(`{"attempt":"att_1"}`))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := adapter.Verify(tok, identity.Orchestrator); err != nil || string(got) != `{"attempt":"att_1"}` {
		t.Fatalf("verify = %q, %v", got, err)
	}
	if _, err := adapter.Verify(tok, identity.Adapter); err == nil {
		t.Error("a statement of the orchestrator verified as the adapter's")
	}
	forged, err := foreign.Sign([]byte(`{"attempt":"att_1"}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := adapter.Verify(forged, identity.Orchestrator); err == nil {
		t.Error("a statement signed under another CA verified")
	}
	if _, err := adapter.Verify(tamper(tok), identity.Orchestrator); err == nil {
		t.Error("a tampered statement verified")
	}
}

// TestCredentialsFollowTheirFiles: a renewed certificate written over the
// files is used without a restart; a broken write keeps the old one.
func TestCredentialsFollowTheirFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	dev, err := identity.NewDev(dir)
	if err != nil {
		t.Fatal(err)
	}
	files, err := dev.CA.WriteFiles(dir, identity.Policy)
	if err != nil {
		t.Fatal(err)
	}
	creds, err := identity.LoadFiles(files)
	if err != nil {
		t.Fatal(err)
	}
	first := creds.Leaf()
	// A half-written renewal: the old certificate stays.
	later := time.Now().Add(time.Minute)
	if err := os.WriteFile(files.Cert, []byte("-----BEGIN CERT"), 0o600); err != nil {
		t.Fatal(err)
	}
	_ = os.Chtimes(files.Cert, later, later)
	creds.ForceReloadCheck()
	if creds.Leaf().SerialNumber.Cmp(first.SerialNumber) != 0 {
		t.Fatal("a broken certificate file replaced the working one")
	}
	// A complete renewal takes over.
	if _, err := dev.CA.WriteFiles(dir, identity.Policy); err != nil {
		t.Fatal(err)
	}
	later = later.Add(time.Minute)
	for _, f := range []string{files.CA, files.Cert, files.Key} {
		_ = os.Chtimes(f, later, later)
	}
	creds.ForceReloadCheck()
	if creds.Leaf().SerialNumber.Cmp(first.SerialNumber) == 0 {
		t.Fatal("the renewed certificate was not picked up")
	}
	// A certificate that names no service is refused at load.
	if _, err := identity.LoadFiles(identity.Files{CA: files.CA, Cert: files.CA, Key: files.Key}); err == nil {
		t.Error("a certificate without a service identity was accepted")
	}
}

// TestDevSetupSurvivesRestart: a development setup taken up again keeps
// its CA and issuer, so certificates and tokens of the earlier run stay
// valid.
func TestDevSetupSurvivesRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	first, err := identity.NewDev(dir)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := first.Token("alice", "authors")
	if err != nil {
		t.Fatal(err)
	}
	orch, err := first.Credentials(identity.Orchestrator)
	if err != nil {
		t.Fatal(err)
	}
	stmt, err := orch.Sign([]byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	again, err := identity.NewDev(dir)
	if err != nil {
		t.Fatal(err)
	}
	authn, err := again.Authenticator()
	if err != nil {
		t.Fatal(err)
	}
	if c, err := authn.Authenticate(context.Background(), tok); err != nil || c.ID != "alice" {
		t.Fatalf("token of the earlier run: %v, %v", c, err)
	}
	adapter, err := again.Credentials(identity.Adapter)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := adapter.Verify(stmt, identity.Orchestrator); err != nil {
		t.Fatalf("statement signed under the earlier run: %v", err)
	}
}

// TestVerifiedSignerFollowsTrust: a signer's certificate, once verified,
// is not trusted beyond the trust it was verified under: after the
// verifying service's CA changes, a statement of the old CA is refused even
// though the same certificate verified a moment before.
func TestVerifiedSignerFollowsTrust(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	dev, err := identity.NewDev(dir)
	if err != nil {
		t.Fatal(err)
	}
	files, err := dev.CA.WriteFiles(dir, identity.Adapter)
	if err != nil {
		t.Fatal(err)
	}
	adapter, err := identity.LoadFiles(files)
	if err != nil {
		t.Fatal(err)
	}
	orch, err := dev.Credentials(identity.Orchestrator)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		stmt, err := orch.Sign([]byte(`{"n":1}`))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := adapter.Verify(stmt, identity.Orchestrator); err != nil {
			t.Fatalf("statement %d: %v", i, err)
		}
	}
	stmt, err := orch.Sign([]byte(`{"n":2}`))
	if err != nil {
		t.Fatal(err)
	}
	// The adapter's files now come from another CA.
	other, err := identity.NewDev(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.CA.WriteFiles(dir, identity.Adapter); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Minute)
	for _, f := range []string{files.CA, files.Cert, files.Key} {
		_ = os.Chtimes(f, later, later)
	}
	adapter.ForceReloadCheck()
	if _, err := adapter.Verify(stmt, identity.Orchestrator); err == nil {
		t.Fatal("a statement signed under a CA the adapter no longer trusts verified")
	}
}

// BenchmarkVerifyStatement measures what the adapter pays per execution
// grant: signing by the orchestrator and verifying by the adapter.
func BenchmarkVerifyStatement(b *testing.B) {
	dev, err := identity.NewDev(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	orch, err := dev.Credentials(identity.Orchestrator)
	if err != nil {
		b.Fatal(err)
	}
	adapter, err := dev.Credentials(identity.Adapter)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		stmt, err := orch.Sign([]byte(`{"attempt":"att_1"}`))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := adapter.Verify(stmt, identity.Orchestrator); err != nil {
			b.Fatal(err)
		}
	}
}
