package adapter

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/exchangetest"
	"github.com/v0m3/v0m3/internal/grant"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/identity/identitytest"
	"github.com/v0m3/v0m3/internal/ids"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// The token exchange tests run the adapter against a real authorization
// server implementing RFC 8693 (exchangetest, on zitadel/oidc) that trusts
// the test orchestrator's subject tokens through its JWKS, served over
// HTTP by identity.JWKSHandler, and a go-sdk MCP server behind
// auth.RequireBearerToken that verifies the server's JWT access tokens
// and records whom each call came from.

// personServer is a protected MCP server whose whoami tool answers with
// the subject of the token it was called with.
type personServer struct {
	url string

	mu     sync.Mutex
	calls  []string // the subject of every tools/call, in order
	tokens []string // every access token that verified
}

func (p *personServer) callers() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.calls)
}

func servePerson(t *testing.T, as *exchangetest.Server) *personServer {
	t.Helper()
	p := &personServer{}
	srv := mcp.NewServer(&mcp.Implementation{Name: "person-search", Version: "1"}, nil)
	type noArgs struct{}
	mcp.AddTool(srv, &mcp.Tool{Name: "whoami", Description: "names the caller"}, func(_ context.Context, req *mcp.CallToolRequest, _ noArgs) (*mcp.CallToolResult, any, error) {
		sub := req.Extra.TokenInfo.UserID
		p.mu.Lock()
		p.calls = append(p.calls, sub)
		p.mu.Unlock()
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "you are " + sub}}}, nil, nil
	})
	verifier := oidc.NewVerifier(as.Issuer(), oidc.NewRemoteKeySet(context.Background(), as.JWKSURL()), &oidc.Config{SkipClientIDCheck: true})
	verify := func(ctx context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		tok, err := verifier.Verify(ctx, token)
		if err != nil {
			return nil, auth.ErrInvalidToken
		}
		p.mu.Lock()
		p.tokens = append(p.tokens, token)
		p.mu.Unlock()
		return &auth.TokenInfo{Expiration: tok.Expiry, UserID: tok.Subject}, nil
	}
	mux := http.NewServeMux()
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	p.url = ts.URL + "/mcp"
	metadataURL := ts.URL + "/.well-known/oauth-protected-resource/mcp"
	mux.Handle("/.well-known/oauth-protected-resource/mcp", auth.ProtectedResourceMetadataHandler(&oauthex.ProtectedResourceMetadata{
		Resource: p.url, AuthorizationServers: []string{as.Issuer()}}))
	mux.Handle("/mcp", auth.RequireBearerToken(verify, &auth.RequireBearerTokenOptions{ResourceMetadataURL: metadataURL})(
		mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)))
	return p
}

// exchangeSetup is a token-exchange connection to a person server.
type exchangeSetup struct {
	e      *env
	as     *exchangetest.Server
	p      *personServer
	conn   *registryv1.Connection
	secret string
	logs   *syncLog
}

