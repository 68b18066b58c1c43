package identity

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// DevIssuer is a development token issuer: an ES256 key whose public half
// is published as a JWK set file, so `v0m3 dev`, the demo and the tests
// authenticate callers with the same JWT verification a cluster uses with
// its real OIDC issuer. It is not an authorization server.
type DevIssuer struct {
	// Issuer is the "iss" of minted tokens.
	Issuer string
	// Audience is the "aud" of minted tokens.
	Audience string
	key      *ecdsa.PrivateKey
	kid      string
}

// DevIssuerName and DevAudience are the issuer and audience of development
// tokens.
const (
	DevIssuerName = "https://dev.v0m3.invalid"
	DevAudience   = "v0m3"
)

// NewDevIssuer returns an issuer with a new key.
func NewDevIssuer() (*DevIssuer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("identity: issuer key: %w", err)
	}
	return newDevIssuer(key)
}

func newDevIssuer(key *ecdsa.PrivateKey) (*DevIssuer, error) {
	der, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return nil, fmt.Errorf("identity: issuer key: %w", err)
	}
	sum := sha256.Sum256(der)
	return &DevIssuer{Issuer: DevIssuerName, Audience: DevAudience, key: key, kid: base64.RawURLEncoding.EncodeToString(sum[:12])}, nil
}

// LoadDevIssuer reads the issuer key a development server wrote into dir
// (see WriteFiles), so a CLI can mint tokens the server accepts.
func LoadDevIssuer(dir string) (*DevIssuer, error) {
	data, err := os.ReadFile(filepath.Join(dir, "issuer.key"))
	if err != nil {
		return nil, fmt.Errorf("identity: development issuer: %w", err)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("identity: development issuer key is not PEM")
	}
	key, err := x509.ParseECPrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("identity: development issuer key: %w", err)
	}
	return newDevIssuer(key)
}

// WriteFiles writes the issuer's private key (issuer.key, 0600) and its
// public JWK set (jwks.json) into dir and returns the JWK set's path.
func (d *DevIssuer) WriteFiles(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("identity: %w", err)
	}
	der, err := x509.MarshalECPrivateKey(d.key)
	if err != nil {
		return "", fmt.Errorf("identity: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "issuer.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return "", fmt.Errorf("identity: %w", err)
	}
	path := filepath.Join(dir, "jwks.json")
	if err := os.WriteFile(path, d.JWKS(), 0o644); err != nil {
		return "", fmt.Errorf("identity: %w", err)
	}
	return path, nil
}

// JWKS returns the public JWK set.
func (d *DevIssuer) JWKS() []byte {
	set := jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: d.key.Public(), KeyID: d.kid, Algorithm: string(jose.ES256), Use: "sig"}}}
	data, err := json.Marshal(set)
	if err != nil {
		panic(err) // an ECDSA public key always marshals
	}
	return data
}

// Mint returns a token for subject in groups, valid for ttl.
func (d *DevIssuer) Mint(subject string, groups []string, ttl time.Duration) (string, error) {
	return d.MintClaims(subject, ttl, map[string]any{"groups": groups})
}

// MintClaims returns a token for subject with extra claims (which may
// override the registered ones, for tests of refusals).
func (d *DevIssuer) MintClaims(subject string, ttl time.Duration, extra map[string]any) (string, error) {
	sig, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: d.key},
		(&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", d.kid))
	if err != nil {
		return "", fmt.Errorf("identity: signer: %w", err)
	}
	now := time.Now()
	claims := jwt.Claims{
		Issuer:   d.Issuer,
		Subject:  subject,
		Audience: jwt.Audience{d.Audience},
		IssuedAt: jwt.NewNumericDate(now),
		Expiry:   jwt.NewNumericDate(now.Add(ttl)),
	}
	tok, err := jwt.Signed(sig).Claims(claims).Claims(extra).Serialize()
	if err != nil {
		return "", fmt.Errorf("identity: mint: %w", err)
	}
	return tok, nil
}

// Authenticator returns a JWT authenticator that accepts this issuer's
// tokens, reading its keys from the JWK set file at jwksPath.
func (d *DevIssuer) Authenticator(jwksPath string) (*JWT, error) {
	return NewJWT(nilCtx, JWTConfig{Issuer: d.Issuer, Audience: d.Audience, JWKSFile: jwksPath})
}

// As returns ctx carrying a one-hour token for subject in groups for
// outgoing calls. It panics if the issuer cannot sign, which only a broken
// key causes.
func (d *DevIssuer) As(ctx context.Context, subject string, groups ...string) context.Context {
	tok, err := d.Mint(subject, groups, time.Hour)
	if err != nil {
		panic(err)
	}
	return WithBearer(ctx, tok)
}
