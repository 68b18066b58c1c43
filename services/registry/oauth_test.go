package registry_test

import (
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/apierror"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/registry"
)

// oauthTransport is a streamable HTTP transport with an OAuth block.
func oauthTransport(o *registryv1.OAuthClient) *registryv1.Transport {
	return &registryv1.Transport{Kind: &registryv1.Transport_StreamableHttp{StreamableHttp: &registryv1.StreamableHTTPTransport{
		Url: "https://search.example/mcp", Oauth: o}}}
}

// machineClient is a valid client_credentials block.
func machineClient() *registryv1.OAuthClient {
	return &registryv1.OAuthClient{Grant: registryv1.OauthGrant_OAUTH_GRANT_CLIENT_CREDENTIALS, ClientId: "v0m3-search",
		ClientSecretRef: "file:/var/run/secrets/v0m3/search/oauth-secret", Issuer: "https://auth.example.com", Scopes: []string{"search:read"}}
}

// exchangeClient is a valid token_exchange block.
func exchangeClient() *registryv1.OAuthClient {
	return &registryv1.OAuthClient{Grant: registryv1.OauthGrant_OAUTH_GRANT_TOKEN_EXCHANGE, ClientId: "v0m3-boundary",
		ClientSecretRef: "file:/var/run/secrets/v0m3/search/oauth-secret", Issuer: "https://auth.example.com",
		Audience: "https://search.example/mcp", RequestedTokenType: "urn:ietf:params:oauth:token-type:access_token"}
}

// An OAuth block is checked field by field, and every refusal names the
// field and carries INVALID_OAUTH_CONFIG; a secret value is never echoed.
func TestCreateConnectionOAuth(t *testing.T) {
	t.Parallel()
	r := start(t)
	with := func(f func(o *registryv1.OAuthClient)) *registryv1.OAuthClient {
		o := machineClient()
		f(o)
		return o
	}
	const f = "transport.streamable_http.oauth."
	tests := []struct {
		name          string
		oauth         *registryv1.OAuthClient
		credentialRef string
		wantFields    []string // empty: accepted
	}{
		{name: "client credentials", oauth: machineClient()},
		{name: "pre-consented authorization code with a client ID metadata document", oauth: &registryv1.OAuthClient{
			Grant: registryv1.OauthGrant_OAUTH_GRANT_AUTHORIZATION_CODE, ClientIdMetadataUrl: "https://v0m3.example/oauth/client.json",
			RedirectUrl: "http://localhost:3000/callback"}},
		{name: "public authorization code client without issuer", oauth: &registryv1.OAuthClient{
			Grant: registryv1.OauthGrant_OAUTH_GRANT_AUTHORIZATION_CODE, ClientId: "v0m3", RedirectUrl: "https://v0m3.example/callback"}},
		{name: "dynamically registered public client", oauth: &registryv1.OAuthClient{
			Grant: registryv1.OauthGrant_OAUTH_GRANT_AUTHORIZATION_CODE, DynamicRegistration: true, RedirectUrl: "http://localhost:3000/callback"}},
		{name: "dynamic registration for client credentials", oauth: with(func(o *registryv1.OAuthClient) { o.DynamicRegistration = true }),
			wantFields: []string{f + "dynamic_registration"}},
		{name: "secret without a client id", oauth: &registryv1.OAuthClient{Grant: registryv1.OauthGrant_OAUTH_GRANT_AUTHORIZATION_CODE,
			ClientIdMetadataUrl: "https://v0m3.example/oauth/client.json", ClientSecretRef: "file:/s", Issuer: "https://auth.example.com", RedirectUrl: "https://v0m3.example/cb"},
			wantFields: []string{f + "client_secret_ref"}},
		{name: "loopback http issuer", oauth: with(func(o *registryv1.OAuthClient) { o.Issuer = "http://127.0.0.1:4444/" })},
		{name: "token exchange", oauth: exchangeClient()},
		{name: "token exchange without a secret", oauth: func() *registryv1.OAuthClient { o := exchangeClient(); o.ClientSecretRef = ""; return o }(),
			wantFields: []string{f + "client_secret_ref"}},
		{name: "token exchange without a client id", oauth: func() *registryv1.OAuthClient { o := exchangeClient(); o.ClientId = ""; return o }(),
			wantFields: []string{f + "client_id"}},
		{name: "token exchange with a redirect", oauth: func() *registryv1.OAuthClient {
			o := exchangeClient()
			o.RedirectUrl = "https://v0m3.example/cb"
			return o
		}(),
			wantFields: []string{f + "redirect_url"}},
		{name: "token exchange with a made-up token type", oauth: func() *registryv1.OAuthClient { o := exchangeClient(); o.RequestedTokenType = "jwt"; return o }(),
			wantFields: []string{f + "requested_token_type"}},
		{name: "audience for client credentials", oauth: with(func(o *registryv1.OAuthClient) { o.Audience = "search" }),
			wantFields: []string{f + "audience"}},
		{name: "token type for client credentials", oauth: with(func(o *registryv1.OAuthClient) {
			o.RequestedTokenType = "urn:ietf:params:oauth:token-type:access_token"
		}),
			wantFields: []string{f + "requested_token_type"}},
		{name: "no grant", oauth: with(func(o *registryv1.OAuthClient) { o.Grant = 0 }), wantFields: []string{f + "grant"}},
		{name: "no client", oauth: with(func(o *registryv1.OAuthClient) { o.ClientId = "" }), wantFields: []string{f + "client_id"}},
		{name: "secret value instead of a reference", oauth: with(func(o *registryv1.OAuthClient) { o.ClientSecretRef = "s3cr3t-value" }),
			wantFields: []string{f + "client_secret_ref"}},
		{name: "client credentials without a secret", oauth: with(func(o *registryv1.OAuthClient) { o.ClientSecretRef = "" }),
			wantFields: []string{f + "client_secret_ref"}},
		{name: "secret without an expected issuer", oauth: with(func(o *registryv1.OAuthClient) { o.Issuer = "" }),
			wantFields: []string{f + "issuer"}},
		{name: "plain http issuer off loopback", oauth: with(func(o *registryv1.OAuthClient) { o.Issuer = "http://auth.example.com" }),
			wantFields: []string{f + "issuer"}},
		{name: "issuer with a query", oauth: with(func(o *registryv1.OAuthClient) { o.Issuer = "https://auth.example.com?tenant=1" }),
			wantFields: []string{f + "issuer"}},
		{name: "scope with a space", oauth: with(func(o *registryv1.OAuthClient) { o.Scopes = []string{"search:read admin"} }),
			wantFields: []string{f + "scopes"}},
		{name: "resource with a fragment", oauth: with(func(o *registryv1.OAuthClient) { o.Resource = "https://search.example/mcp#x" }),
			wantFields: []string{f + "resource"}},
		{name: "redirect for client credentials", oauth: with(func(o *registryv1.OAuthClient) { o.RedirectUrl = "https://v0m3.example/cb" }),
			wantFields: []string{f + "redirect_url"}},
		{name: "authorization code without redirect", oauth: &registryv1.OAuthClient{Grant: registryv1.OauthGrant_OAUTH_GRANT_AUTHORIZATION_CODE, ClientId: "v0m3"},
			wantFields: []string{f + "redirect_url"}},
		{name: "metadata document over http", oauth: &registryv1.OAuthClient{Grant: registryv1.OauthGrant_OAUTH_GRANT_AUTHORIZATION_CODE,
			ClientIdMetadataUrl: "http://v0m3.example/client.json", RedirectUrl: "https://v0m3.example/cb"}, wantFields: []string{f + "client_id_metadata_url"}},
		{name: "static bearer and OAuth together", oauth: machineClient(), credentialRef: "file:/var/run/secrets/v0m3/search/token",
			wantFields: []string{"credential_ref"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			req := &registryv1.CreateConnectionRequest{DisplayName: "Search", Owner: "platform", Transport: oauthTransport(tt.oauth), CredentialRef: tt.credentialRef}
			c, err := r.client.CreateConnection(t.Context(), req)
			if len(tt.wantFields) == 0 {
				if err != nil {
					t.Fatalf("CreateConnection: %v", err)
				}
				if !proto.Equal(c.GetTransport().GetStreamableHttp().GetOauth(), tt.oauth) {
					t.Errorf("stored oauth = %v, want %v", c.GetTransport().GetStreamableHttp().GetOauth(), tt.oauth)
				}
				return
			}
			wantErr(t, err, codes.InvalidArgument, registry.ReasonInvalidOAuth)
			if got := apierror.Fields(err); !slices.Equal(got, tt.wantFields) {
				t.Errorf("violations = %v, want %v", got, tt.wantFields)
			}
			if strings.Contains(err.Error(), "s3cr3t-value") {
				t.Errorf("the error echoes the secret: %v", err)
			}
		})
	}
}

