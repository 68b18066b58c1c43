package identity_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/v0m3/v0m3/services/identity"
)

// A JWT the orchestrator signs verifies with the key its JWKS publishes
// (served over HTTP and exported from the certificate alone, the same
// key), found by the token's kid; one signed by another service's key
// does not.
func TestSignJWTVerifiesWithJWKS(t *testing.T) {
	t.Parallel()
	ca, err := identity.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	orch, err := ca.Issue(identity.Orchestrator)
	if err != nil {
		t.Fatal(err)
	}
	other, err := ca.Issue(identity.Adapter)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(identity.JWKSHandler(orch))
	t.Cleanup(srv.Close)
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var served jose.JSONWebKeySet
	if err := json.NewDecoder(resp.Body).Decode(&served); err != nil || resp.Header.Get("Content-Type") != "application/jwk-set+json" {
		t.Fatalf("JWKS: %v (%s)", err, resp.Header.Get("Content-Type"))
	}
	exported, err := identity.CertificateJWKS(orch.Leaf())
	if err != nil {
		t.Fatal(err)
	}
	if len(served.Keys) != 1 || len(exported.Keys) != 1 || served.Keys[0].KeyID != exported.Keys[0].KeyID || !served.Keys[0].IsPublic() {
		t.Fatalf("served %+v, exported %+v: want the same one public key", served.Keys, exported.Keys)
	}
	claims := jwt.Claims{Subject: "alice", Expiry: jwt.NewNumericDate(time.Now().Add(time.Minute))}
	for _, tt := range []struct {
		name   string
		signer *identity.Credentials
		ok     bool
	}{{"orchestrator", orch, true}, {"another service", other, false}} {
		tok, err := tt.signer.SignJWT(claims)
		if err != nil {
			t.Fatal(err)
		}
		parsed, err := jwt.ParseSigned(tok, []jose.SignatureAlgorithm{jose.ES256, jose.ES384, jose.ES512, jose.PS256, jose.EdDSA})
		if err != nil {
			t.Fatal(err)
		}
		var got jwt.Claims
		keys := served.Key(parsed.Headers[0].KeyID)
		ok := len(keys) == 1 && parsed.Claims(keys[0].Key, &got) == nil && got.Subject == "alice"
		if ok != tt.ok {
			t.Errorf("%s: verified = %v, want %v", tt.name, ok, tt.ok)
		}
	}
}
