package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestServiceRefusesToStartWithoutIdentity: a single service needs its
// certificate; plaintext only with the explicit development flag, which
// it then logs loudly.
func TestServiceRefusesToStartWithoutIdentity(t *testing.T) {
	t.Parallel()
	var stderr bytes.Buffer
	err := run(context.Background(), []string{"registry", "--listen", "127.0.0.1:0", "--data-dir", t.TempDir()}, &bytes.Buffer{}, &stderr)
	var ue usageError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "--tls-ca-file") || !strings.Contains(err.Error(), "--insecure-plaintext") {
		t.Fatalf("registry without certificates: %v, want a usage error naming the TLS flags and the development flag", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	stderr.Reset()
	err = run(ctx, []string{"registry", "--listen", "127.0.0.1:0", "--data-dir", t.TempDir(), "--insecure-plaintext"}, &bytes.Buffer{}, &stderr)
	if err != nil {
		t.Fatalf("registry --insecure-plaintext: %v", err)
	}
	if !strings.Contains(stderr.String(), "INSECURE") {
		t.Fatalf("plaintext was not logged loudly:\n%s", stderr.String())
	}
}
