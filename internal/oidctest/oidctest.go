// Package oidctest starts a real OAuth 2.0 / OpenID Connect authorization
// server for tests: Ory Hydra, built from the Go module proxy by
// scripts/hydra.sh, run as a child process on loopback ports with an
// in-memory store. Tests register OAuth 2.0 clients through Hydra's admin API
// and fetch real, signed JWT access tokens over HTTP with the
// client_credentials grant, so bearer-token verification is proven against
// an issuer the verifier did not write.
//
// Hydra issues a client_credentials access token as a JWT (RS256, key in the
// issuer's JWKS) with these claims:
//
//	iss        the issuer, exactly Server.Issuer()
//	sub        the client ID
//	client_id  the client ID
//	aud        the audiences the token request asked for (and the client may
//	           have); an empty array when none was asked for
//	scp        the granted scopes, an array
//	exp, iat, nbf, jti
//	ext        the per-client extra claims (Client.Claims), nested
//
// Hydra has no per-client setting for extra claims: they come from its token
// hook, which this package serves in-process (Hydra's documented extension
// point, called by Hydra for every token it issues). Extra claims named in
// WithTopLevelClaims (default "groups") are also copied to the top level,
// where a verifier reads them; the rest appear only under "ext".
package oidctest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/clientcredentials"

	"github.com/v0m3/v0m3/internal/testkit"
)

// BinaryEnv names the environment variable that holds the hydra binary's
// path; the Makefile sets it from scripts/hydra.sh.
const BinaryEnv = "V0M3_HYDRA"

// startTimeout bounds how long Hydra may take to become ready. It is
// generous because the test machine has two cores shared by several builds.
const startTimeout = 90 * time.Second

// Server is a running Hydra. Its methods are safe for concurrent use.
type Server struct {
	issuer string // exactly as Hydra writes it into iss
	public string // public API root, no trailing slash
	admin  string // admin API root, no trailing slash
	http   *http.Client

	hookKey string // Hydra's credential at the token hook

	mu     sync.Mutex
	claims map[string]map[string]any // client ID -> extra access-token claims
}

// Option changes how Start configures Hydra.
type Option func(*config)

type config struct {
	topLevelClaims []string
}

// WithTopLevelClaims names the extra claims (see Client.Claims) that Hydra
// copies to the top level of access tokens, replacing the default
// {"groups"}. Hydra never lets them override a registered claim (iss, sub,
// aud, exp, nbf, iat, jti, client_id, scp, ext).
func WithTopLevelClaims(names ...string) Option {
	return func(c *config) { c.topLevelClaims = names }
}

// Binary returns the path of the hydra binary: $V0M3_HYDRA, else where
// `scripts/hydra.sh --path` says it is cached. When it is missing the test
// is skipped with a message naming the build command, or fails when the CI
// environment variable is set (CI builds it first: `make hydra`).
func Binary(t testing.TB) string {
	t.Helper()
	testkit.NeedsExternal(t, "the Ory Hydra authorization server (make hydra)")
	bin := os.Getenv(BinaryEnv)
	if bin == "" {
		script, err := findScript()
		if err != nil {
			t.Fatalf("oidctest: %v", err)
		}
		out, err := exec.Command("bash", script, "--path").Output()
		if err != nil {
			t.Fatalf("oidctest: %s --path: %v", script, err)
		}
		bin = strings.TrimSpace(string(out))
	}
	if _, err := os.Stat(bin); err != nil {
		msg := fmt.Sprintf("the Hydra authorization server is not built at %s (%v); run `bash scripts/hydra.sh` (or `make hydra`) to build it", bin, err)
		if os.Getenv("CI") == "" {
			t.Skip("SKIPPING A TEST THAT NEEDS A REAL AUTHORIZATION SERVER: " + msg)
		}
		t.Fatal(msg)
	}
	return bin
}

