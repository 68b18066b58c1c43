package grant

import (
	"errors"
	"fmt"
	"time"

	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/v0m3/v0m3/internal/identity"
)

// Subject tokens: where a connection's OAuth client uses token exchange
// (RFC 8693), the requester's identity must reach the remote server, yet
// the adapter never holds a person's bearer token. So the orchestrator
// asserts the verified requester itself, in a short-lived JWT bound to one
// attempt, signed with the key that signs execution grants and verifiable
// by the authorization server through the orchestrator's JWKS. The adapter
// exchanges it for an access token for that requester.

// SubjectIssuer is the iss of every subject token; an authorization server
// trusts tokens of this issuer verified with the orchestrator's JWKS.
const SubjectIssuer = "urn:v0m3:orchestrator"

// SubjectTokenType is the RFC 8693 type of a subject token: a JWT.
const SubjectTokenType = "urn:ietf:params:oauth:token-type:jwt"

// SubjectClaims are a subject token's claims.
type SubjectClaims struct {
	jwt.Claims
	// Groups are the requester's verified groups.
	Groups []string `json:"groups,omitempty"`
	// TaskID, AttemptID, IntentID and GrantID bind the token to the one
	// attempt it was minted for (for the authorization server's audit).
	TaskID    string `json:"v0m3_task_id"`
	AttemptID string `json:"v0m3_attempt_id"`
	IntentID  string `json:"v0m3_intent_id"`
	GrantID   string `json:"v0m3_grant_id"`
}

// WithSubject returns g carrying a subject token for requester (with
// groups) addressed to audience (the connection's authorization server
// issuer), signed with creds and expiring with g. id is the token's jti.
func WithSubject(creds *identity.Credentials, g Grant, id, requester string, groups []string, audience string) (Grant, error) {
	if requester == "" {
		return Grant{}, errors.New("grant: a subject token needs the task's requester")
	}
	if audience == "" {
		return Grant{}, errors.New("grant: a subject token needs the authorization server's issuer as audience")
	}
	c := SubjectClaims{
		Claims: jwt.Claims{
			Issuer: SubjectIssuer, Subject: requester, Audience: jwt.Audience{audience}, ID: id,
			IssuedAt: jwt.NewNumericDate(time.Unix(g.IssuedAt, 0)), NotBefore: jwt.NewNumericDate(time.Unix(g.IssuedAt, 0)),
			Expiry: jwt.NewNumericDate(time.Unix(g.ExpiresAt, 0)),
		},
		Groups: groups, TaskID: g.TaskID, AttemptID: g.AttemptID, IntentID: g.IntentID, GrantID: g.ID,
	}
	tok, err := creds.SignJWT(c)
	if err != nil {
		return Grant{}, fmt.Errorf("grant: sign subject token: %w", err)
	}
	g.Subject, g.SubjectToken = requester, tok
	return g, nil
}