func newExchangeSetup(t *testing.T) *exchangeSetup {
	t.Helper()
	jwks := httptest.NewServer(identity.JWKSHandler(testPKI(t).orchestrator))
	t.Cleanup(jwks.Close)
	const clientID, secret = "v0m3-boundary", "exchange-secret-0123456789abcdef"
	as := exchangetest.Start(t, exchangetest.Config{SubjectIssuer: grant.SubjectIssuer, SubjectJWKSURL: jwks.URL,
		Clients: []exchangetest.Client{{ID: clientID, Secret: secret}}})
	p := servePerson(t, as)
	logs := &syncLog{}
	e := newEnvLog(t, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	conn := e.registry.add(&registryv1.Connection{DisplayName: "person search", Transport: &registryv1.Transport{
		Kind: &registryv1.Transport_StreamableHttp{StreamableHttp: &registryv1.StreamableHTTPTransport{Url: p.url, Oauth: &registryv1.OAuthClient{
			Grant: registryv1.OauthGrant_OAUTH_GRANT_TOKEN_EXCHANGE, ClientId: clientID, ClientSecretRef: e.plant(secret), Issuer: as.Issuer()}}},
	}})
	return &exchangeSetup{e: e, as: as, p: p, conn: conn, secret: secret, logs: logs}
}

// callAs executes whoami for requester with the subject token sign makes
// from the grant (nil: the orchestrator's own, as grant.WithSubject
// makes it). It returns the response and the subject token sent.
func (x *exchangeSetup) callAs(t *testing.T, requester string, sign func(g grant.Grant) string) (*adapterv1.ExecuteResponse, string) {
	t.Helper()
	req := call(t, x.conn, "whoami", map[string]any{}, nil)
	req.AttemptId = ids.New("att")
	orch := testPKI(t).orchestrator
	g, err := grant.For(req, ids.New("grant"), "int_"+requester, "test_capability", time.Now(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if sign == nil {
		if g, err = grant.WithSubject(orch, g, ids.New("sbj"), requester, []string{"staff"}, x.as.Issuer()); err != nil {
			t.Fatal(err)
		}
	} else {
		g.Subject, g.SubjectToken = requester, sign(g)
	}
	req = proto.CloneOf(req)
	if req.Grant, err = grant.Sign(orch, g); err != nil {
		t.Fatal(err)
	}
	resp, err := x.e.srv.Execute(context.Background(), req)
	if err != nil {
		t.Fatalf("Execute: %v", err)
	}
	return resp, g.SubjectToken
}

// A requester's identity reaches the server: alice's call is alice's,
// bob's is bob's, each exchanged once and reused; discovery, for no
// requester, is the client itself. No secret or token is logged or
// returned.
func TestTokenExchange(t *testing.T) {
	t.Parallel()
	x := newExchangeSetup(t)
	snap, err := x.e.srv.Discover(testkit.AsService(t.Context(), identity.Operator), &adapterv1.DiscoverRequest{ConnectionId: x.conn.GetId()})
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	out := []string{prototext.Format(snap)}
	var subjectTokens []string
	for _, who := range []string{"alice", "bob", "alice", "bob"} {
		resp, st := x.callAs(t, who, nil)
		subjectTokens = append(subjectTokens, st)
		if resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
			t.Fatalf("Execute as %s: outcome %v error %v", who, resp.GetOutcome(), resp.GetError())
		}
		if got := resp.GetItems()[0].GetText(); got != "you are "+who {
			t.Errorf("the server answered %s's call with %q", who, got)
		}
		out = append(out, prototext.Format(resp))
	}
	if got := x.p.callers(); !slices.Equal(got, []string{"alice", "bob", "alice", "bob"}) {
		t.Errorf("the server saw calls from %v", got)
	}
	var exchanged, machine []string
	for _, ex := range x.as.Exchanges() {
		switch {
		case ex.Refused != "":
			t.Errorf("the authorization server refused a request: %+v", ex)
		case ex.Grant == "token_exchange":
			exchanged = append(exchanged, ex.Subject)
		default:
			machine = append(machine, ex.Subject)
		}
	}
	if !slices.Equal(exchanged, []string{"alice", "bob"}) {
		t.Errorf("token exchanges for %v, want one for alice and one for bob (tokens reused)", exchanged)
	}
	if !slices.Equal(machine, []string{"v0m3-boundary"}) {
		t.Errorf("client credentials grants for %v, want one for discovery", machine)
	}
	out = append(out, x.logs.String())
	x.p.mu.Lock()
	leaks := append(append([]string{x.secret}, x.p.tokens...), subjectTokens...)
	x.p.mu.Unlock()
	for _, secret := range leaks {
		for _, o := range out {
			if strings.Contains(o, secret) {
				t.Fatalf("a secret or token leaked into %q", truncate(o, 300))
			}
		}
	}
	if !strings.Contains(x.logs.String(), "oauth: token exchanged") {
		t.Errorf("the log does not record the exchange: %s", x.logs.String())
	}
}

// A subject token the authorization server must not trust is refused
// there: the call ends AUTHENTICATION_REQUIRED, the tool never runs, and
// neither token nor secret appears in the response or the log.
func TestTokenExchangeRefused(t *testing.T) {
	t.Parallel()
	impostor := identitytest.Credentials(t, identity.Orchestrator)[0]
	orch := testPKI(t).orchestrator
	claims := func(g grant.Grant, aud string, exp time.Time) grant.SubjectClaims {
		return grant.SubjectClaims{Claims: jwt.Claims{Issuer: grant.SubjectIssuer, Subject: "alice", Audience: jwt.Audience{aud}, ID: ids.New("sbj"),
			IssuedAt: jwt.NewNumericDate(exp.Add(-time.Minute)), Expiry: jwt.NewNumericDate(exp)}, TaskID: g.TaskID, AttemptID: g.AttemptID}
	}
	signed := func(t *testing.T, c *identity.Credentials, v any) string {
		tok, err := c.SignJWT(v)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	tests := []struct {
		name string
		sign func(t *testing.T, x *exchangeSetup, g grant.Grant) string
	}{
		{"signed by another key", func(t *testing.T, x *exchangeSetup, g grant.Grant) string {
			return signed(t, impostor, claims(g, x.as.Issuer(), time.Now().Add(time.Minute)))
		}},
		{"expired", func(t *testing.T, x *exchangeSetup, g grant.Grant) string {
			return signed(t, orch, claims(g, x.as.Issuer(), time.Now().Add(-time.Minute)))
		}},
		{"for another authorization server", func(t *testing.T, x *exchangeSetup, g grant.Grant) string {
			return signed(t, orch, claims(g, "https://other-as.example", time.Now().Add(time.Minute)))
		}},
		{"of another issuer", func(t *testing.T, x *exchangeSetup, g grant.Grant) string {
			c := claims(g, x.as.Issuer(), time.Now().Add(time.Minute))
			c.Issuer = "urn:someone-else"
			return signed(t, orch, c)
		}},
		{"not a JWT", func(*testing.T, *exchangeSetup, grant.Grant) string { return "alice" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			x := newExchangeSetup(t)
			var st string
			resp, _ := x.callAs(t, "alice", func(g grant.Grant) string { st = tt.sign(t, x, g); return st })
			wantFailure(t, resp, adapterv1.Outcome_OUTCOME_FORBIDDEN, CodeAuthenticationRequired)
			if got := x.p.callers(); len(got) != 0 {
				t.Errorf("the tool ran for %v", got)
			}
			refused := false
			for _, ex := range x.as.Exchanges() {
				if ex.Grant == "token_exchange" && ex.Refused == "" {
					t.Errorf("the authorization server issued a token: %+v", ex)
				}
				refused = refused || ex.Refused != ""
			}
			if !refused {
				t.Errorf("the authorization server recorded no refusal: %+v", x.as.Exchanges())
			}
			for _, o := range []string{prototext.Format(resp), x.logs.String()} {
				for _, secret := range []string{x.secret, st} {
					if strings.Contains(o, secret) {
						t.Fatalf("a secret or token leaked into %q", truncate(o, 300))
					}
				}
			}
		})
	}
}

// A call on a token-exchange connection whose grant names no requester is
// refused before anything is sent.
func TestTokenExchangeWithoutRequester(t *testing.T) {
	t.Parallel()
	x := newExchangeSetup(t)
	resp := execute(t, x.e, call(t, x.conn, "whoami", map[string]any{}, nil))
	wantFailure(t, resp, adapterv1.Outcome_OUTCOME_FORBIDDEN, CodeAuthenticationRequired)
	if resp.GetStage() != adapterv1.DeliveryStage_DELIVERY_STAGE_PREPARED {
		t.Errorf("stage %v, want PREPARED (nothing sent)", resp.GetStage())
	}
	if got := x.as.Exchanges(); len(got) != 0 {
		t.Errorf("the authorization server was asked: %+v", got)
	}
	if got := x.p.callers(); len(got) != 0 {
		t.Errorf("the tool ran for %v", got)
	}
}