// Moving the OAuth client secret's reference is a new config revision
// that needs review again, as a new credential_ref does (the adapter would
// read another secret), and so does changing where tokens come from (the
// issuer) or what they may do (scopes).
func TestUpdateConnectionOAuth(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		change     func(o *registryv1.OAuthClient)
		wantReview registryv1.ReviewState
	}{
		{name: "secret moved", change: func(o *registryv1.OAuthClient) { o.ClientSecretRef += "-2" },
			wantReview: registryv1.ReviewState_REVIEW_STATE_PENDING},
		{name: "secret leaving its directory", change: func(o *registryv1.OAuthClient) { o.ClientSecretRef = "file:../con_other/oauth-secret" }},
		{name: "another authorization server", change: func(o *registryv1.OAuthClient) { o.Issuer = "https://other-auth.example.com" },
			wantReview: registryv1.ReviewState_REVIEW_STATE_PENDING},
		{name: "more scopes", change: func(o *registryv1.OAuthClient) { o.Scopes = append(o.Scopes, "search:admin") },
			wantReview: registryv1.ReviewState_REVIEW_STATE_PENDING},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := start(t)
			conn, err := r.client.CreateConnection(t.Context(), &registryv1.CreateConnectionRequest{DisplayName: "Search", Owner: "platform",
				Transport: oauthTransport(machineClient()), CredentialScope: "search read"})
			if err != nil {
				t.Fatal(err)
			}
			conn = reviewConn(t, r.client, conn, true)
			next := proto.CloneOf(conn.GetTransport())
			tt.change(next.GetStreamableHttp().GetOauth())
			got, err := r.client.UpdateConnection(t.Context(), &registryv1.UpdateConnectionRequest{Id: conn.GetId(), ExpectedConfigRevision: 1,
				Transport: next, CredentialScope: conn.GetCredentialScope()})
			if tt.wantReview == registryv1.ReviewState_REVIEW_STATE_UNSPECIFIED {
				wantErr(t, err, codes.InvalidArgument, registry.ReasonInvalidOAuth)
				return
			}
			if err != nil {
				t.Fatalf("UpdateConnection: %v", err)
			}
			if got.GetConfigRevision() != 2 || got.GetConfigDigest() == conn.GetConfigDigest() {
				t.Errorf("config revision %d digest %s; want a new revision 2 with a new digest", got.GetConfigRevision(), got.GetConfigDigest())
			}
			if got.GetReviewState() != tt.wantReview {
				t.Errorf("review state = %v, want %v", got.GetReviewState(), tt.wantReview)
			}
		})
	}
}
