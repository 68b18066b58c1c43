package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"

	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// runConnect creates a connection to a remote MCP server reached over
// streamable HTTP, as the person running it (a platform engineer), with
// either a static bearer credential reference or an OAuth 2.1 client. The
// connection is pending review; it prints what the registry recorded.
func runConnect(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("connect", stderr)
	rf := addRegistryFlags(fs)
	req := connectFlags(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	r, err := req()
	if err != nil {
		return err
	}
	c, ctx, closeConn, err := rf.dial(ctx)
	if err != nil {
		return err
	}
	defer closeConn()
	conn, err := c.CreateConnection(ctx, r)
	if err != nil {
		return fmt.Errorf("create connection: %w", err)
	}
	b, err := protojson.MarshalOptions{UseProtoNames: true, Multiline: true}.Marshal(conn)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "%s\n", b)
	return err
}

// grantNames maps the --oauth-grant values to grants.
var grantNames = map[string]registryv1.OauthGrant{
	"client_credentials": registryv1.OauthGrant_OAUTH_GRANT_CLIENT_CREDENTIALS,
	"authorization_code": registryv1.OauthGrant_OAUTH_GRANT_AUTHORIZATION_CODE,
	"token_exchange":     registryv1.OauthGrant_OAUTH_GRANT_TOKEN_EXCHANGE,
}

// connectFlags declares connect's flags on fs and returns the function
// that builds the request from them once parsed. The registry checks the
// request; only what the flags themselves cannot express is refused here.
func connectFlags(fs *flag.FlagSet) func() (*registryv1.CreateConnectionRequest, error) {
	name := fs.String("name", "", "the connection's display name (required)")
	owner := fs.String("owner", "", "the team or person responsible (required)")
	url := fs.String("url", "", "the server's streamable HTTP endpoint, e.g. https://search.example/mcp (required)")
	credRef := fs.String("credential-ref", "", `static bearer token reference: "file:<name>", a file in the connection's directory under the adapter's --credential-roots (not with --oauth-grant)`)
	credScope := fs.String("credential-scope", "", "a safe description of what the credential may do")
	credVersion := fs.String("credential-version", "", "an opaque version of the credential (a new one is a rotation)")
	grant := fs.String("oauth-grant", "", "authorize with OAuth 2.1: client_credentials, authorization_code for a pre-consented client, or token_exchange so each call reaches the server as its requester (RFC 8693)")
	clientID := fs.String("oauth-client-id", "", "the OAuth client id registered with the authorization server")
	metadataURL := fs.String("oauth-client-metadata-url", "", "a client ID metadata document URL (https; authorization_code)")
	secretRef := fs.String("oauth-client-secret-ref", "", `where the adapter reads the client secret: "file:<name>", a file in the connection's directory under the adapter's --credential-roots; never the secret`)
	scopes := fs.String("oauth-scopes", "", "space-separated scopes to request when the server names none")
	issuer := fs.String("oauth-issuer", "", "the authorization server's issuer; the adapter sends the client's credentials to it only (required with a secret)")
	resource := fs.String("oauth-resource", "", "the resource indicator to request tokens for (default: the server's protected resource metadata)")
	redirect := fs.String("oauth-redirect-url", "", "the redirect URI registered for the client (authorization_code)")
	dcr := fs.Bool("oauth-dynamic-registration", false, "register a public client dynamically where the server offers it (authorization_code)")
	audience := fs.String("oauth-audience", "", "the audience a token exchange asks for (token_exchange; default: the resource)")
	tokenType := fs.String("oauth-requested-token-type", "", "the token type a token exchange asks for (token_exchange; default: urn:ietf:params:oauth:token-type:access_token)")
	return func() (*registryv1.CreateConnectionRequest, error) {
		t := &registryv1.StreamableHTTPTransport{Url: *url}
		oauthSet := *clientID != "" || *metadataURL != "" || *secretRef != "" || *scopes != "" || *issuer != "" || *resource != "" || *redirect != "" || *dcr ||
			*audience != "" || *tokenType != ""
		switch g, ok := grantNames[*grant]; {
		case *grant == "" && oauthSet:
			return nil, usageError{"--oauth-* flags need --oauth-grant (client_credentials, authorization_code or token_exchange)"}
		case *grant != "" && !ok:
			return nil, usageError{fmt.Sprintf("--oauth-grant %q: want client_credentials, authorization_code or token_exchange", *grant)}
		case ok:
			t.Oauth = &registryv1.OAuthClient{Grant: g, ClientId: *clientID, ClientIdMetadataUrl: *metadataURL, ClientSecretRef: *secretRef,
				Scopes: strings.Fields(*scopes), Issuer: *issuer, Resource: *resource, RedirectUrl: *redirect, DynamicRegistration: *dcr,
				Audience: *audience, RequestedTokenType: *tokenType}
		}
		return &registryv1.CreateConnectionRequest{
			DisplayName: *name, Owner: *owner,
			Transport:       &registryv1.Transport{Kind: &registryv1.Transport_StreamableHttp{StreamableHttp: t}},
			CredentialRef:   *credRef,
			CredentialScope: *credScope, CredentialVersion: *credVersion,
		}, nil
	}
}
