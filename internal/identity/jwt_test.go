package identity_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/identity/identitytest"
)

// A JWT the orchestrator signs verifies with the key its JWKS publishes
// (served over HTTP and exported from the certificate alone, the same
// key), found by the token's kid; one signed by another service's key
// does not.
func TestSignJWTVerifiesWithJWKS(t *testing.T) {
	t.Parallel()
	creds := identitytest.Credentials(t, identity.Orchestrator, identity.Adapter)
	orch, other := creds[0], creds[1]
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
		var got jwt.Claims
		ok := identitytest.VerifyJWT(tok, &served, &got) == nil && got.Subject == "alice"
		if ok != tt.ok {
			t.Errorf("%s: verified = %v, want %v", tt.name, ok, tt.ok)
		}
	}
}
