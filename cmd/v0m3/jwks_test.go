package main

import (
	"bytes"
	"encoding/json"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/identity/identitytest"
)

// v0m3 jwks exports, from the orchestrator's certificate, the key its
// subject tokens verify with; another service's certificate is refused.
func TestJWKS(t *testing.T) {
	t.Parallel()
	creds := identitytest.Credentials(t, identity.Orchestrator, identity.Adapter)
	write := func(c *identity.Credentials) string {
		path := filepath.Join(t.TempDir(), "service.crt")
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Leaf().Raw}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	orch := creds[0]
	orchPath := write(orch)
	var out bytes.Buffer
	if err := runJWKS(t.Context(), []string{"--cert-file", orchPath}, &out, &bytes.Buffer{}); err != nil {
		t.Fatalf("jwks: %v", err)
	}
	var ks jose.JSONWebKeySet
	if err := json.Unmarshal(out.Bytes(), &ks); err != nil {
		t.Fatalf("output %q: %v", out.String(), err)
	}
	tok, err := orch.SignJWT(jwt.Claims{Subject: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	var got jwt.Claims
	if err := identitytest.VerifyJWT(tok, &ks, &got); err != nil || got.Subject != "alice" {
		t.Errorf("the exported JWKS does not verify the orchestrator's JWT (%v): %s", err, out.String())
	}
	if strings.Contains(out.String(), `"d"`) {
		t.Errorf("the JWKS holds a private key: %s", out.String())
	}

	adapterPath := write(creds[1])
	if err := runJWKS(t.Context(), []string{"--cert-file", adapterPath}, &bytes.Buffer{}, &bytes.Buffer{}); err == nil {
		t.Error("jwks accepted the adapter's certificate")
	}
	var ue usageError
	if err := runJWKS(t.Context(), nil, &bytes.Buffer{}, &bytes.Buffer{}); err == nil || !errors.As(err, &ue) {
		t.Errorf("no --cert-file: %v, want a usage error", err)
	}
}
