package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/oauthex"

	"github.com/v0m3/v0m3/demo/scenario"
	"github.com/v0m3/v0m3/internal/exchangetest"
	"github.com/v0m3/v0m3/internal/grant"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/orchestrator/taskmcp"
	"github.com/v0m3/v0m3/suite"
)

// callers records the token subject of each MCP method that reached the
// fixture through the bearer-token gate.
type callers struct {
	mu sync.Mutex
	by map[string][]string // method -> subjects, in order
}

func (c *callers) of(method string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.by[method])
}

// gateFixture fronts the HTTP fixture at target with the go-sdk's
// RequireBearerToken, accepting only as's JWT access tokens, and returns
// the gate's MCP URL.
func gateFixture(t *testing.T, target string, as *exchangetest.Server, seen *callers) string {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	verifier := oidc.NewVerifier(as.Issuer(), oidc.NewRemoteKeySet(context.Background(), as.JWKSURL()), &oidc.Config{SkipClientIDCheck: true})
	verify := func(ctx context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		tok, err := verifier.Verify(ctx, token)
		if err != nil {
			return nil, auth.ErrInvalidToken
		}
		return &auth.TokenInfo{Expiration: tok.Expiry, UserID: tok.Subject}, nil
	}
	proxy := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: u.Scheme, Host: u.Host})
	record := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		var msg struct {
			Method string `json:"method"`
		}
		if json.Unmarshal(body, &msg) == nil && msg.Method != "" {
			seen.mu.Lock()
			seen.by[msg.Method] = append(seen.by[msg.Method], auth.TokenInfoFromContext(r.Context()).UserID)
			seen.mu.Unlock()
		}
		r.Header.Del("Authorization") // the fixture needs no token
		proxy.ServeHTTP(w, r)
	})
	mux := http.NewServeMux()
	gate := httptest.NewServer(mux)
	t.Cleanup(func() {
		// The adapter's pooled session keeps its standalone stream open
		// through the gate until the suite closes, which is after this:
		// Close alone would wait for it (five minutes).
		gate.CloseClientConnections()
		gate.Close()
	})
	metadata := gate.URL + "/.well-known/oauth-protected-resource/mcp"
	mux.Handle("/.well-known/oauth-protected-resource/mcp", auth.ProtectedResourceMetadataHandler(&oauthex.ProtectedResourceMetadata{
		Resource: gate.URL + "/mcp", AuthorizationServers: []string{as.Issuer()}}))
	mux.Handle("/mcp", auth.RequireBearerToken(verify, &auth.RequireBearerTokenOptions{ResourceMetadataURL: metadata})(record))
	return gate.URL + "/mcp"
}

// A task by alice on a token-exchange connection reaches the server as
// alice, through the governed path of the real services: the orchestrator
// signs her subject token into the execution grant, the adapter exchanges
// it at a real RFC 8693 authorization server that trusts the JWKS the
// orchestrator serves (on its task MCP endpoint, over TLS), and the server
// sees alice's token. Discovery, for no person, is the client itself.
func TestTokenExchangeGoverned(t *testing.T) {
	t.Parallel()
	s, err := suite.Start(context.Background(), suite.Config{DataDir: t.TempDir(), MCP: &suite.MCP{}})
	if err != nil {
		t.Fatalf("start suite: %v", err)
	}
	t.Cleanup(s.Close)
	orch, err := s.Credentials("orchestrator")
	if err != nil || orch == nil {
		t.Fatalf("orchestrator credentials: %v", err)
	}
	const clientID, secret = "v0m3-boundary", "governed-exchange-secret-0123456789"
	as := exchangetest.Start(t, exchangetest.Config{SubjectIssuer: grant.SubjectIssuer,
		SubjectJWKSURL: s.MCPURL + taskmcp.JWKSPath, SubjectJWKSRoots: orch.Roots(),
		Clients: []exchangetest.Client{{ID: clientID, Secret: secret}}})
	seen := &callers{by: map[string][]string{}}
	gate := gateFixture(t, startHTTPFixture(t), as, seen)
	tr := &registryv1.Transport{Kind: &registryv1.Transport_StreamableHttp{StreamableHttp: &registryv1.StreamableHTTPTransport{Url: gate,
		Oauth: &registryv1.OAuthClient{Grant: registryv1.OauthGrant_OAUTH_GRANT_TOKEN_EXCHANGE, ClientId: clientID,
			ClientSecretRef: "file:oauth-secret", Issuer: as.Issuer()}}}}
	// The secret goes where the adapter reads it: the connection's own
	// credential directory.
	provision := func(conn *registryv1.Connection) error {
		dir := s.CredentialDir(conn.GetId())
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, "oauth-secret"), []byte(secret), 0o600)
	}
	r, err := scenario.Run(context.Background(), s.Clients, scenario.Config{Transport: tr, As: s.As, Provision: provision})
	if err != nil {
		t.Fatalf("scenario: %v", err)
	}
	if r.Retrieval.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
		t.Fatalf("alice's retrieval ended %v", r.Retrieval.GetState())
	}
	if got := seen.of("tools/call"); !slices.Equal(got, []string{scenario.Alice.ID}) {
		t.Errorf("tools/call reached the server as %v, want once as alice", got)
	}
	if got := seen.of("tools/list"); len(got) == 0 || slices.ContainsFunc(got, func(s string) bool { return s != clientID }) {
		t.Errorf("discovery reached the server as %v, want the client %s", got, clientID)
	}
	var people []string
	for _, ex := range as.Exchanges() {
		if ex.Refused != "" {
			t.Errorf("the authorization server refused: %+v", ex)
		}
		if ex.Grant == "token_exchange" {
			people = append(people, ex.Subject)
		}
	}
	if !slices.Equal(people, []string{scenario.Alice.ID}) {
		t.Errorf("token exchanges for %v, want one for alice", people)
	}
}
