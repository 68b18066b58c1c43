package adapter

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
	"golang.org/x/oauth2"
	"golang.org/x/oauth2/clientcredentials"
	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// OAuth 2.1 for remote MCP servers (the MCP specification's authorization,
// client side). A connection whose streamable HTTP transport has an OAuth
// block gets one authorizer per config revision, shared by all its
// sessions: it discovers the server's protected resource metadata and its
// authorization server, checks that server is the connection's issuer,
// obtains a token, keeps it until it expires and steps up on
// insufficient_scope. Secrets and tokens are added to each session's
// scrubber and never logged, traced or put into errors.

// Reasons of a refused authorization, as ExecuteResponse safe codes and
// ErrorInfo reasons.
const (
	// CodeAuthenticationRequired: the server refused the connection's
	// credentials (HTTP 401), or no token could be obtained for it.
	CodeAuthenticationRequired = "AUTHENTICATION_REQUIRED"
	// CodeInsufficientScope: the server refused the token (HTTP 403),
	// e.g. for scopes the authorization server will not grant.
	CodeInsufficientScope = "INSUFFICIENT_SCOPE"
	// CodeAuthorizationServerMismatch: the server or its metadata named an
	// authorization server other than the connection's issuer, so no
	// credential was sent there.
	CodeAuthorizationServerMismatch = "AUTHORIZATION_SERVER_MISMATCH"
)

// maxChallengeBytes bounds the WWW-Authenticate challenge kept as
// untrusted detail.
const maxChallengeBytes = 256

// oauthHTTPTimeout bounds each request to an authorization server or for
// metadata, including token refreshes that run outside any call.
const oauthHTTPTimeout = 30 * time.Second

// authError says the connection's authorization was refused. fact is the
// adapter's own account; challenge is the server's WWW-Authenticate
// header (untrusted, scrubbed, truncated), if it sent one.
type authError struct {
	reason    string
	fact      string
	challenge string
}

func (e *authError) Error() string { return e.fact }

// status is the gRPC error of a refused authorization. It is the
// connection's configuration that must change, not the caller's identity:
// FAILED_PRECONDITION.
func (e *authError) status(connectionID string) error {
	md := map[string]string{"connection_id": connectionID}
	if e.challenge != "" {
		md["untrusted_challenge"] = e.challenge
	}
	return apierror.New(codes.FailedPrecondition, e.reason, fmt.Sprintf("connection %s: %s", connectionID, e.fact), md)
}

// executeFailure is an Execute outcome for a refused authorization: the
// server refused the request before acting on it.
func (e *authError) executeFailure(resp *adapterv1.ExecuteResponse) *adapterv1.ExecuteResponse {
	resp = failFact(resp, adapterv1.Outcome_OUTCOME_FORBIDDEN, e.reason, e.fact)
	resp.Error.UntrustedDetail = e.challenge
	return resp
}

// authFailure returns the refused authorization err carries or the meter
// recorded, if any.
func authFailure(err error, m *meter) *authError {
	var ae *authError
	if errors.As(err, &ae) {
		return ae
	}
	if m != nil {
		return m.auth.Load()
	}
	return nil
}

// observeAuth records what a response from the connection's endpoint says
// about its authorization: a 401 or 403 is remembered (the last word
// unless a later request succeeds), a success forgets it.
func (m *meter) observeAuth(resp *http.Response, creds *credentials) {
	switch {
	case resp.StatusCode == http.StatusUnauthorized:
		m.auth.Store(&authError{reason: CodeAuthenticationRequired, challenge: challengeOf(resp, creds),
			fact: "the server refused the connection's credentials (HTTP 401); check the connection's OAuth client or credential"})
	case resp.StatusCode == http.StatusForbidden && len(resp.Header.Values("WWW-Authenticate")) > 0:
		// A 403 without a challenge is not about the token (e.g. a
		// refused Host header): it stays the server's failure.
		m.auth.Store(&authError{reason: CodeInsufficientScope, challenge: challengeOf(resp, creds),
			fact: "the server refused the connection's token (HTTP 403), e.g. for a scope it was not granted"})
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		if m.auth.Load() != nil {
			m.auth.Store(nil)
		}
	}
}

