// Package exchangetest runs a real OAuth 2.1 authorization server that
// implements token exchange (RFC 8693), for tests: Ory Hydra (see
// oidctest) does not. It is built on github.com/zitadel/oidc/v3's op
// package and speaks OAuth on the wire over HTTP: discovery metadata, a
// JWKS, a token endpoint with client authentication. It trusts subject
// tokens of one issuer whose keys it fetches from a JWKS URL (V0M3's
// orchestrator), and issues JWT access tokens whose subject is the
// subject token's. It also grants client credentials, for discovery.
package exchangetest

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"
)

// Client is an OAuth client the server knows.
type Client struct {
	ID, Secret string
}

// Config configures the server.
type Config struct {
	// SubjectIssuer is the iss of the subject tokens it trusts.
	SubjectIssuer string
	// SubjectJWKSURL is where it reads the keys of that issuer.
	SubjectJWKSURL string
	// SubjectJWKSRoots, when set, are the roots it trusts for an https
	// SubjectJWKSURL (e.g. the development CA of the orchestrator that
	// serves it).
	SubjectJWKSRoots *x509.CertPool
	// Clients are the confidential clients it knows.
	Clients []Client
	// AccessTokenLifetime defaults to five minutes.
	AccessTokenLifetime time.Duration
}

// Exchange is one token request the server answered.
type Exchange struct {
	Grant    string // "token_exchange" or "client_credentials"
	ClientID string
	Subject  string // the subject the issued token names ("" if refused)
	Audience []string
	Refused  string // why it was refused, "" if a token was issued
}

// Server is a running authorization server.
type Server struct {
	srv    *httptest.Server
	cfg    Config
	key    *rsa.PrivateKey
	keyID  string
	client *http.Client

	mu        sync.Mutex
	exchanges []Exchange
	subjects  *jose.JSONWebKeySet
}

// Start starts a server on a loopback port; it stops with the test.
func Start(t testing.TB, cfg Config) *Server {
	t.Helper()
	if cfg.AccessTokenLifetime == 0 {
		cfg.AccessTokenLifetime = 5 * time.Minute
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{cfg: cfg, key: key, keyID: "exchangetest-1", client: &http.Client{Timeout: 10 * time.Second}}
	if cfg.SubjectJWKSRoots != nil {
		s.client.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: cfg.SubjectJWKSRoots, MinVersion: tls.VersionTLS12}}
	}
	var handler http.Handler
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { handler.ServeHTTP(w, r) }))
	t.Cleanup(s.srv.Close)
	var crypto [32]byte
	if _, err := rand.Read(crypto[:]); err != nil {
		t.Fatal(err)
	}
	provider, err := op.NewProvider(&op.Config{CryptoKey: crypto, CodeMethodS256: true},
		&storage{s: s}, op.StaticIssuer(s.srv.URL), op.WithAllowInsecure(), op.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	handler = provider
	return s
}

// Issuer is the server's issuer identifier.
func (s *Server) Issuer() string { return s.srv.URL }

// JWKSURL is where the server publishes the keys of its access tokens.
func (s *Server) JWKSURL() string { return s.srv.URL + "/keys" }

// Exchanges returns the token requests answered so far.
func (s *Server) Exchanges() []Exchange {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.exchanges)
}

func (s *Server) record(e Exchange) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.exchanges = append(s.exchanges, e)
}

// subjectKeys returns the trusted issuer's keys, fetched again when kid
// is not among them (the issuer rotated its key).
func (s *Server) subjectKeys(ctx context.Context, kid string) (*jose.JSONWebKeySet, error) {
	s.mu.Lock()
	ks := s.subjects
	s.mu.Unlock()
	if ks != nil && len(ks.Key(kid)) > 0 {
		return ks, nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.cfg.SubjectJWKSURL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("jwks: HTTP %d", resp.StatusCode)
	}
	ks = &jose.JSONWebKeySet{}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(ks); err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.subjects = ks
	s.mu.Unlock()
	return ks, nil
}

// subjectClaims are what the server reads from a subject token.
type subjectClaims struct {
	jwt.Claims
	Groups []string `json:"groups"`
}

// verifySubject checks a subject token: a JWT of the trusted issuer,
// signed by one of its keys, for this server (aud), within its time.
func (s *Server) verifySubject(ctx context.Context, token string) (*subjectClaims, error) {
	tok, err := jwt.ParseSigned(token, []jose.SignatureAlgorithm{jose.ES256, jose.ES384, jose.ES512, jose.PS256, jose.RS256, jose.EdDSA})
	if err != nil {
		return nil, fmt.Errorf("not a JWT: %w", err)
	}
	if len(tok.Headers) != 1 || tok.Headers[0].KeyID == "" {
		return nil, errors.New("no key id")
	}
	ks, err := s.subjectKeys(ctx, tok.Headers[0].KeyID)
	if err != nil {
		return nil, fmt.Errorf("issuer keys: %w", err)
	}
	keys := ks.Key(tok.Headers[0].KeyID)
	if len(keys) == 0 {
		return nil, errors.New("unknown key")
	}
	var c subjectClaims
	if err := tok.Claims(keys[0].Key, &c); err != nil {
		return nil, fmt.Errorf("signature: %w", err)
	}
	if err := c.ValidateWithLeeway(jwt.Expected{Issuer: s.cfg.SubjectIssuer, AnyAudience: jwt.Audience{s.Issuer()}, Time: time.Now()}, 0); err != nil {
		return nil, err
	}
	if c.Subject == "" || c.Expiry == nil {
		return nil, errors.New("no subject or expiry")
	}
	return &c, nil
}

