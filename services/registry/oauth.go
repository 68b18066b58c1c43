package registry

import (
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/v0m3/v0m3/internal/apierror"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// ReasonInvalidOAuth is the ErrorInfo reason of a connection whose OAuth
// block is incomplete or inconsistent.
const ReasonInvalidOAuth = "INVALID_OAUTH_CONFIG"

// OAuth block bounds: what a person types, never a document.
const (
	maxOAuthScopes   = 32
	maxOAuthFieldLen = 2048
)

// validateOAuth checks a streamable HTTP connection's OAuth block (nil:
// nothing to check). credentialRef is the connection's static bearer
// reference, which the OAuth block replaces.
func validateOAuth(o *registryv1.OAuthClient, credentialRef string) []apierror.FieldViolation {
	if o == nil {
		return nil
	}
	const f = "transport.streamable_http.oauth."
	var v []apierror.FieldViolation
	bad := func(field, format string, args ...any) {
		v = append(v, apierror.FieldViolation{Field: f + field, Description: fmt.Sprintf(format, args...)})
	}
	for name, val := range map[string]string{"client_id": o.GetClientId(), "client_id_metadata_url": o.GetClientIdMetadataUrl(),
		"client_secret_ref": o.GetClientSecretRef(), "issuer": o.GetIssuer(), "resource": o.GetResource(), "redirect_url": o.GetRedirectUrl(),
		"audience": o.GetAudience(), "requested_token_type": o.GetRequestedTokenType()} {
		if len(val) > maxOAuthFieldLen {
			bad(name, "longer than %d bytes", maxOAuthFieldLen)
		}
	}
	if credentialRef != "" {
		v = append(v, apierror.FieldViolation{Field: "credential_ref",
			Description: "a connection authenticates either with a static bearer token (credential_ref) or with OAuth (transport.streamable_http.oauth), not both; put the client secret's reference in oauth.client_secret_ref"})
	}
	grant := o.GetGrant()
	switch grant {
	case registryv1.OauthGrant_OAUTH_GRANT_CLIENT_CREDENTIALS, registryv1.OauthGrant_OAUTH_GRANT_AUTHORIZATION_CODE, registryv1.OauthGrant_OAUTH_GRANT_TOKEN_EXCHANGE:
	default:
		bad("grant", "a grant is required: client_credentials, authorization_code or token_exchange")
	}
	code := grant == registryv1.OauthGrant_OAUTH_GRANT_AUTHORIZATION_CODE
	exchange := grant == registryv1.OauthGrant_OAUTH_GRANT_TOKEN_EXCHANGE
	id, doc := o.GetClientId(), o.GetClientIdMetadataUrl()
	switch {
	case id == "" && !code:
		bad("client_id", "the %s grant needs the client_id registered with the authorization server", grantName(grant))
	case id == "" && doc == "" && !o.GetDynamicRegistration():
		bad("client_id", "a client_id, a client_id_metadata_url or dynamic_registration is required")
	case strings.ContainsAny(id, " \t\r\n\x00"):
		bad("client_id", "must not contain spaces or control characters")
	}
	if doc != "" {
		if !code {
			bad("client_id_metadata_url", "a client ID metadata document identifies a client of the authorization_code grant only")
		}
		if u, err := url.Parse(doc); err != nil || u.Scheme != "https" || u.Host == "" || u.Path == "" || u.Path == "/" || u.Fragment != "" || u.User != nil {
			bad("client_id_metadata_url", "must be an https URL with a path and no fragment or user information")
		}
	}
	if o.GetDynamicRegistration() && !code {
		bad("dynamic_registration", "only a client of the authorization_code grant registers dynamically")
	}
	ref := o.GetClientSecretRef()
	switch {
	case ref != "" && credentialRefProblem(ref) != "":
		bad("client_secret_ref", "%s", credentialRefProblem(ref))
	case ref == "" && !code:
		bad("client_secret_ref", "the %s grant needs a confidential client: set the reference of its secret", grantName(grant))
	case ref != "" && id == "" && code:
		bad("client_secret_ref", "a secret belongs to a pre-registered client: set its client_id")
	}
	if iss := o.GetIssuer(); iss != "" {
		if err := checkAuthURL(iss); err != nil {
			bad("issuer", "%v", err)
		}
	} else if ref != "" {
		// Without it the server's metadata would decide where the secret
		// is sent.
		bad("issuer", "the expected authorization server issuer is required with a client secret, so the secret goes to that server only")
	}
	if r := o.GetResource(); r != "" {
		if u, err := url.Parse(r); err != nil || u.Scheme == "" || u.Host == "" || u.Fragment != "" {
			bad("resource", "must be an absolute URI without a fragment (RFC 8707)")
		}
	}
	switch redirect := o.GetRedirectUrl(); {
	case grant == registryv1.OauthGrant_OAUTH_GRANT_AUTHORIZATION_CODE && redirect == "":
		bad("redirect_url", "the authorization_code grant needs the redirect URI registered for the client")
	case grant != registryv1.OauthGrant_OAUTH_GRANT_AUTHORIZATION_CODE && redirect != "":
		bad("redirect_url", "only the authorization_code grant uses a redirect URI")
	case redirect != "":
		if u, err := url.Parse(redirect); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.Fragment != "" {
			bad("redirect_url", "must be an http or https URL without a fragment")
		}
	}
	if a := o.GetAudience(); a != "" {
		if !exchange {
			bad("audience", "only the token_exchange grant asks for an audience")
		} else if strings.ContainsFunc(a, func(r rune) bool { return r <= 0x20 || r >= 0x7f }) {
			bad("audience", "must be printable ASCII without spaces")
		}
	}
	if t := o.GetRequestedTokenType(); t != "" {
		if !exchange {
			bad("requested_token_type", "only the token_exchange grant asks for a token type")
		} else if !strings.HasPrefix(t, "urn:ietf:params:oauth:token-type:") {
			bad("requested_token_type", `must be an RFC 8693 token type URI, e.g. "urn:ietf:params:oauth:token-type:access_token"`)
		}
	}
	if len(o.GetScopes()) > maxOAuthScopes {
		bad("scopes", "at most %d scopes", maxOAuthScopes)
	}
	for _, sc := range o.GetScopes() {
		// RFC 6749 section 3.3: printable ASCII but space, quote and backslash.
		if sc == "" || len(sc) > 256 || strings.ContainsFunc(sc, func(r rune) bool { return r <= 0x20 || r >= 0x7f || r == '"' || r == '\\' }) {
			bad("scopes", "%q is not a scope token (printable ASCII, no spaces, quotes or backslashes)", truncateText(sc, 64))
		}
	}
	return v
}

// grantName is a grant as the CLI and errors name it.
func grantName(g registryv1.OauthGrant) string {
	switch g {
	case registryv1.OauthGrant_OAUTH_GRANT_AUTHORIZATION_CODE:
		return "authorization_code"
	case registryv1.OauthGrant_OAUTH_GRANT_TOKEN_EXCHANGE:
		return "token_exchange"
	}
	return "client_credentials"
}

// checkAuthURL checks an authorization server's issuer: https, or http on
// a loopback host (development), with no query, fragment or user
// information (RFC 8414 section 2).
func checkAuthURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return fmt.Errorf("not an absolute URL")
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return fmt.Errorf("an issuer has no query, fragment or user information")
	}
	switch u.Scheme {
	case "https":
		return nil
	case "http":
		if h := u.Hostname(); h == "localhost" || isLoopbackIP(h) {
			return nil
		}
	}
	return fmt.Errorf("the issuer must be https (http only on a loopback host)")
}

func isLoopbackIP(h string) bool {
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

func truncateText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
