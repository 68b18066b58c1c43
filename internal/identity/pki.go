package identity

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"

	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

// uriPrefix starts the URI SAN that names a service in its certificate.
const uriPrefix = "spiffe://v0m3/service/"

// ServiceURI returns the URI SAN naming service in its certificate, e.g.
// "spiffe://v0m3/service/adapter". Certificates from cert-manager carry it
// in spec.uris.
func ServiceURI(service string) string { return uriPrefix + service }

// ServiceOf returns the service a certificate names, or "" when it names
// none or more than one.
func ServiceOf(cert *x509.Certificate) string {
	var found string
	for _, u := range cert.URIs {
		if name, ok := strings.CutPrefix(u.String(), uriPrefix); ok && name != "" {
			if found != "" {
				return ""
			}
			found = name
		}
	}
	return found
}

// CA issues service certificates. NewCA makes an ephemeral one, so `v0m3
// dev`, the demo and tests need no setup; a cluster uses cert-manager.
type CA struct {
	cert    *x509.Certificate
	key     crypto.Signer
	certPEM []byte
}

// NewCA returns a new self-signed ECDSA P-256 CA valid for 30 days.
func NewCA() (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("identity: CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "V0M3 development CA"},
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(30 * 24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("identity: CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("identity: CA certificate: %w", err)
	}
	return &CA{cert: cert, key: key, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// WriteKey writes the CA's private key (PEM, 0600) to path, so a later
// development run can keep issuing under the same CA (LoadCA).
func (ca *CA) WriteKey(path string) error {
	der, err := x509.MarshalPKCS8PrivateKey(ca.key)
	if err != nil {
		return fmt.Errorf("identity: CA key: %w", err)
	}
	return writeFile(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
}

// LoadCA reads a CA written by CertPEM and WriteKey.
func LoadCA(certPath, keyPath string) (*CA, error) {
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, fmt.Errorf("identity: %w", err)
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, fmt.Errorf("identity: %w", err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("identity: CA: %w", err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("identity: CA: %w", err)
	}
	key, ok := pair.PrivateKey.(crypto.Signer)
	if !ok || !cert.IsCA {
		return nil, errors.New("identity: not a CA certificate and key")
	}
	if time.Now().After(cert.NotAfter.Add(-24 * time.Hour)) {
		return nil, errors.New("identity: the development CA expires within a day")
	}
	return &CA{cert: cert, key: key, certPEM: certPEM}, nil
}

// CertPEM returns the CA certificate in PEM, what a caller needs to trust
// the services.
func (ca *CA) CertPEM() []byte { return ca.certPEM }

// IssuePEM issues a certificate for service, valid for both server and
// client authentication, with DNS names and IP addresses from hosts
// (default "localhost" and 127.0.0.1). It returns the certificate and key
// in PEM.
func (ca *CA) IssuePEM(service string, hosts ...string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("identity: key for %s: %w", service, err)
	}
	u, err := url.Parse(ServiceURI(service))
	if err != nil {
		return nil, nil, fmt.Errorf("identity: service name %q: %w", service, err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: service},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     ca.cert.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{u},
	}
	if len(hosts) == 0 {
		hosts = []string{"localhost", "127.0.0.1", "::1"}
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return nil, nil, fmt.Errorf("identity: certificate for %s: %w", service, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("identity: key for %s: %w", service, err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), nil
}

// Issue issues in-memory credentials for service (see IssuePEM).
func (ca *CA) Issue(service string, hosts ...string) (*Credentials, error) {
	certPEM, keyPEM, err := ca.IssuePEM(service, hosts...)
	if err != nil {
		return nil, err
	}
	m, err := parseMaterial(ca.certPEM, certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	return &Credentials{service: service, mat: m}, nil
}

// WriteFiles issues a certificate for service and writes ca.crt, tls.crt
// and tls.key (mode 0600) into dir/service, the layout of a cert-manager
// Secret. It returns the paths.
func (ca *CA) WriteFiles(dir, service string, hosts ...string) (Files, error) {
	certPEM, keyPEM, err := ca.IssuePEM(service, hosts...)
	if err != nil {
		return Files{}, err
	}
	d := filepath.Join(dir, service)
	if err := os.MkdirAll(d, 0o700); err != nil {
		return Files{}, fmt.Errorf("identity: %w", err)
	}
	f := Files{CA: filepath.Join(d, "ca.crt"), Cert: filepath.Join(d, "tls.crt"), Key: filepath.Join(d, "tls.key")}
	for path, data := range map[string][]byte{f.CA: ca.certPEM, f.Cert: certPEM, f.Key: keyPEM} {
		if err := writeFile(path, data); err != nil {
			return Files{}, err
		}
	}
	return f, nil
}

// writeFile writes data readable by its owner only.
func writeFile(path string, data []byte) error {
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return fmt.Errorf("identity: %w", err)
	}
	return nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return n
}

// Files names the PEM files of one service's credentials: the CA bundle it
// trusts, its certificate (chain) and its private key.
type Files struct {
	CA, Cert, Key string
}

// material is one loaded set of credentials.
type material struct {
	cert    tls.Certificate
	leaf    *x509.Certificate
	roots   *x509.CertPool
	service string

	// signer signs statements with cert; made once, on first use.
	signerOnce sync.Once
	signer     jose.Signer
	signerErr  error
	// signers holds the signing certificates (by SHA-256 of their DER)
	// whose chain to roots verified, so each statement checks only its
	// signature. It belongs to this material: new trust starts empty.
	signers sync.Map

	// jwtSigner signs JWTs for verifiers outside the mesh (see jwt.go);
	// made once, on first use.
	jwtOnce   sync.Once
	jwtSigner jose.Signer
	jwtKey    jose.JSONWebKey
	jwtErr    error
}

func parseMaterial(caPEM, certPEM, keyPEM []byte) (*material, error) {
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("identity: the CA file holds no PEM certificate")
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("identity: certificate and key: %w", err)
	}
	leaf := cert.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, fmt.Errorf("identity: certificate: %w", err)
		}
	}
	svc := ServiceOf(leaf)
	if svc == "" {
		return nil, fmt.Errorf("identity: the certificate names no service: it needs exactly one URI SAN %s<name>", uriPrefix)
	}
	return &material{cert: cert, leaf: leaf, roots: roots, service: svc}, nil
}

// Credentials are one service's TLS identity: its certificate and key and
// the CA it trusts. Credentials loaded from files follow the files, so a
// certificate cert-manager renews is used from the next handshake on.
type Credentials struct {
	service string
	files   *Files

	mu      sync.Mutex
	mat     *material
	checked time.Time
	mtimes  [3]time.Time
}

// reloadEvery bounds how often file-backed credentials look for changes.
const reloadEvery = 5 * time.Second

// LoadFiles loads credentials from PEM files and follows changes to them.
// The certificate must name exactly one service (URI SAN
// spiffe://v0m3/service/<name>).
func LoadFiles(f Files) (*Credentials, error) {
	c := &Credentials{files: &f}
	m, mt, err := f.load()
	if err != nil {
		return nil, err
	}
	c.mat, c.mtimes, c.checked = m, mt, time.Now()
	c.service = m.service
	return c, nil
}

func (f Files) load() (*material, [3]time.Time, error) {
	var mt [3]time.Time
	var data [3][]byte
	for i, p := range []string{f.CA, f.Cert, f.Key} {
		st, err := os.Stat(p)
		if err != nil {
			return nil, mt, fmt.Errorf("identity: %w", err)
		}
		mt[i] = st.ModTime()
		if data[i], err = os.ReadFile(p); err != nil {
			return nil, mt, fmt.Errorf("identity: %w", err)
		}
	}
	m, err := parseMaterial(data[0], data[1], data[2])
	return m, mt, err
}

// current returns the material in force, reloading changed files. A file
// that fails to load keeps the previous material: a half-written renewal
// never takes a service down.
func (c *Credentials) current() *material {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.files == nil || time.Since(c.checked) < reloadEvery {
		return c.mat
	}
	c.checked = time.Now()
	changed := false
	for i, p := range []string{c.files.CA, c.files.Cert, c.files.Key} {
		if st, err := os.Stat(p); err == nil && !st.ModTime().Equal(c.mtimes[i]) {
			changed = true
		}
	}
	if changed {
		if m, mt, err := c.files.load(); err == nil && m.service == c.service {
			c.mat, c.mtimes = m, mt
		}
	}
	return c.mat
}

// Leaf returns the certificate in force.
func (c *Credentials) Leaf() *x509.Certificate { return c.current().leaf }

// Service returns the service these credentials name.
func (c *Credentials) Service() string { return c.service }

// Roots returns the CA certificates these credentials trust.
func (c *Credentials) Roots() *x509.CertPool { return c.current().roots }

// ServerTLS returns the TLS configuration of a V0M3 server: it presents the
// service certificate, verifies a client certificate when one is given
// (peers) and accepts clients without one (bearer-token callers), whom the
// guard then authenticates per RPC.
func (c *Credentials) ServerTLS() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			m := c.current()
			return &tls.Config{
				MinVersion:   tls.VersionTLS13,
				Certificates: []tls.Certificate{m.cert},
				ClientAuth:   tls.VerifyClientCertIfGiven,
				ClientCAs:    m.roots,
			}, nil
		},
	}
}

// ClientTLS returns the TLS configuration for calling the V0M3 service
// want: it presents this service's certificate and accepts only a server
// certificate from the trusted CA that names want. The service identity,
// not the host name, is what is checked, so the same certificate works
// behind any address.
func (c *Credentials) ClientTLS(want string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			m := c.current()
			return &m.cert, nil
		},
		// Host names are not how services know each other; VerifyConnection
		// checks the chain and the service name instead.
		InsecureSkipVerify: true, //nolint:gosec // verified in VerifyConnection
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, err := c.verifyPeer(cs.PeerCertificates, x509.ExtKeyUsageServerAuth, want)
			return err
		},
	}
}

// verifyPeer verifies a presented chain against the trusted CA and returns
// the service its leaf names; want, when set, must be that service.
func (c *Credentials) verifyPeer(chain []*x509.Certificate, usage x509.ExtKeyUsage, want ...string) (string, error) {
	if len(chain) == 0 {
		return "", errors.New("identity: the peer presented no certificate")
	}
	opts := x509.VerifyOptions{Roots: c.current().roots, Intermediates: x509.NewCertPool(), KeyUsages: []x509.ExtKeyUsage{usage}}
	for _, ic := range chain[1:] {
		opts.Intermediates.AddCert(ic)
	}
	if _, err := chain[0].Verify(opts); err != nil {
		return "", fmt.Errorf("identity: peer certificate: %w", err)
	}
	svc := ServiceOf(chain[0])
	if svc == "" {
		return "", errors.New("identity: the peer certificate names no V0M3 service")
	}
	if len(want) > 0 && want[0] != "" && !slices.Contains(want, svc) {
		return "", fmt.Errorf("identity: the peer is %s, not %s", svc, strings.Join(want, " or "))
	}
	return svc, nil
}
