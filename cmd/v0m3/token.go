package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/v0m3/v0m3/internal/identity"
)

// runToken prints a development bearer token that a `v0m3 dev` on the same
// data directory accepts. It is a convenience for trying the API, not an
// authorization server: clusters use their OIDC issuer or ServiceAccount
// tokens.
func runToken(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("token", stderr)
	dataDir := fs.String("data-dir", "./.v0m3-data", "data directory of the `v0m3 dev` that should accept the token")
	pkiDir := fs.String("pki-dir", "", "its --pki-dir, when it was given one (default <data-dir>/pki)")
	subject := fs.String("subject", "", "who the token names (sub), e.g. alice")
	groups := fs.String("groups", "", "comma-separated groups, e.g. authors or platform,reviewers")
	ttl := fs.Duration("ttl", time.Hour, "lifetime of the token")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *subject == "" {
		return usageError{"--subject is required"}
	}
	if *pkiDir == "" {
		*pkiDir = filepath.Join(*dataDir, "pki")
	}
	iss, err := identity.LoadDevIssuer(*pkiDir)
	if err != nil {
		return fmt.Errorf("%w (is `v0m3 dev --data-dir %s` running?)", err, *dataDir)
	}
	var gs []string
	for _, g := range strings.Split(*groups, ",") {
		if g = strings.TrimSpace(g); g != "" {
			gs = append(gs, g)
		}
	}
	tok, err := iss.Mint(*subject, gs, *ttl)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, tok)
	return nil
}