// findScript finds scripts/hydra.sh in the working directory or one of its
// parents, since tests run in their own package's directory.
func findScript() (string, error) {
	p, err := testkit.Script("hydra.sh")
	if err != nil {
		return "", fmt.Errorf("%w; set %s", err, BinaryEnv)
	}
	return p, nil
}

// Start runs a fresh Hydra (its own in-memory store, signing keys and
// loopback ports) for the test and stops it when the test ends. Hydra's log
// is written to the test log if the test fails.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	cfg := config{topLevelClaims: []string{"groups"}}
	for _, o := range opts {
		o(&cfg)
	}
	bin := Binary(t)

	s := &Server{
		http:    &http.Client{Timeout: 30 * time.Second},
		hookKey: randomHex(t, 16),
		claims:  map[string]map[string]any{},
	}
	hook := &http.Server{Handler: http.HandlerFunc(s.tokenHook), ReadHeaderTimeout: 10 * time.Second}
	hookLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("oidctest: token hook listener: %v", err)
	}
	go hook.Serve(hookLn) //nolint:errcheck // ends with Close below
	t.Cleanup(func() { hook.Close() })

	// Free ports are picked before Hydra binds them, so another process may
	// take one in between; Hydra then exits and another pair is tried.
	var startErr error
	for attempt := 0; attempt < 3; attempt++ {
		startErr = s.run(t, bin, cfg, "http://"+hookLn.Addr().String()+"/token-hook")
		if !errors.Is(startErr, errExited) {
			break
		}
	}
	if startErr != nil {
		t.Fatalf("oidctest: start hydra: %v", startErr)
	}
	return s
}

// errExited marks a Hydra that exited while starting (e.g. its port was
// taken), which a retry on other ports may cure.
var errExited = errors.New("hydra exited before it was ready")

// run starts Hydra once on fresh ports and waits until both its APIs are
// ready. On failure it leaves no process behind.
func (s *Server) run(t testing.TB, bin string, cfg config, hookURL string) error {
	t.Helper()
	publicPort, adminPort := freePorts(t)
	s.issuer = "http://127.0.0.1:" + strconv.Itoa(publicPort) + "/"
	s.public = "http://127.0.0.1:" + strconv.Itoa(publicPort)
	s.admin = "http://127.0.0.1:" + strconv.Itoa(adminPort)

	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return err
	}
	// A config file rather than environment variables: the child gets an
	// empty environment, so a developer's DSN or SECRETS_SYSTEM cannot leak
	// into (or out of) the test.
	conf := map[string]any{
		"dsn": "memory",
		"log": map[string]any{"level": "info", "format": "text"},
		"serve": map[string]any{
			"public": map[string]any{"host": "127.0.0.1", "port": publicPort},
			"admin":  map[string]any{"host": "127.0.0.1", "port": adminPort},
		},
		"urls":       map[string]any{"self": map[string]any{"issuer": s.issuer}},
		"secrets":    map[string]any{"system": []string{hex.EncodeToString(secret)}},
		"strategies": map[string]any{"access_token": "jwt"},
		"oauth2": map[string]any{
			"token_hook": map[string]any{
				"url": hookURL,
				"auth": map[string]any{"type": "api_key", "config": map[string]any{
					"in": "header", "name": hookKeyHeader, "value": s.hookKey,
				}},
			},
			"allowed_top_level_claims": cfg.topLevelClaims,
			"mirror_top_level_claims":  true,
		},
	}
	dir := t.TempDir()
	confPath := filepath.Join(dir, "hydra.json")
	b, err := json.Marshal(conf)
	if err != nil {
		return err
	}
	if err := os.WriteFile(confPath, b, 0o600); err != nil {
		return err
	}

	// --dev allows the plain-HTTP loopback issuer; --sqa-opt-out stops
	// Hydra's usage telemetry, which would try to reach the internet.
	cmd := exec.Command(bin, "serve", "all", "--dev", "--sqa-opt-out", "--config", confPath)
	cmd.Env = []string{"HOME=" + dir}
	cmd.Dir = dir
	cmd.SysProcAttr = procAttr()
	logs := &testkit.SyncBuffer{}
	cmd.Stdout = logs
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", bin, err)
	}
	// exited is closed once Hydra is reaped; waitErr is then its status.
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	stop := func() {
		_ = cmd.Process.Kill()
		<-exited
	}

	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	err = s.waitReady(ctx, exited)
	if err == nil {
		// Reading the key set has Hydra make its signing keys (ID and
		// JWT access tokens) now: it makes them on first use, which
		// takes seconds on a loaded machine (RSA), and a test's first
		// token request must not wait for that under its own deadline.
		_, err = s.fetchJWKS(ctx)
	}
	if err != nil {
		stop()
		if errors.Is(err, errExited) {
			err = fmt.Errorf("%w (%v)", err, waitErr)
		}
		return fmt.Errorf("%w\nhydra log:\n%s", err, logs.String())
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("hydra log (%s):\n%s", s.issuer, logs.String())
		}
	})
	return nil
}