// challengeOf is a response's WWW-Authenticate challenge as untrusted
// detail: scrubbed of every credential the session holds, bounded.
func challengeOf(resp *http.Response, creds *credentials) string {
	v := strings.Join(resp.Header.Values("WWW-Authenticate"), ", ")
	if creds != nil {
		v = creds.text(v)
	}
	return truncate(v, maxChallengeBytes)
}

// oauthKey names one authorizer: a connection at one config revision.
type oauthKey struct {
	connectionID string
	revision     int64
}

// authorizers keeps one authorizer per connection, at its latest config
// revision: a new revision (a new client, issuer or secret) starts afresh
// and nothing obtained under the old one is used again.
type authorizers struct {
	mu sync.Mutex
	m  map[string]*authorizer // by connection id
}

// authorizerFor returns the authorizer of conn's OAuth block at its
// config revision, or nil when the connection has none.
func (s *Server) authorizerFor(conn *registryv1.Connection, endpoint string) *authorizer {
	cfg := conn.GetTransport().GetStreamableHttp().GetOauth()
	if cfg == nil {
		return nil
	}
	key := oauthKey{conn.GetId(), conn.GetConfigRevision()}
	s.oauth.mu.Lock()
	defer s.oauth.mu.Unlock()
	if s.oauth.m == nil {
		s.oauth.m = map[string]*authorizer{}
	}
	if a := s.oauth.m[key.connectionID]; a != nil && a.key == key {
		return a
	}
	a := &authorizer{key: key, cfg: cfg, endpoint: endpoint, http: s.oauthClient(), log: s.log}
	s.oauth.m[key.connectionID] = a
	return a
}

// drop forgets a connection's authorizer and the token it holds (the
// connection was retired or is no longer approved).
func (as *authorizers) drop(connectionID string) {
	as.mu.Lock()
	defer as.mu.Unlock()
	delete(as.m, connectionID)
}

// oauthClient is the HTTP client of metadata and token requests: it dials
// through the adapter's reachability policy, never via a proxy, and
// follows a redirect only to a URL the policy allows.
func (s *Server) oauthClient() *http.Client {
	return &http.Client{
		Transport: s.httpTransport,
		Timeout:   oauthHTTPTimeout,
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) >= maxRedirects {
				return fmt.Errorf("stopped after %d redirects", maxRedirects)
			}
			return s.reach.CheckURL(req.URL.String())
		},
	}
}

// authorizer obtains and keeps the tokens of one connection at one config
// revision. Its methods are safe for concurrent use by many sessions.
type authorizer struct {
	key      oauthKey
	cfg      *registryv1.OAuthClient
	endpoint string
	http     *http.Client
	log      *slog.Logger

	mu      sync.Mutex // serializes authorize; guards the fields below
	ts      oauth2.TokenSource
	granted []string // scopes asked for (or granted) last
	secret  string   // the resolved client secret, once read
	// code is the go-sdk's authorization code handler (authorization_code).
	code *auth.AuthorizationCodeHandler
	// subs holds each requester's exchanged token (token_exchange; see
	// tokenexchange.go).
	subs subjects
}

