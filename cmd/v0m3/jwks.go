package main

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"os"

	"github.com/v0m3/v0m3/internal/identity"
)

// runJWKS prints the JWKS an OAuth authorization server needs to verify
// the subject tokens the orchestrator signs for token exchange: the public
// key of the orchestrator's certificate, named by its thumbprint. It reads
// the certificate only, never a key; export it again after a certificate
// rotation (or serve the file where the authorization server fetches it).
func runJWKS(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("jwks", stderr)
	certFile := fs.String("cert-file", "", "the orchestrator's certificate (PEM), e.g. its --tls-cert-file (required)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *certFile == "" {
		return usageError{"--cert-file is required"}
	}
	b, err := os.ReadFile(*certFile)
	if err != nil {
		return err
	}
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "CERTIFICATE" {
		return fmt.Errorf("%s: no PEM certificate", *certFile)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return fmt.Errorf("%s: %w", *certFile, err)
	}
	if svc := identity.ServiceOf(cert); svc != identity.Orchestrator {
		return fmt.Errorf("%s names the %q service; subject tokens are signed by the orchestrator's certificate", *certFile, svc)
	}
	ks, err := identity.CertificateJWKS(cert)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(ks)
}