// fetchJWKS reads the issuer's public JSON Web Key Set document.
func (s *Server) fetchJWKS(ctx context.Context) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.JWKSURL(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("oidctest: get JWKS: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("oidctest: get JWKS: %s %v: %s", resp.Status, err, b)
	}
	return b, nil
}

// waitReady polls both APIs' readiness endpoints until they answer 200,
// Hydra exits, or ctx ends.
func (s *Server) waitReady(ctx context.Context, exited <-chan struct{}) error {
	for _, u := range []string{s.public + "/health/ready", s.admin + "/health/ready"} {
		for {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
			if err != nil {
				return err
			}
			resp, err := s.http.Do(req)
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			select {
			case <-exited:
				return errExited
			case <-ctx.Done():
				return fmt.Errorf("hydra not ready at %s: %w", u, ctx.Err())
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nil
}

// freePorts returns two distinct loopback ports below the ephemeral range
// that were free a moment ago (see testkit.ListenLoopback).
func freePorts(t testing.TB) (public, admin int) {
	t.Helper()
	a, b := testkit.ListenLoopback(t), testkit.ListenLoopback(t)
	defer a.Close()
	defer b.Close()
	return a.Addr().(*net.TCPAddr).Port, b.Addr().(*net.TCPAddr).Port
}

// Issuer returns the issuer URL exactly as it appears in tokens' iss claim
// and in the discovery document (it ends with "/").
func (s *Server) Issuer() string { return s.issuer }

// JWKSURL returns the URL of the issuer's public signing keys.
func (s *Server) JWKSURL() string { return s.public + "/.well-known/jwks.json" }

// TokenURL returns the OAuth 2.0 token endpoint.
func (s *Server) TokenURL() string { return s.public + "/oauth2/token" }

// AdminURL returns the root of Hydra's admin API, for what this package does
// not wrap (e.g. POST /admin/keys/hydra.jwt.access-token to rotate keys).
func (s *Server) AdminURL() string { return s.admin }

// JWKS returns the issuer's public JSON Web Key Set document, for a test
// that hands a verifier a key file instead of the URL.
func (s *Server) JWKS(t testing.TB) []byte {
	t.Helper()
	b, err := s.fetchJWKS(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Client is an OAuth 2.0 client registered with Hydra for the
// client_credentials grant.
type Client struct {
	// ID is the client ID, and so the sub claim of its tokens. Empty means
	// a random one.
	ID string
	// Secret authenticates the client at the token endpoint
	// (client_secret_basic). Empty means a random one.
	Secret string
	// Audience lists the audiences the client may ask for.
	Audience []string
	// Scopes lists the scopes the client may ask for.
	Scopes []string
	// Claims are extra claims put into every access token issued to the
	// client, e.g. {"groups": []string{"admins"}}. Only those named in
	// WithTopLevelClaims appear at the top level; all appear under "ext".
	Claims map[string]any
	// AccessTokenLifespan overrides Hydra's default of one hour, e.g. a
	// second for a test of expired tokens. Zero keeps the default.
	AccessTokenLifespan time.Duration
	// Opaque makes Hydra issue opaque (non-JWT) access tokens to this
	// client, for a test that such a token is refused.
	Opaque bool
}

// CreateClient registers c through the admin API and returns it with ID and
// Secret filled in.
func (s *Server) CreateClient(t testing.TB, c Client) Client {
	t.Helper()
	if c.ID == "" {
		c.ID = "client-" + randomHex(t, 8)
	}
	if c.Secret == "" {
		c.Secret = randomHex(t, 24)
	}
	body := map[string]any{
		"client_id":                  c.ID,
		"client_secret":              c.Secret,
		"grant_types":                []string{"client_credentials"},
		"response_types":             []string{"token"},
		"token_endpoint_auth_method": "client_secret_basic",
		"audience":                   nonNil(c.Audience),
		"scope":                      strings.Join(c.Scopes, " "),
		"access_token_strategy":      "jwt",
	}
	if c.Opaque {
		body["access_token_strategy"] = "opaque"
	}
	if c.AccessTokenLifespan > 0 {
		body["client_credentials_grant_access_token_lifespan"] = c.AccessTokenLifespan.String()
	}
	// The claims are in place before the client exists, so no token is ever
	// issued without them.
	if c.Claims != nil {
		s.mu.Lock()
		s.claims[c.ID] = c.Claims
		s.mu.Unlock()
	}
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatalf("oidctest: encode client: %v", err)
	}
	resp, err := s.http.Post(s.admin+"/admin/clients", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatalf("oidctest: create client %s: %v", c.ID, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		msg, _ := io.ReadAll(resp.Body)
		t.Fatalf("oidctest: create client %s: %s: %s", c.ID, resp.Status, msg)
	}
	return c
}

// Token fetches an access token for c with the client_credentials grant,
// asking for the given audiences and scopes, and fails the test on error.
func (s *Server) Token(t testing.TB, c Client, audience []string, scopes ...string) string {
	t.Helper()
	tok, err := s.FetchToken(context.Background(), c.ID, c.Secret, audience, scopes...)
	if err != nil {
		t.Fatalf("oidctest: token for %s: %v", c.ID, err)
	}
	return tok
}

// FetchToken asks the token endpoint for a client_credentials access token
// and returns Hydra's refusal as an error (a *oauth2.RetrieveError), for
// tests that expect one.
func (s *Server) FetchToken(ctx context.Context, clientID, secret string, audience []string, scopes ...string) (string, error) {
	cc := clientcredentials.Config{
		ClientID:     clientID,
		ClientSecret: secret,
		TokenURL:     s.TokenURL(),
		Scopes:       scopes,
		AuthStyle:    oauth2.AuthStyleInHeader,
	}
	if len(audience) > 0 {
		cc.EndpointParams = url.Values{"audience": {strings.Join(audience, " ")}}
	}
	tok, err := cc.Token(context.WithValue(ctx, oauth2.HTTPClient, s.http))
	if err != nil {
		return "", err
	}
	return tok.AccessToken, nil
}

// hookKeyHeader carries Hydra's credential at the token hook.
const hookKeyHeader = "X-Hook-Key"

// tokenHook is Hydra's token hook: it answers each token request with the
// extra claims registered for the client, or 204 (no change) when none are.
// Only Hydra, which holds the key, is answered.
func (s *Server) tokenHook(w http.ResponseWriter, r *http.Request) {
	if subtle.ConstantTimeCompare([]byte(r.Header.Get(hookKeyHeader)), []byte(s.hookKey)) != 1 {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	var req struct {
		Request struct {
			ClientID string `json:"client_id"`
		} `json:"request"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	claims, ok := s.claims[req.Request.ClientID]
	s.mu.Unlock()
	if !ok {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"session": map[string]any{"access_token": claims},
	})
}

func randomHex(t testing.TB, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatalf("oidctest: random: %v", err)
	}
	return hex.EncodeToString(b)
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return slices.Clone(s)
}