// tokenSource is the current token source (for subject, on a
// token-exchange connection), or nil before the first authorization.
func (a *authorizer) tokenSource(ctx context.Context, subject string) (oauth2.TokenSource, error) {
	if subject != "" {
		return a.exchangedSource(subject), nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.code != nil {
		return a.code.TokenSource(ctx)
	}
	return a.ts, nil
}

// sessionAuth is one session's view of its connection's authorizer (the
// go-sdk transport's OAuthHandler): it adds every secret and token to the
// session's scrubber and records refusals on its meter.
type sessionAuth struct {
	a     *authorizer
	creds *credentials
	m     *meter
	// subject is the requester the session acts for on a token-exchange
	// connection; "" (discovery, health, other grants) uses the client's
	// own grant.
	subject string
	// failed is the session's refused authorization: once the grant
	// failed, nothing more is sent and nothing asked again (the client
	// library would otherwise repeat both for its version fallback).
	failed atomic.Pointer[authError]
}

// TokenSource returns the connection's current token source, if any.
func (sa *sessionAuth) TokenSource(ctx context.Context) (oauth2.TokenSource, error) {
	if ae := sa.failed.Load(); ae != nil {
		return nil, ae
	}
	ts, err := sa.a.tokenSource(ctx, sa.subject)
	if ts == nil || err != nil {
		return nil, err
	}
	return &scrubbedSource{ts: ts, sa: sa}, nil
}

// Authorize runs the connection's grant after the server answered 401 or
// 403; the transport retries the request once when it succeeds.
func (sa *sessionAuth) Authorize(ctx context.Context, req *http.Request, resp *http.Response) error {
	defer resp.Body.Close()
	if ae := sa.failed.Load(); ae != nil {
		return ae
	}
	if sa.subject != "" {
		sa.creds.add(sa.a.subjectToken(sa.subject))
	}
	err := sa.a.authorize(ctx, req, resp, sa.creds, sa.subject)
	if err != nil {
		ae := authFailure(err, nil)
		if ae == nil {
			// A library error may quote what a server said: only the
			// adapter's own words leave here.
			ae = &authError{reason: CodeAuthenticationRequired, fact: "no token could be obtained for the connection's OAuth client"}
		}
		if ae.challenge == "" {
			ae.challenge = challengeOf(resp, sa.creds)
		}
		sa.m.auth.Store(ae)
		if resp.StatusCode == http.StatusUnauthorized {
			// A refused step-up (403) leaves the session's token good for
			// what it was granted.
			sa.failed.Store(ae)
		}
		return ae
	}
	return nil
}

// scrubbedSource hands out the connection's tokens, remembering each in
// the session's scrubber first; a refused refresh is recorded as such.
type scrubbedSource struct {
	ts oauth2.TokenSource
	sa *sessionAuth
}

func (s *scrubbedSource) Token() (*oauth2.Token, error) {
	tok, err := s.ts.Token()
	if err != nil {
		ae := tokenError(err)
		s.sa.m.auth.Store(ae)
		return nil, ae
	}
	for _, v := range []string{tok.AccessToken, tok.RefreshToken} {
		if v != "" {
			s.sa.creds.add(v)
		}
	}
	return tok, nil
}

// authorize performs the connection's grant for a refused request.
func (a *authorizer) authorize(ctx context.Context, req *http.Request, resp *http.Response, creds *credentials, subject string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	secret, err := a.resolveSecret(creds)
	if err != nil {
		return err
	}
	if a.cfg.GetGrant() == registryv1.OauthGrant_OAUTH_GRANT_AUTHORIZATION_CODE {
		return a.authorizeCode(ctx, req, resp, secret)
	}
	return a.authorizeClient(ctx, req, resp, secret, subject)
}

// resolveSecret reads the client secret once per authorizer (that is, per
// config revision) and adds it to the session's scrubber.
func (a *authorizer) resolveSecret(creds *credentials) (string, error) {
	ref := a.cfg.GetClientSecretRef()
	if ref == "" {
		return "", nil
	}
	if a.secret == "" {
		v, err := creds.read(ref)
		if err != nil {
			return "", err
		}
		a.secret = v
	}
	creds.add(a.secret)
	return a.secret, nil
}

// authorizeClient runs the client credentials grant: protected resource
// metadata, the connection's authorization server (and no other), a token
// for the challenged (or configured, or advertised) scopes. With a
// subject (a token-exchange connection's call for a requester) the same
// discovery ends in a token exchange instead.
func (a *authorizer) authorizeClient(ctx context.Context, req *http.Request, resp *http.Response, secret, subject string) error {
	challenges, _ := oauthex.ParseWWWAuthenticate(resp.Header.Values("WWW-Authenticate"))
	challenged := challengeScopes(challenges)
	if resp.StatusCode == http.StatusForbidden {
		if challengeError(challenges) != "insufficient_scope" {
			return &authError{reason: CodeInsufficientScope, fact: "the server refused the connection's token (HTTP 403) without asking for more scope"}
		}
		if len(challenged) == 0 || isSubset(challenged, a.granted) {
			// Asking again for what was already asked for would loop.
			return &authError{reason: CodeInsufficientScope,
				fact: "the server asks for scopes the connection's token was already requested with; grant them to the OAuth client at the authorization server"}
		}
	} else if cur := a.current(subject); cur != nil && req.Header.Get("Authorization") != "" {
		// Another session may have replaced the token since this request
		// was sent: retry with the current one before asking again.
		if tok, err := cur.Token(); err == nil && req.Header.Get("Authorization") != "Bearer "+tok.AccessToken {
			return nil
		}
	}
	prm := a.protectedResource(ctx, challenges)
	issuer := a.cfg.GetIssuer()
	switch {
	case prm != nil && !slices.ContainsFunc(prm.AuthorizationServers, func(s string) bool { return sameIssuer(s, issuer) }):
		return &authError{reason: CodeAuthorizationServerMismatch,
			fact: fmt.Sprintf("the server's protected resource metadata does not name the connection's authorization server %s; the client's credentials were not sent anywhere", issuer)}
	case prm == nil && !sameIssuer(originOnly(a.endpoint), issuer):
		return &authError{reason: CodeAuthorizationServerMismatch,
			fact: fmt.Sprintf("the server publishes no protected resource metadata and is not itself the connection's authorization server %s; the client's credentials were not sent anywhere", issuer)}
	}
	asm, err := auth.GetAuthServerMetadata(ctx, strings.TrimSuffix(issuer, "/"), a.http)
	if err != nil {
		return &authError{reason: CodeAuthenticationRequired,
			fact: fmt.Sprintf("the metadata of the authorization server %s could not be read or does not name that issuer", issuer)}
	}
	if asm == nil {
		// A 2025-03-26 server: the default endpoints at the issuer.
		asm = &oauthex.AuthServerMeta{Issuer: issuer, TokenEndpoint: strings.TrimSuffix(issuer, "/") + "/token"}
	}
	scopes := union(a.granted, challenged)
	if len(scopes) == 0 {
		scopes = a.cfg.GetScopes()
	}
	if len(scopes) == 0 && prm != nil {
		scopes = prm.ScopesSupported
	}
	resource := a.cfg.GetResource()
	if resource == "" && prm != nil {
		resource = prm.Resource
	}
	if resource == "" {
		resource = a.endpoint
	}
	cc := &clientcredentials.Config{
		ClientID:       a.cfg.GetClientId(),
		ClientSecret:   secret,
		TokenURL:       asm.TokenEndpoint,
		Scopes:         scopes,
		EndpointParams: url.Values{"resource": {resource}},
		AuthStyle:      authStyle(asm.TokenEndpointAuthMethodsSupported),
	}
	if subject != "" {
		err := a.authorizeExchange(ctx, subject, cc, resource)
		if ae := authFailure(err, nil); ae != nil && resp.StatusCode == http.StatusForbidden {
			ae.reason = CodeInsufficientScope // the step-up was refused
		}
		if err == nil {
			a.granted = scopes
		}
		return err
	}
	tok, err := cc.Token(context.WithValue(ctx, oauth2.HTTPClient, a.http))
	if err != nil {
		ae := tokenError(err)
		if resp.StatusCode == http.StatusForbidden {
			ae.reason = CodeInsufficientScope // the step-up was refused
		}
		return ae
	}
	// Later tokens are fetched when this one expires, outside any call.
	refresh := context.WithValue(context.WithoutCancel(ctx), oauth2.HTTPClient, a.http)
	a.ts = oauth2.ReuseTokenSource(tok, cc.TokenSource(refresh))
	a.granted = scopes
	if s, ok := tok.Extra("scope").(string); ok && s != "" {
		a.granted = strings.Fields(s)
	}
	a.log.InfoContext(ctx, "oauth: token obtained", "connection_id", a.key.connectionID, "config_revision", a.key.revision,
		"grant", "client_credentials", "issuer", issuer, "scopes", strings.Join(a.granted, " "), "expires", tok.Expiry)
	return nil
}

// authorizeCode runs the authorization code grant with PKCE through the
// go-sdk's handler, for a pre-consented client: the authorization endpoint
// must redirect with a code at once, since no person takes part.
func (a *authorizer) authorizeCode(ctx context.Context, req *http.Request, resp *http.Response, secret string) error {
	if a.code == nil {
		cfg := &auth.AuthorizationCodeHandlerConfig{
			RedirectURL:              a.cfg.GetRedirectUrl(),
			AuthorizationCodeFetcher: a.fetchCode,
			Client:                   a.http,
			RequestRefreshToken:      true,
		}
		// The handler tries the metadata document where the server
		// supports it, then the pre-registered client, then registration.
		if doc := a.cfg.GetClientIdMetadataUrl(); doc != "" {
			cfg.ClientIDMetadataDocumentConfig = &auth.ClientIDMetadataDocumentConfig{URL: doc}
		}
		if id := a.cfg.GetClientId(); id != "" {
			client := &oauthex.ClientCredentials{ClientID: id, Issuer: a.cfg.GetIssuer()}
			if secret != "" {
				client.ClientSecretAuth = &oauthex.ClientSecretAuth{ClientSecret: secret}
			}
			cfg.PreregisteredClient = client
		}
		if a.cfg.GetDynamicRegistration() {
			cfg.DynamicClientRegistrationConfig = &auth.DynamicClientRegistrationConfig{Metadata: &oauthex.ClientRegistrationMetadata{
				RedirectURIs: []string{a.cfg.GetRedirectUrl()}, ClientName: "V0M3 Boundary adapter",
				GrantTypes: []string{"authorization_code", "refresh_token"}, ResponseTypes: []string{"code"}}}
		}
		if sc := a.cfg.GetScopes(); len(sc) > 0 {
			cfg.ScopeFilter = func(discovered []string) []string {
				if len(discovered) == 0 {
					return sc
				}
				return discovered
			}
		}
		h, err := auth.NewAuthorizationCodeHandler(cfg)
		if err != nil {
			return &authError{reason: CodeAuthenticationRequired, fact: "the connection's OAuth client configuration is not usable for the authorization code grant"}
		}
		a.code = h
	}
	// The handler closes the body; the session's copy of the response
	// keeps its headers.
	if err := a.code.Authorize(ctx, req, resp); err != nil {
		var re *oauth2.RetrieveError
		if errors.As(err, &re) {
			return tokenError(re)
		}
		if strings.Contains(err.Error(), "issuer") {
			return &authError{reason: CodeAuthorizationServerMismatch,
				fact: "the authorization server's issuer does not match the connection's, or its authorization response named another issuer"}
		}
		return &authError{reason: CodeAuthenticationRequired, fact: "the authorization code grant did not yield a token (discovery, the pre-consented authorization or the code exchange failed)"}
	}
	a.log.InfoContext(ctx, "oauth: token obtained", "connection_id", a.key.connectionID, "config_revision", a.key.revision, "grant", "authorization_code")
	return nil
}

// fetchCode follows a pre-consented authorization request: the
// authorization endpoint answers with a redirect to the client's
// redirect URI carrying the code; the redirect is read, never followed.
func (a *authorizer) fetchCode(ctx context.Context, args *auth.AuthorizationArgs) (*auth.AuthorizationResult, error) {
	c := *a.http
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, args.URL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	loc, err := url.Parse(resp.Header.Get("Location"))
	if resp.StatusCode < 300 || resp.StatusCode > 399 || err != nil || loc.Query().Get("code") == "" {
		return nil, errors.New("the authorization endpoint did not redirect with a code: the client is not pre-consented")
	}
	q := loc.Query()
	return &auth.AuthorizationResult{Code: q.Get("code"), State: q.Get("state"), Iss: q.Get("iss")}, nil
}

// current is the token source a request was sent with: subject's on a
// token-exchange connection, else the client's.
func (a *authorizer) current(subject string) oauth2.TokenSource {
	if subject != "" {
		return a.exchangedSource(subject)
	}
	return a.ts
}

// protectedResource discovers the server's protected resource metadata
// (RFC 9728): where its challenge points, then at the endpoint's path,
// then at its root; nil when there is none (a 2025-03-26 server).
func (a *authorizer) protectedResource(ctx context.Context, challenges []oauthex.Challenge) *oauthex.ProtectedResourceMetadata {
	u, err := url.Parse(a.endpoint)
	if err != nil {
		return nil
	}
	type candidate struct{ metadata, resource string }
	var cands []candidate
	for _, c := range challenges {
		if m := c.Params["resource_metadata"]; m != "" {
			cands = append(cands, candidate{m, a.endpoint})
			break
		}
	}
	at := *u
	at.RawQuery, at.Fragment = "", ""
	if p := strings.Trim(u.Path, "/"); p != "" {
		at.Path = "/.well-known/oauth-protected-resource/" + p
		cands = append(cands, candidate{at.String(), a.endpoint})
	}
	at.Path = "/.well-known/oauth-protected-resource"
	cands = append(cands, candidate{at.String(), originOnly(a.endpoint)})
	for _, c := range cands {
		prm, err := oauthex.GetProtectedResourceMetadata(ctx, c.metadata, c.resource, a.http)
		if err == nil && prm != nil {
			return prm
		}
	}
	return nil
}

// tokenError is a refused token request in the adapter's words: the
// authorization server's OAuth error code (a fixed vocabulary, still
// bounded) but never its description.
func tokenError(err error) *authError {
	var ae *authError
	if errors.As(err, &ae) {
		return ae
	}
	fact := "the authorization server issued no token for the connection's OAuth client"
	var re *oauth2.RetrieveError
	if errors.As(err, &re) && re.ErrorCode != "" && !strings.ContainsFunc(re.ErrorCode, func(r rune) bool { return (r < 'a' || r > 'z') && r != '_' }) {
		fact += " (" + truncate(re.ErrorCode, 64) + ")"
	}
	return &authError{reason: CodeAuthenticationRequired, fact: fact}
}

// authStyle picks how the client authenticates at the token endpoint:
// HTTP Basic where the server supports it (or says nothing), form
// parameters where only they are supported.
func authStyle(supported []string) oauth2.AuthStyle {
	if len(supported) == 0 || slices.Contains(supported, "client_secret_basic") {
		return oauth2.AuthStyleInHeader
	}
	if slices.Contains(supported, "client_secret_post") {
		return oauth2.AuthStyleInParams
	}
	return oauth2.AuthStyleAutoDetect
}

// challengeScopes returns the scope a Bearer challenge asks for.
func challengeScopes(cs []oauthex.Challenge) []string {
	for _, c := range cs {
		if strings.EqualFold(c.Scheme, "bearer") && c.Params["scope"] != "" {
			return strings.Fields(c.Params["scope"])
		}
	}
	return nil
}

// challengeError returns a Bearer challenge's error code.
func challengeError(cs []oauthex.Challenge) string {
	for _, c := range cs {
		if strings.EqualFold(c.Scheme, "bearer") && c.Params["error"] != "" {
			return c.Params["error"]
		}
	}
	return ""
}

// sameIssuer compares issuer identifiers, ignoring one trailing slash.
func sameIssuer(a, b string) bool {
	return strings.TrimSuffix(a, "/") == strings.TrimSuffix(b, "/")
}

// originOnly is a URL without path, query or fragment.
func originOnly(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	return u.Scheme + "://" + u.Host
}

func isSubset(sub, of []string) bool {
	for _, s := range sub {
		if !slices.Contains(of, s) {
			return false
		}
	}
	return true
}

func union(a, b []string) []string {
	out := slices.Clone(a)
	for _, s := range b {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}
