package adapter

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/prototext"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/oidctest"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// The OAuth tests run the adapter against a real authorization server (Ory
// Hydra, internal/oidctest) and a go-sdk MCP server protected by
// the go-sdk's auth.RequireBearerToken, which verifies Hydra's signed JWT
// access tokens against Hydra's published keys.

// Scopes of the protected server: reading needs search:read, the admin
// tool needs search:admin too (asked for by a step-up challenge).
const (
	scopeRead  = "search:read"
	scopeAdmin = "search:admin"
)

// protectedServer is a go-sdk MCP server behind bearer-token verification.
type protectedServer struct {
	url string // the MCP endpoint

	mu       sync.Mutex
	tokens   []string // distinct access tokens that verified, in order
	refusals []int    // HTTP status of every refused request, in order
	admin    atomic.Int64
}

func (p *protectedServer) distinctTokens() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.tokens)
}

func (p *protectedServer) refused() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.refusals)
}

// serveProtected starts the server. Its protected resource metadata names
// authServers; tokens must come from hydra.
func serveProtected(t *testing.T, hydra *oidctest.Server, authServers ...string) *protectedServer {
	t.Helper()
	p := &protectedServer{}
	srv := mcp.NewServer(&mcp.Implementation{Name: "protected-search", Version: "1"}, nil)
	type noArgs struct{}
	mcp.AddTool(srv, &mcp.Tool{Name: "lookup", Description: "reads"}, func(context.Context, *mcp.CallToolRequest, noArgs) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "found"}}}, nil, nil
	})
	mcp.AddTool(srv, &mcp.Tool{Name: "admin", Description: "needs more scope"}, func(context.Context, *mcp.CallToolRequest, noArgs) (*mcp.CallToolResult, any, error) {
		p.admin.Add(1)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}, nil, nil
	})
	keys := oidc.NewRemoteKeySet(context.Background(), hydra.JWKSURL())
	verifier := oidc.NewVerifier(hydra.Issuer(), keys, &oidc.Config{SkipClientIDCheck: true})
	verify := func(ctx context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		tok, err := verifier.Verify(ctx, token)
		if err != nil {
			return nil, auth.ErrInvalidToken
		}
		var claims struct {
			Scopes []string `json:"scp"`
		}
		if err := tok.Claims(&claims); err != nil {
			return nil, auth.ErrInvalidToken
		}
		p.mu.Lock()
		if !slices.Contains(p.tokens, token) {
			p.tokens = append(p.tokens, token)
		}
		p.mu.Unlock()
		return &auth.TokenInfo{Scopes: claims.Scopes, Expiration: tok.Expiry, UserID: tok.Subject}, nil
	}
	mux := http.NewServeMux()
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	p.url = ts.URL + "/mcp"
	metadataURL := ts.URL + "/.well-known/oauth-protected-resource/mcp"
	mux.Handle("/.well-known/oauth-protected-resource/mcp", auth.ProtectedResourceMetadataHandler(&oauthex.ProtectedResourceMetadata{
		Resource: p.url, AuthorizationServers: authServers, ScopesSupported: []string{scopeRead}}))
	// The admin tool asks for more scope by a step-up challenge
	// (insufficient_scope), as the MCP specification describes.
	stepUp := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			var msg struct {
				Method string `json:"method"`
				Params struct {
					Name string `json:"name"`
				} `json:"params"`
			}
			_ = json.Unmarshal(body, &msg)
			if msg.Method == "tools/call" && msg.Params.Name == "admin" && !slices.Contains(auth.TokenInfoFromContext(r.Context()).Scopes, scopeAdmin) {
				w.Header().Set("WWW-Authenticate", `Bearer error="insufficient_scope", scope="`+scopeRead+" "+scopeAdmin+`", resource_metadata="`+metadataURL+`"`)
				http.Error(w, "insufficient scope", http.StatusForbidden)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
	handler := auth.RequireBearerToken(verify, &auth.RequireBearerTokenOptions{ResourceMetadataURL: metadataURL, Scopes: []string{scopeRead}})(
		stepUp(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)))
	mux.Handle("/mcp", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w}
		handler.ServeHTTP(rec, r)
		if rec.status == http.StatusUnauthorized || rec.status == http.StatusForbidden {
			p.mu.Lock()
			p.refusals = append(p.refusals, rec.status)
			p.mu.Unlock()
		}
	}))
	return p
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// oauthConn registers a client_credentials connection to url whose secret
// is read from a file.
func oauthConn(t *testing.T, e *env, url, clientID, secret, issuer string, scopes ...string) *registryv1.Connection {
	t.Helper()
	return e.registry.add(&registryv1.Connection{DisplayName: "protected search", Transport: &registryv1.Transport{
		Kind: &registryv1.Transport_StreamableHttp{StreamableHttp: &registryv1.StreamableHTTPTransport{Url: url, Oauth: &registryv1.OAuthClient{
			Grant: registryv1.OauthGrant_OAUTH_GRANT_CLIENT_CREDENTIALS, ClientId: clientID, ClientSecretRef: e.plant(secret),
			Issuer: issuer, Scopes: scopes}}},
	}})
}