// storage is the op storage: clients, keys, and the two grants. What the
// server does not offer (authorization code, refresh, sessions) is
// refused.
type storage struct {
	s *Server
}

var errUnsupported = errors.New("exchangetest: not supported")

func (st *storage) clientByID(id string) (*client, bool) {
	for _, c := range st.s.cfg.Clients {
		if c.ID == id {
			return &client{id: c.ID, lifetime: st.s.cfg.AccessTokenLifetime}, true
		}
	}
	return nil, false
}

// AuthStorage.

func (st *storage) CreateAuthRequest(context.Context, *oidc.AuthRequest, string) (op.AuthRequest, error) {
	return nil, errUnsupported
}
func (st *storage) AuthRequestByID(context.Context, string) (op.AuthRequest, error) {
	return nil, errUnsupported
}
func (st *storage) AuthRequestByCode(context.Context, string) (op.AuthRequest, error) {
	return nil, errUnsupported
}
func (st *storage) SaveAuthCode(context.Context, string, string) error { return errUnsupported }
func (st *storage) DeleteAuthRequest(context.Context, string) error    { return errUnsupported }
func (st *storage) CreateAccessToken(context.Context, op.TokenRequest) (string, time.Time, error) {
	return rand.Text(), time.Now().Add(st.s.cfg.AccessTokenLifetime), nil
}
func (st *storage) CreateAccessAndRefreshTokens(context.Context, op.TokenRequest, string) (string, string, time.Time, error) {
	return "", "", time.Time{}, errUnsupported
}
func (st *storage) TokenRequestByRefreshToken(context.Context, string) (op.RefreshTokenRequest, error) {
	return nil, errUnsupported
}
func (st *storage) TerminateSession(context.Context, string, string) error { return errUnsupported }
func (st *storage) RevokeToken(context.Context, string, string, string) *oidc.Error {
	return oidc.ErrUnsupportedGrantType()
}
func (st *storage) GetRefreshTokenInfo(context.Context, string, string) (string, string, error) {
	return "", "", errUnsupported
}
func (st *storage) SigningKey(context.Context) (op.SigningKey, error) {
	return signingKey{st.s}, nil
}
func (st *storage) SignatureAlgorithms(context.Context) ([]jose.SignatureAlgorithm, error) {
	return []jose.SignatureAlgorithm{jose.RS256}, nil
}
func (st *storage) KeySet(context.Context) ([]op.Key, error) {
	return []op.Key{publicKey{st.s}}, nil
}

// OPStorage.

func (st *storage) GetClientByClientID(_ context.Context, id string) (op.Client, error) {
	c, ok := st.clientByID(id)
	if !ok {
		return nil, errors.New("unknown client")
	}
	return c, nil
}
func (st *storage) AuthorizeClientIDSecret(_ context.Context, id, secret string) error {
	for _, c := range st.s.cfg.Clients {
		if c.ID == id && c.Secret == secret && secret != "" {
			return nil
		}
	}
	return errors.New("client authentication failed")
}
func (st *storage) SetUserinfoFromScopes(context.Context, *oidc.UserInfo, string, string, []string) error {
	return nil
}
func (st *storage) SetUserinfoFromToken(context.Context, *oidc.UserInfo, string, string, string) error {
	return errUnsupported
}
func (st *storage) SetIntrospectionFromToken(context.Context, *oidc.IntrospectionResponse, string, string, string) error {
	return errUnsupported
}
func (st *storage) GetPrivateClaimsFromScopes(_ context.Context, _, _ string, scopes []string) (map[string]any, error) {
	return map[string]any{"scope": oidc.SpaceDelimitedArray(scopes).String()}, nil
}
func (st *storage) GetKeyByIDAndClientID(context.Context, string, string) (*jose.JSONWebKey, error) {
	return nil, errUnsupported
}
func (st *storage) ValidateJWTProfileScopes(context.Context, string, []string) ([]string, error) {
	return nil, errUnsupported
}
func (st *storage) Health(context.Context) error { return nil }

// ClientCredentialsStorage.

