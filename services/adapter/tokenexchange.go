package adapter

import (
	"context"
	"net/url"
	"strings"
	"sync"
	"time"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/clientcredentials"

	"github.com/v0m3/v0m3/internal/grant"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// Token exchange (RFC 8693): a connection whose OAuth client exchanges
// the requester's identity reaches its server with a token for the person
// the task runs for, never with the adapter's own. The adapter holds no
// person's bearer token: each execution grant carries a subject token the
// orchestrator signed for that attempt's requester (grant.WithSubject);
// the adapter exchanges it at the connection's authorization server,
// authenticating as the connection's client, and keeps the access token
// per connection, config revision and requester until it expires. A
// requester's calls share a session of their own; nobody else's call
// uses it. Discovery and health act for no requester and use client
// credentials with the same client.

// grantTypeTokenExchange is the RFC 8693 grant type.
const grantTypeTokenExchange = "urn:ietf:params:oauth:grant-type:token-exchange"

// defaultRequestedTokenType is the token type asked for by default.
const defaultRequestedTokenType = "urn:ietf:params:oauth:token-type:access_token"

// subjectIdle is how long an exchanged token is kept for a requester no
// call came for.
const subjectIdle = time.Hour

// exchangeSubject is the requester a call acts for and the subject token
// the orchestrator signed for it.
type exchangeSubject struct {
	name, token string
}

type subjectCtxKey struct{}

// withSubject returns ctx for calls acting for sub.
func withSubject(ctx context.Context, sub exchangeSubject) context.Context {
	if sub.name == "" {
		return ctx
	}
	return context.WithValue(ctx, subjectCtxKey{}, sub)
}

// subjectOf is the requester ctx acts for, if any.
func subjectOf(ctx context.Context) exchangeSubject {
	sub, _ := ctx.Value(subjectCtxKey{}).(exchangeSubject)
	return sub
}

// exchanges reports whether conn's OAuth client uses token exchange.
func exchanges(conn *registryv1.Connection) bool {
	return conn.GetTransport().GetStreamableHttp().GetOauth().GetGrant() == registryv1.OauthGrant_OAUTH_GRANT_TOKEN_EXCHANGE
}

// exchangeContext prepares a call on a token-exchange connection: it
// hands the grant's subject token to the connection's authorizer and
// returns ctx acting for the grant's requester. A call without a subject
// token (no grant, or a grant naming no requester) is refused before
// anything is sent: the connection reaches its server only as a person.
func (s *Server) exchangeContext(ctx context.Context, conn *registryv1.Connection, g grant.Grant, method string) (context.Context, *adapterv1.ExecuteResponse) {
	if !exchanges(conn) {
		return ctx, nil
	}
	if g.Subject == "" || g.SubjectToken == "" {
		ae := &authError{reason: CodeAuthenticationRequired,
			fact: "the connection exchanges the requester's identity for its token, but the call's execution grant names no requester"}
		return ctx, ae.executeFailure(&adapterv1.ExecuteResponse{Method: method, Stage: adapterv1.DeliveryStage_DELIVERY_STAGE_PREPARED})
	}
	if a := s.authorizerFor(conn, conn.GetTransport().GetStreamableHttp().GetUrl()); a != nil {
		a.noteSubject(g.Subject, g.SubjectToken)
	}
	return withSubject(ctx, exchangeSubject{name: g.Subject, token: g.SubjectToken}), nil
}

// exchanged is what an authorizer keeps for one requester.
type exchanged struct {
	subjectToken string    // the latest subject token a call brought
	seen         time.Time // when a call last brought one
	ts           oauth2.TokenSource
}

// subjects keeps an authorizer's per-requester state.
type subjects struct {
	mu sync.Mutex
	m  map[string]*exchanged
}

// noteSubject remembers the latest subject token of a requester: a token
// that expires is exchanged again with it.
func (a *authorizer) noteSubject(name, token string) {
	a.subs.mu.Lock()
	defer a.subs.mu.Unlock()
	now := time.Now()
	if a.subs.m == nil {
		a.subs.m = map[string]*exchanged{}
	}
	for n, x := range a.subs.m {
		if now.Sub(x.seen) > subjectIdle {
			delete(a.subs.m, n)
		}
	}
	x := a.subs.m[name]
	if x == nil {
		x = &exchanged{}
		a.subs.m[name] = x
	}
	x.subjectToken, x.seen = token, now
}

// subjectToken is the latest subject token of a requester.
func (a *authorizer) subjectToken(name string) string {
	a.subs.mu.Lock()
	defer a.subs.mu.Unlock()
	if x := a.subs.m[name]; x != nil {
		return x.subjectToken
	}
	return ""
}

// exchangedSource is a requester's token source, nil before the first
// exchange.
func (a *authorizer) exchangedSource(name string) oauth2.TokenSource {
	a.subs.mu.Lock()
	defer a.subs.mu.Unlock()
	if x := a.subs.m[name]; x != nil {
		return x.ts
	}
	return nil
}

// exchangeRequest is a token exchange at one token endpoint.
type exchangeRequest struct {
	a        *authorizer
	subject  string
	cfg      clientcredentials.Config
	ctx      context.Context
	resource string
	audience string
}

// exchange obtains a token for the requester with their latest subject
// token. clientcredentials posts the client's authentication and the
// parameters as they are; RFC 8693 only replaces the grant type.
func (r *exchangeRequest) Token() (*oauth2.Token, error) {
	st := r.a.subjectToken(r.subject)
	if st == "" {
		return nil, &authError{reason: CodeAuthenticationRequired, fact: "no subject token is at hand for the requester"}
	}
	cfg := r.cfg
	cfg.EndpointParams = url.Values{
		"grant_type":           {grantTypeTokenExchange},
		"subject_token":        {st},
		"subject_token_type":   {grant.SubjectTokenType},
		"requested_token_type": {requestedTokenType(r.a.cfg)},
		"audience":             {r.audience},
		"resource":             {r.resource},
	}
	tok, err := cfg.Token(r.ctx)
	if err != nil {
		return nil, tokenError(err)
	}
	return tok, nil
}

// authorizeExchange exchanges the requester's subject token at the token
// endpoint discovery found, and keeps the token (renewed with the latest
// subject token when it expires).
func (a *authorizer) authorizeExchange(ctx context.Context, subject string, cc *clientcredentials.Config, resource string) error {
	audience := a.cfg.GetAudience()
	if audience == "" {
		audience = resource
	}
	r := &exchangeRequest{a: a, subject: subject, cfg: *cc, resource: resource, audience: audience,
		ctx: context.WithValue(context.WithoutCancel(ctx), oauth2.HTTPClient, a.http)}
	r.cfg.EndpointParams = nil
	tok, err := r.Token()
	if err != nil {
		return err
	}
	a.subs.mu.Lock()
	if x := a.subs.m[subject]; x != nil {
		x.ts = oauth2.ReuseTokenSource(tok, r)
	}
	a.subs.mu.Unlock()
	scopes := ""
	if s, ok := tok.Extra("scope").(string); ok {
		scopes = s
	}
	// The requester is named, their token never.
	a.log.InfoContext(ctx, "oauth: token exchanged", "connection_id", a.key.connectionID, "config_revision", a.key.revision,
		"grant", "token_exchange", "subject", subject, "issuer", a.cfg.GetIssuer(), "scopes", scopes, "expires", tok.Expiry)
	return nil
}

// requestedTokenType is the token type a token exchange asks for.
func requestedTokenType(o *registryv1.OAuthClient) string {
	if t := strings.TrimSpace(o.GetRequestedTokenType()); t != "" {
		return t
	}
	return defaultRequestedTokenType
}