// syncLog collects the adapter's log.
type syncLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// A client_credentials connection discovers the server's protected
// resource metadata and Hydra, gets a token once and reuses it across
// sessions and calls; the secret and the token appear in no log, response,
// snapshot or trace.
func TestOAuthClientCredentials(t *testing.T) {
	t.Parallel()
	hydra := oidctest.Start(t)
	p := serveProtected(t, hydra, hydra.Issuer())
	client := hydra.CreateClient(t, oidctest.Client{Scopes: []string{scopeRead, scopeAdmin}})
	logs := &syncLog{}
	e := newEnvLog(t, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	conn := oauthConn(t, e, p.url, client.ID, client.Secret, hydra.Issuer())
	ctx := testkit.AsService(t.Context(), identity.Operator)

	var out []string
	for range 2 { // each Discover opens a session of its own
		snap, err := e.srv.Discover(ctx, &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()})
		if err != nil {
			t.Fatalf("Discover: %v", err)
		}
		if len(snap.GetTools()) != 2 {
			t.Fatalf("discovered %d tools, want 2", len(snap.GetTools()))
		}
		out = append(out, prototext.Format(snap))
	}
	for i := range 2 {
		req := call(t, conn, "lookup", map[string]any{}, nil)
		req.AttemptId = req.AttemptId + string(rune('a'+i))
		resp := execute(t, e, req)
		if resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
			t.Fatalf("Execute: outcome %v error %v", resp.GetOutcome(), resp.GetError())
		}
		out = append(out, prototext.Format(resp))
	}
	tokens := p.distinctTokens()
	if len(tokens) != 1 {
		t.Errorf("the server saw %d distinct tokens over 2 discoveries and 2 calls, want 1 reused token", len(tokens))
	}
	// One 401 (the first request ever, without a token); none after.
	if got := p.refused(); !slices.Equal(got, []int{http.StatusUnauthorized}) {
		t.Errorf("refused statuses = %v, want one 401", got)
	}
	e.evidence.mu.Lock()
	for _, ev := range e.evidence.events {
		out = append(out, prototext.Format(ev))
	}
	e.evidence.mu.Unlock()
	out = append(out, logs.String())
	for _, secret := range append([]string{client.Secret}, tokens...) {
		for _, o := range out {
			if strings.Contains(o, secret) {
				t.Fatalf("a secret or token leaked into %q", truncate(o, 300))
			}
		}
	}
	if !strings.Contains(logs.String(), "oauth: token obtained") {
		t.Errorf("the log does not record the token grant (without the token): %s", logs.String())
	}
}

