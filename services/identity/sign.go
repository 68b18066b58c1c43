package identity

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"errors"
	"fmt"

	jose "github.com/go-jose/go-jose/v4"
)

// nilCtx is for constructors that take a context only for background work
// they do not start (a file key set).
var nilCtx = context.Background()

// Sign returns a compact JWS of payload signed with this service's
// certificate key, carrying the certificate (x5c) so any service trusting
// the same CA can tell which service vouched for it.
func (c *Credentials) Sign(payload []byte) (string, error) {
	m := c.current()
	var alg jose.SignatureAlgorithm
	switch k := m.cert.PrivateKey.(type) {
	case *ecdsa.PrivateKey:
		switch k.Curve.Params().BitSize {
		case 256:
			alg = jose.ES256
		case 384:
			alg = jose.ES384
		default:
			alg = jose.ES512
		}
	case *rsa.PrivateKey:
		alg = jose.PS256
	case ed25519.PrivateKey:
		alg = jose.EdDSA
	default:
		return "", fmt.Errorf("identity: cannot sign with a %T key", m.cert.PrivateKey)
	}
	opts := (&jose.SignerOptions{}).WithHeader("x5c", [][]byte{m.cert.Certificate[0]})
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: m.cert.PrivateKey}, opts)
	if err != nil {
		return "", fmt.Errorf("identity: signer: %w", err)
	}
	jws, err := signer.Sign(payload)
	if err != nil {
		return "", fmt.Errorf("identity: sign: %w", err)
	}
	return jws.CompactSerialize()
}

// Verify checks a compact JWS made by Sign: its certificate chains to the
// trusted CA and names the service want, and the signature verifies with
// it. It returns the payload.
func (c *Credentials) Verify(token, want string) ([]byte, error) {
	jws, err := jose.ParseSignedCompact(token, []jose.SignatureAlgorithm{jose.ES256, jose.ES384, jose.ES512, jose.PS256, jose.EdDSA})
	if err != nil {
		return nil, fmt.Errorf("identity: not a signed token: %w", err)
	}
	if len(jws.Signatures) != 1 {
		return nil, errors.New("identity: want exactly one signature")
	}
	chains, err := jws.Signatures[0].Protected.Certificates(x509.VerifyOptions{
		Roots: c.current().roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	})
	if err != nil {
		return nil, fmt.Errorf("identity: signer certificate: %w", err)
	}
	leaf := chains[0][0]
	if got := ServiceOf(leaf); got != want {
		return nil, fmt.Errorf("identity: signed by %q, not by the %s service", got, want)
	}
	payload, err := jws.Verify(leaf.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("identity: signature: %w", err)
	}
	return payload, nil
}
