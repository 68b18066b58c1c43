package identity

import (
	"fmt"
	"os"
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

// NewDev creates a development setup in dir, or takes up the one a
// previous run left there (its CA and issuer keys), so tokens minted for a
// `v0m3 dev` keep working across its restarts and two development
// processes given one dir trust each other. A setup that cannot be read
// is replaced.
func NewDev(dir string) (*Dev, error) {
	caCert, caKey := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")
	ca, err := LoadCA(caCert, caKey)
	if err != nil {
		if ca, err = NewCA(); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("identity: %w", err)
		}
		if err := ca.WriteKey(caKey); err != nil {
			return nil, err
		}
		if err := writeFile(caCert, ca.CertPEM()); err != nil {
			return nil, err
		}
	}
	iss, err := LoadDevIssuer(dir)
	if err != nil {
		if iss, err = NewDevIssuer(); err != nil {
			return nil, err
		}
	}
	jwks, err := iss.WriteFiles(dir)
	if err != nil {
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
