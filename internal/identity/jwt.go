package identity

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"

	jose "github.com/go-jose/go-jose/v4"
)

// SignJWT returns claims as a compact JWT (RFC 7519) signed with this
// service's certificate key. Unlike Sign, it is meant for verifiers outside
// the mesh that do not trust V0M3's CA (an OAuth authorization server
// verifying a subject token): its header names the key by its JWK
// thumbprint (kid), which JWKS publishes, and carries no certificate.
func (c *Credentials) SignJWT(claims any) (string, error) {
	if c == nil {
		return "", fmt.Errorf("identity: no credentials to sign with")
	}
	m := c.current()
	signer, _, err := m.jwtMaterial()
	if err != nil {
		return "", err
	}
	payload, err := json.Marshal(claims)
	if err != nil {
		return "", fmt.Errorf("identity: jwt claims: %w", err)
	}
	jws, err := signer.Sign(payload)
	if err != nil {
		return "", fmt.Errorf("identity: sign jwt: %w", err)
	}
	return jws.CompactSerialize()
}

// JWKS returns the JSON Web Key Set (RFC 7517) that verifies what SignJWT
// signs: the public key of this service's current certificate. A verifier
// fetches it again when it meets a kid it does not know (after a
// certificate rotation).
func (c *Credentials) JWKS() (*jose.JSONWebKeySet, error) {
	if c == nil {
		return nil, fmt.Errorf("identity: no credentials")
	}
	_, key, err := c.current().jwtMaterial()
	if err != nil {
		return nil, err
	}
	return &jose.JSONWebKeySet{Keys: []jose.JSONWebKey{key}}, nil
}

// jwtMaterial returns m's JWT signer and its public JWK, made once.
func (m *material) jwtMaterial() (jose.Signer, jose.JSONWebKey, error) {
	m.jwtOnce.Do(func() {
		alg, err := signingAlgorithm(m.cert.PrivateKey)
		if err != nil {
			m.jwtErr = err
			return
		}
		signer, ok := m.cert.PrivateKey.(crypto.Signer)
		if !ok {
			m.jwtErr = fmt.Errorf("identity: cannot sign with a %T key", m.cert.PrivateKey)
			return
		}
		pub, err := publicJWK(signer.Public(), alg)
		if err != nil {
			m.jwtErr = err
			return
		}
		opts := (&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", pub.KeyID)
		m.jwtSigner, m.jwtErr = jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: m.cert.PrivateKey}, opts)
		if m.jwtErr != nil {
			m.jwtErr = fmt.Errorf("identity: jwt signer: %w", m.jwtErr)
		}
		m.jwtKey = pub
	})
	return m.jwtSigner, m.jwtKey, m.jwtErr
}

// publicJWK is the JWK of a public key, named by its RFC 7638
// thumbprint.
func publicJWK(pub crypto.PublicKey, alg jose.SignatureAlgorithm) (jose.JSONWebKey, error) {
	k := jose.JSONWebKey{Key: pub, Algorithm: string(alg), Use: "sig"}
	tp, err := k.Thumbprint(crypto.SHA256)
	if err != nil {
		return jose.JSONWebKey{}, fmt.Errorf("identity: key thumbprint: %w", err)
	}
	k.KeyID = base64.RawURLEncoding.EncodeToString(tp)
	return k, nil
}

// CertificateJWKS is the JWKS SignJWT's signatures verify with when the
// signer holds cert's key: what `v0m3 jwks` exports from the
// orchestrator's certificate alone, without its private key.
func CertificateJWKS(cert *x509.Certificate) (*jose.JSONWebKeySet, error) {
	var alg jose.SignatureAlgorithm
	switch k := cert.PublicKey.(type) {
	case *ecdsa.PublicKey:
		alg = map[int]jose.SignatureAlgorithm{256: jose.ES256, 384: jose.ES384}[k.Curve.Params().BitSize]
		if alg == "" {
			alg = jose.ES512
		}
	case *rsa.PublicKey:
		alg = jose.PS256
	case ed25519.PublicKey:
		alg = jose.EdDSA
	default:
		return nil, fmt.Errorf("identity: cannot use a %T key", cert.PublicKey)
	}
	k, err := publicJWK(cert.PublicKey, alg)
	if err != nil {
		return nil, err
	}
	return &jose.JSONWebKeySet{Keys: []jose.JSONWebKey{k}}, nil
}

// JWKSHandler serves c's JWKS (GET, application/jwk-set+json), for an
// authorization server to fetch: it holds public keys only.
func JWKSHandler(c *Credentials) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		ks, err := c.JWKS()
		if err != nil {
			http.Error(w, "no signing key", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/jwk-set+json")
		w.Header().Set("Cache-Control", "max-age=300")
		_ = json.NewEncoder(w).Encode(ks)
	})
}
