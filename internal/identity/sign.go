package identity

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

// nilCtx is for constructors that take a context only for background work
// they do not start (a file key set).
var nilCtx = context.Background()

// Sign returns a compact JWS of payload signed with this service's
// certificate key, carrying the certificate (x5c) so any service trusting
// the same CA can tell which service vouched for it.
func (c *Credentials) Sign(payload []byte) (string, error) {
	signer, err := c.current().statementSigner()
	if err != nil {
		return "", err
	}
	jws, err := signer.Sign(payload)
	if err != nil {
		return "", fmt.Errorf("identity: sign: %w", err)
	}
	return jws.CompactSerialize()
}

// statementSigner returns the signer of m's key, made once.
func (m *material) statementSigner() (jose.Signer, error) {
	m.signerOnce.Do(func() {
		alg, err := signingAlgorithm(m.cert.PrivateKey)
		if err != nil {
			m.signerErr = err
			return
		}
		opts := (&jose.SignerOptions{}).WithHeader("x5c", [][]byte{m.cert.Certificate[0]})
		m.signer, m.signerErr = jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: m.cert.PrivateKey}, opts)
		if m.signerErr != nil {
			m.signerErr = fmt.Errorf("identity: signer: %w", m.signerErr)
		}
	})
	return m.signer, m.signerErr
}

// signingAlgorithm is the JWS algorithm of a certificate key.
func signingAlgorithm(key any) (jose.SignatureAlgorithm, error) {
	switch k := key.(type) {
	case *ecdsa.PrivateKey:
		switch k.Curve.Params().BitSize {
		case 256:
			return jose.ES256, nil
		case 384:
			return jose.ES384, nil
		default:
			return jose.ES512, nil
		}
	case *rsa.PrivateKey:
		return jose.PS256, nil
	case ed25519.PrivateKey:
		return jose.EdDSA, nil
	}
	return "", fmt.Errorf("identity: cannot sign with a %T key", key)
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
	leaf, err := c.current().signerCertificate(token, jws.Signatures[0].Protected)
	if err != nil {
		return nil, err
	}
	if got := ServiceOf(leaf); got != want {
		return nil, fmt.Errorf("identity: signed by %q, not by the %s service", got, want)
	}
	payload, err := jws.Verify(leaf.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("identity: signature: %w", err)
	}
	return payload, nil
}

// signerCertificate returns the certificate a statement's x5c header
// names, once its chain to m's roots verified. The chain is verified once
// per certificate and trust material; its validity period is checked on
// every statement.
func (m *material) signerCertificate(token string, h jose.Header) (*x509.Certificate, error) {
	now := time.Now()
	var key [sha256.Size]byte
	if der, ok := x5cLeaf(token); ok {
		key = sha256.Sum256(der)
		if v, ok := m.signers.Load(key); ok {
			leaf := v.(*x509.Certificate)
			if now.Before(leaf.NotBefore) || now.After(leaf.NotAfter) {
				return nil, errors.New("identity: signer certificate: outside its validity period")
			}
			return leaf, nil
		}
	}
	chains, err := h.Certificates(x509.VerifyOptions{Roots: m.roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}, CurrentTime: now})
	if err != nil {
		return nil, fmt.Errorf("identity: signer certificate: %w", err)
	}
	leaf := chains[0][0]
	if key == sha256.Sum256(leaf.Raw) {
		m.signers.Store(key, leaf)
	}
	return leaf, nil
}

// x5cLeaf returns the DER of the first certificate in the x5c header of a
// compact JWS. go-jose parses x5c into an unexported field; reading the
// header here is what lets a known certificate skip its chain check. The
// signature is then verified with the key of the certificate found here,
// so a header that parses differently elsewhere gains nothing.
func x5cLeaf(token string) ([]byte, bool) {
	head, _, ok := strings.Cut(token, ".")
	if !ok {
		return nil, false
	}
	raw, err := base64.RawURLEncoding.DecodeString(head)
	if err != nil {
		return nil, false
	}
	var h struct {
		X5C []string `json:"x5c"`
	}
	if json.Unmarshal(raw, &h) != nil || len(h.X5C) == 0 {
		return nil, false
	}
	der, err := base64.StdEncoding.DecodeString(h.X5C[0])
	return der, err == nil
}
