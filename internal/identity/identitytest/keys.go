package identitytest

import (
	"errors"
	"fmt"
	"testing"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/v0m3/v0m3/internal/identity"
)

// Credentials issues, from one fresh CA, the credentials (key and
// certificate) of each service named, in order: the orchestrator's sign
// the JWTs its JWKS publishes, another service's do not verify with them.
func Credentials(t testing.TB, services ...string) []*identity.Credentials {
	t.Helper()
	ca, err := identity.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	out := make([]*identity.Credentials, len(services))
	for i, s := range services {
		if out[i], err = ca.Issue(s); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// VerifyJWT verifies token with the key of ks its key id names, as a
// relying party on the JWKS does, and decodes its claims into claims.
func VerifyJWT(token string, ks *jose.JSONWebKeySet, claims any) error {
	tok, err := jwt.ParseSigned(token, []jose.SignatureAlgorithm{jose.ES256, jose.ES384, jose.ES512, jose.PS256, jose.EdDSA})
	if err != nil {
		return fmt.Errorf("not a JWT: %w", err)
	}
	keys := ks.Key(tok.Headers[0].KeyID)
	if len(keys) != 1 {
		return errors.New("the JWKS has no key of the token's key id")
	}
	if err := tok.Claims(keys[0].Key, claims); err != nil {
		return fmt.Errorf("signature: %w", err)
	}
	return nil
}