// A token that expires is replaced before it is sent: Hydra's tokens of a
// 10s lifespan are stale at once for the client library (it renews 10s
// early), so every new session carries a fresh token and the server never
// has to refuse an expired one.
func TestOAuthTokenRefreshedOnExpiry(t *testing.T) {
	t.Parallel()
	hydra := oidctest.Start(t)
	p := serveProtected(t, hydra, hydra.Issuer())
	client := hydra.CreateClient(t, oidctest.Client{Scopes: []string{scopeRead}, AccessTokenLifespan: 10 * time.Second})
	e := newEnv(t)
	conn := oauthConn(t, e, p.url, client.ID, client.Secret, hydra.Issuer(), scopeRead)
	for range 2 {
		if _, err := e.srv.Discover(testkit.AsService(t.Context(), identity.Operator), &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()}); err != nil {
			t.Fatalf("Discover: %v", err)
		}
	}
	if n := len(p.distinctTokens()); n < 2 {
		t.Errorf("the server saw %d distinct tokens; want a new one after expiry", n)
	}
	if got := p.refused(); !slices.Equal(got, []int{http.StatusUnauthorized}) {
		t.Errorf("refused statuses = %v, want only the first 401", got)
	}
}

// Step-up: a tool that needs more scope answers 403 insufficient_scope;
// the adapter asks Hydra for the union of what it had and what the
// challenge names, and the call is retried once. A client Hydra will not
// grant the scope to ends with INSUFFICIENT_SCOPE, the tool never ran.
func TestOAuthStepUp(t *testing.T) {
	t.Parallel()
	hydra := oidctest.Start(t)
	tests := []struct {
		name     string
		allowed  []string
		wantCode string
	}{
		{name: "granted", allowed: []string{scopeRead, scopeAdmin}},
		{name: "refused", allowed: []string{scopeRead}, wantCode: CodeInsufficientScope},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := serveProtected(t, hydra, hydra.Issuer())
			client := hydra.CreateClient(t, oidctest.Client{Scopes: tt.allowed})
			e := newEnv(t)
			conn := oauthConn(t, e, p.url, client.ID, client.Secret, hydra.Issuer(), scopeRead)
			resp := execute(t, e, call(t, conn, "admin", map[string]any{}, nil))
			if tt.wantCode == "" {
				if resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK || p.admin.Load() != 1 {
					t.Fatalf("outcome %v error %v; admin ran %d times", resp.GetOutcome(), resp.GetError(), p.admin.Load())
				}
				if n := len(p.distinctTokens()); n != 2 {
					t.Errorf("%d distinct tokens, want 2 (read, then read+admin)", n)
				}
				return
			}
			wantFailure(t, resp, adapterv1.Outcome_OUTCOME_FORBIDDEN, tt.wantCode)
			if !strings.Contains(resp.GetError().GetUntrustedDetail(), "insufficient_scope") || !strings.Contains(resp.GetError().GetAdapterDetail(), "invalid_scope") {
				t.Errorf("error = %v; want the server's challenge as untrusted detail and Hydra's refusal named", resp.GetError())
			}
			if p.admin.Load() != 0 {
				t.Errorf("the admin tool ran %d times", p.admin.Load())
			}
		})
	}
}

