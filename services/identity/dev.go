package identity

import (
	"fmt"
	"path/filepath"
	"time"
)

// Dev is a development identity setup made on the spot: an ephemeral CA
// with a certificate per service, and a development token issuer, written
// under one directory so a caller (grpcurl, `v0m3 token`) can use them.
// It is how `v0m3 dev`, the demo and the tests run mutual TLS and bearer
// authentication with no setup.
type Dev struct {
	// Dir holds ca.crt, <service>/{ca.crt,tls.crt,tls.key}, issuer.key and
	// jwks.json.
	Dir string
	// CA issued every certificate.
	CA *CA
	// Issuer mints development tokens.
	Issuer *DevIssuer
	// JWKSFile is the issuer's public JWK set.
	JWKSFile string
}

// NewDev creates a development setup in dir.
func NewDev(dir string) (*Dev, error) {
	ca, err := NewCA()
	if err != nil {
		return nil, err
	}
	iss, err := NewDevIssuer()
	if err != nil {
		return nil, err
	}
	jwks, err := iss.WriteFiles(dir)
	if err != nil {
		return nil, err
	}
	if err := writeFile(filepath.Join(dir, "ca.crt"), ca.CertPEM()); err != nil {
		return nil, err
	}
	return &Dev{Dir: dir, CA: ca, Issuer: iss, JWKSFile: jwks}, nil
}

// Credentials issues credentials for service, written under Dir.
func (d *Dev) Credentials(service string) (*Credentials, error) {
	f, err := d.CA.WriteFiles(d.Dir, service)
	if err != nil {
		return nil, err
	}
	return LoadFiles(f)
}

// Authenticator accepts the development issuer's tokens.
func (d *Dev) Authenticator() (Authenticator, error) {
	return d.Issuer.Authenticator(d.JWKSFile)
}

// Token mints a one-hour token for subject in groups.
func (d *Dev) Token(subject string, groups ...string) (string, error) {
	tok, err := d.Issuer.Mint(subject, groups, time.Hour)
	if err != nil {
		return "", fmt.Errorf("identity: token for %s: %w", subject, err)
	}
	return tok, nil
}