func (st *storage) ClientCredentials(ctx context.Context, id, secret string) (op.Client, error) {
	if err := st.AuthorizeClientIDSecret(ctx, id, secret); err != nil {
		st.s.record(Exchange{Grant: "client_credentials", ClientID: id, Refused: "client authentication"})
		return nil, err
	}
	c, _ := st.clientByID(id)
	return c, nil
}
func (st *storage) ClientCredentialsTokenRequest(_ context.Context, id string, scopes []string) (op.TokenRequest, error) {
	st.s.record(Exchange{Grant: "client_credentials", ClientID: id, Subject: id})
	return &oidc.JWTTokenRequest{Subject: id, Audience: []string{id}, Scopes: scopes, IssuedAt: oidc.FromTime(time.Now())}, nil
}

// TokenExchangeStorage and TokenExchangeTokensVerifierStorage.

func (st *storage) VerifyExchangeSubjectToken(ctx context.Context, token string, tokenType oidc.TokenType) (string, string, map[string]any, error) {
	if tokenType != oidc.JWTTokenType {
		st.s.record(Exchange{Grant: "token_exchange", Refused: "subject token type " + string(tokenType)})
		return "", "", nil, errors.New("only JWT subject tokens")
	}
	c, err := st.s.verifySubject(ctx, token)
	if err != nil {
		st.s.record(Exchange{Grant: "token_exchange", Refused: "subject token: " + err.Error()})
		return "", "", nil, err
	}
	return c.ID, c.Subject, map[string]any{"groups": c.Groups}, nil
}
func (st *storage) VerifyExchangeActorToken(context.Context, string, oidc.TokenType) (string, string, map[string]any, error) {
	return "", "", nil, errUnsupported
}
func (st *storage) ValidateTokenExchangeRequest(_ context.Context, r op.TokenExchangeRequest) error {
	if r.GetRequestedTokenType() == "" {
		r.SetRequestedTokenType(oidc.AccessTokenType)
	}
	if r.GetRequestedTokenType() != oidc.AccessTokenType {
		st.s.record(Exchange{Grant: "token_exchange", ClientID: r.GetClientID(), Refused: "requested token type"})
		return oidc.ErrInvalidRequest().WithDescription("only access tokens are issued")
	}
	st.s.record(Exchange{Grant: "token_exchange", ClientID: r.GetClientID(), Subject: r.GetSubject(), Audience: r.GetAudience()})
	return nil
}
func (st *storage) CreateTokenExchangeRequest(context.Context, op.TokenExchangeRequest) error {
	return nil
}
func (st *storage) GetPrivateClaimsFromTokenExchangeRequest(_ context.Context, r op.TokenExchangeRequest) (map[string]any, error) {
	claims := map[string]any{"scope": oidc.SpaceDelimitedArray(r.GetScopes()).String()}
	if g, ok := r.GetExchangeSubjectTokenClaims()["groups"]; ok {
		claims["groups"] = g
	}
	return claims, nil
}
func (st *storage) SetUserinfoFromTokenExchangeRequest(context.Context, *oidc.UserInfo, op.TokenExchangeRequest) error {
	return nil
}

// signingKey and publicKey are the server's RSA key.
type signingKey struct{ s *Server }

func (k signingKey) SignatureAlgorithm() jose.SignatureAlgorithm { return jose.RS256 }
func (k signingKey) Key() any                                    { return k.s.key }
func (k signingKey) ID() string                                  { return k.s.keyID }

type publicKey struct{ s *Server }

func (k publicKey) ID() string                         { return k.s.keyID }
func (k publicKey) Algorithm() jose.SignatureAlgorithm { return jose.RS256 }
func (k publicKey) Use() string                        { return "sig" }
func (k publicKey) Key() any                           { return &k.s.key.PublicKey }

// client is a confidential client with JWT access tokens.
type client struct {
	id       string
	lifetime time.Duration
}

func (c *client) GetID() string                        { return c.id }
func (c *client) RedirectURIs() []string               { return nil }
func (c *client) PostLogoutRedirectURIs() []string     { return nil }
func (c *client) ApplicationType() op.ApplicationType  { return op.ApplicationTypeWeb }
func (c *client) AuthMethod() oidc.AuthMethod          { return oidc.AuthMethodBasic }
func (c *client) ResponseTypes() []oidc.ResponseType   { return nil }
func (c *client) LoginURL(string) string               { return "" }
func (c *client) AccessTokenType() op.AccessTokenType  { return op.AccessTokenTypeJWT }
func (c *client) IDTokenLifetime() time.Duration       { return c.lifetime }
func (c *client) DevMode() bool                        { return false }
func (c *client) IsScopeAllowed(string) bool           { return true }
func (c *client) IDTokenUserinfoClaimsAssertion() bool { return false }
func (c *client) ClockSkew() time.Duration             { return 0 }
func (c *client) RestrictAdditionalIdTokenScopes() func([]string) []string {
	return func(s []string) []string { return s }
}
func (c *client) RestrictAdditionalAccessTokenScopes() func([]string) []string {
	return func(s []string) []string { return s }
}
func (c *client) GrantTypes() []oidc.GrantType {
	return []oidc.GrantType{oidc.GrantTypeTokenExchange, oidc.GrantTypeClientCredentials}
}