// Refusals: a wrong secret is AUTHENTICATION_REQUIRED after a single
// refused request (no blind retries), with the server's challenge as
// untrusted detail and without the secret; a connection whose issuer is
// not the one the server names, or a server that names an attacker's
// authorization server, gets AUTHORIZATION_SERVER_MISMATCH before any
// credential is sent: the attacker hears nothing, no token is issued.
func TestOAuthRefusals(t *testing.T) {
	t.Parallel()
	hydra := oidctest.Start(t)
	client := hydra.CreateClient(t, oidctest.Client{Scopes: []string{scopeRead}})
	var attackerHits atomic.Int64
	attacker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		attackerHits.Add(1)
		http.NotFound(w, nil)
	}))
	t.Cleanup(attacker.Close)
	tests := []struct {
		name        string
		authServers []string // what the server's metadata names
		secret      string
		issuer      string // the connection's
		wantReason  string
	}{
		{name: "wrong secret", authServers: []string{hydra.Issuer()}, secret: "not-the-secret-0123456789", issuer: hydra.Issuer(),
			wantReason: CodeAuthenticationRequired},
		{name: "connection expects another issuer", authServers: []string{hydra.Issuer()}, secret: client.Secret, issuer: attacker.URL,
			wantReason: CodeAuthorizationServerMismatch},
		{name: "server names an attacker's authorization server", authServers: []string{attacker.URL}, secret: client.Secret, issuer: hydra.Issuer(),
			wantReason: CodeAuthorizationServerMismatch},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := serveProtected(t, hydra, tt.authServers...)
			logs := &syncLog{}
			e := newEnvLog(t, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
			conn := oauthConn(t, e, p.url, client.ID, tt.secret, tt.issuer)
			before := attackerHits.Load()
			_, err := e.srv.Discover(testkit.AsService(t.Context(), identity.Operator), &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()})
			if !apierror.Is(err, codes.FailedPrecondition, tt.wantReason) {
				t.Fatalf("Discover error = %v, want FAILED_PRECONDITION %s", err, tt.wantReason)
			}
			if md := apierror.Info(err).GetMetadata(); !strings.Contains(md["untrusted_challenge"], "resource_metadata=") {
				t.Errorf("metadata = %v; want the server's challenge as untrusted detail", md)
			}
			resp := execute(t, e, call(t, conn, "lookup", map[string]any{}, nil))
			wantFailure(t, resp, adapterv1.Outcome_OUTCOME_FORBIDDEN, tt.wantReason)
			if got := p.refused(); len(got) != 2 || got[0] != http.StatusUnauthorized || got[1] != http.StatusUnauthorized {
				t.Errorf("refused statuses = %v, want one 401 per operation (no retries)", got)
			}
			if n := len(p.distinctTokens()); n != 0 {
				t.Errorf("the server accepted %d tokens", n)
			}
			if attackerHits.Load() != before {
				t.Errorf("the attacker's server was contacted %d times", attackerHits.Load()-before)
			}
			for _, o := range []string{err.Error(), prototext.Format(resp), logs.String()} {
				if strings.Contains(o, tt.secret) || strings.Contains(o, client.Secret) {
					t.Fatalf("the secret leaked into %q", truncate(o, 300))
				}
			}
		})
	}
}

// A server that refuses a static bearer credential is
// AUTHENTICATION_REQUIRED after one request, not SERVER_UNREACHABLE after
// three: retrying cannot fix a refused credential. The challenge is
// untrusted detail, scrubbed of the credential the server echoes in it.
func TestStaticCredentialRefused(t *testing.T) {
	t.Parallel()
	const token = "static-token-5f2c9a17e3"
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token", error_description="token `+strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")+` revoked"`)
		http.Error(w, "no", http.StatusUnauthorized)
	}))
	t.Cleanup(srv.Close)
	e := newEnv(t)
	conn := e.httpConn(srv.URL + "/mcp")
	conn.CredentialRef = e.plant(token)
	e.registry.add(conn)
	_, err := e.srv.Discover(testkit.AsService(t.Context(), identity.Operator), &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()})
	if !apierror.Is(err, codes.FailedPrecondition, CodeAuthenticationRequired) {
		t.Fatalf("Discover error = %v, want FAILED_PRECONDITION %s", err, CodeAuthenticationRequired)
	}
	resp := execute(t, e, call(t, conn, "search", map[string]any{}, nil))
	wantFailure(t, resp, adapterv1.Outcome_OUTCOME_FORBIDDEN, CodeAuthenticationRequired)
	detail := resp.GetError().GetUntrustedDetail()
	if !strings.Contains(detail, "invalid_token") || strings.Contains(detail, token) || strings.Contains(err.Error(), token) ||
		strings.Contains(apierror.Info(err).GetMetadata()["untrusted_challenge"], token) {
		t.Errorf("challenge detail %q / error %v: want the challenge without the token", detail, err)
	}
	// Each operation sent its first request only (the client library's
	// version fallback may add one more); never three attempts.
	if n := hits.Load(); n > 4 {
		t.Errorf("the server was asked %d times over two operations", n)
	}
}
