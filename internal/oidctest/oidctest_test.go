package oidctest_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"

	"github.com/v0m3/v0m3/internal/oidctest"
)

// accessClaims are the claims a V0M3 verifier maps from Hydra's tokens.
type accessClaims struct {
	Issuer   string         `json:"iss"`
	Subject  string         `json:"sub"`
	ClientID string         `json:"client_id"`
	Audience []string       `json:"aud"`
	Scopes   []string       `json:"scp"`
	Groups   []string       `json:"groups"`
	Team     *string        `json:"team"`
	Ext      map[string]any `json:"ext"`
	Expiry   int64          `json:"exp"`
}

// TestTokenVerifiesAgainstIssuer proves the harness end to end: a client
// registered through Hydra's admin API gets a real JWT over HTTP, and an
// independent OIDC library verifies it against the issuer's published keys,
// both through discovery and through the bare JWKS URL, and finds the claims
// the V0M3 verifier maps.
func TestTokenVerifiesAgainstIssuer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := oidctest.Start(t)
	c := srv.CreateClient(t, oidctest.Client{
		Audience: []string{"v0m3", "other-api"},
		Scopes:   []string{"v0m3.read", "v0m3.write"},
		Claims:   map[string]any{"groups": []string{"admins", "ops"}, "team": "red"},
	})
	raw := srv.Token(t, c, []string{"v0m3"}, "v0m3.read")

	provider, err := oidc.NewProvider(ctx, srv.Issuer())
	if err != nil {
		t.Fatalf("discovery at %s: %v", srv.Issuer(), err)
	}
	verifiers := map[string]*oidc.IDTokenVerifier{
		"discovery": provider.Verifier(&oidc.Config{ClientID: "v0m3"}),
		"jwks url":  oidc.NewVerifier(srv.Issuer(), oidc.NewRemoteKeySet(ctx, srv.JWKSURL()), &oidc.Config{ClientID: "v0m3"}),
	}
	for name, v := range verifiers {
		t.Run(name, func(t *testing.T) {
			tok, err := v.Verify(ctx, raw)
			if err != nil {
				t.Fatalf("verify: %v", err)
			}
			var got accessClaims
			if err := tok.Claims(&got); err != nil {
				t.Fatal(err)
			}
			if got.Issuer != srv.Issuer() || got.Subject != c.ID || got.ClientID != c.ID {
				t.Errorf("iss, sub, client_id = %q, %q, %q; want %q, %q, %q", got.Issuer, got.Subject, got.ClientID, srv.Issuer(), c.ID, c.ID)
			}
			if !slices.Equal(got.Audience, []string{"v0m3"}) {
				t.Errorf("aud = %q, want only the audience asked for", got.Audience)
			}
			if !slices.Equal(got.Scopes, []string{"v0m3.read"}) {
				t.Errorf("scp = %q, want only the scope asked for", got.Scopes)
			}
			if !slices.Equal(got.Groups, []string{"admins", "ops"}) {
				t.Errorf("top-level groups = %q, want the client's groups", got.Groups)
			}
			if got.Team != nil {
				t.Errorf("team = %q at the top level, but it is not an allowed top-level claim", *got.Team)
			}
			if got.Ext["team"] != "red" {
				t.Errorf("ext = %v, want every extra claim mirrored there", got.Ext)
			}
			if left := time.Until(time.Unix(got.Expiry, 0)); left < 50*time.Minute || left > time.Hour {
				t.Errorf("token expires in %v, want Hydra's default hour", left)
			}
		})
	}
}

// TestRefusals proves that what a verifier must refuse is what the harness
// produces: each token below fails verification against srv for the stated
// reason, so a V0M3 test built on these cannot pass by accident.
func TestRefusals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := oidctest.Start(t)
	verifier := oidc.NewVerifier(srv.Issuer(), oidc.NewRemoteKeySet(ctx, srv.JWKSURL()), &oidc.Config{ClientID: "v0m3"})

	c := srv.CreateClient(t, oidctest.Client{Audience: []string{"v0m3", "other-api"}})
	shortLived := srv.CreateClient(t, oidctest.Client{Audience: []string{"v0m3"}, AccessTokenLifespan: time.Second})
	opaque := srv.CreateClient(t, oidctest.Client{Audience: []string{"v0m3"}, Opaque: true})

	// A second authorization server has its own signing keys: its token for
	// the same client ID and audience, valid at home, must not verify here.
	stranger := oidctest.Start(t)
	sc := stranger.CreateClient(t, oidctest.Client{ID: c.ID, Audience: []string{"v0m3"}})

	expired := srv.Token(t, shortLived, []string{"v0m3"})
	valid := srv.Token(t, c, []string{"v0m3"})
	tests := []struct {
		name  string
		token string
		want  string // part of go-oidc's error
	}{
		{"other audience", srv.Token(t, c, []string{"other-api"}), "expected audience"},
		{"no audience", srv.Token(t, c, nil), "expected audience"},
		{"other server's token", stranger.Token(t, sc, []string{"v0m3"}), "failed to verify signature"},
		{"opaque token", srv.Token(t, opaque, []string{"v0m3"}), "malformed jwt"},
		{"tampered payload", tamper(t, valid), "failed to verify signature"},
		{"expired", expired, "token is expired"},
	}
	time.Sleep(1500 * time.Millisecond) // let the one-second token expire
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := verifier.Verify(ctx, tc.token)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("verify: %v, want an error containing %q", err, tc.want)
			}
		})
	}
	t.Run("valid control", func(t *testing.T) {
		if _, err := verifier.Verify(ctx, valid); err != nil {
			t.Fatalf("the untouched token must verify: %v", err)
		}
	})
}

// TestTokenEndpointRefusals shows Hydra itself refuses bad client
// credentials and audiences the client may not have, with OAuth error codes.
func TestTokenEndpointRefusals(t *testing.T) {
	t.Parallel()
	srv := oidctest.Start(t)
	c := srv.CreateClient(t, oidctest.Client{Audience: []string{"v0m3"}, Scopes: []string{"v0m3.read"}})
	tests := []struct {
		name     string
		id       string
		secret   string
		audience []string
		scopes   []string
		want     string
	}{
		{"wrong secret", c.ID, c.Secret + "x", []string{"v0m3"}, nil, "invalid_client"},
		{"unknown client", "nobody", c.Secret, []string{"v0m3"}, nil, "invalid_client"},
		{"audience not allowed", c.ID, c.Secret, []string{"admin-api"}, nil, "invalid_request"},
		{"scope not allowed", c.ID, c.Secret, []string{"v0m3"}, []string{"v0m3.admin"}, "invalid_scope"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tok, err := srv.FetchToken(context.Background(), tc.id, tc.secret, tc.audience, tc.scopes...)
			var re *oauth2.RetrieveError
			if !errors.As(err, &re) || re.ErrorCode != tc.want {
				t.Fatalf("FetchToken = %q, %v; want an OAuth error %q", tok, err, tc.want)
			}
		})
	}
}

// tamper rewrites the token's subject while keeping its signature.
func tamper(t *testing.T, raw string) string {
	t.Helper()
	parts := strings.Split(raw, ".")
	if len(parts) != 3 {
		t.Fatalf("not a JWS: %q", raw)
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var claims map[string]any
	if err := json.Unmarshal(payload, &claims); err != nil {
		t.Fatal(err)
	}
	claims["sub"] = "admin"
	payload, err = json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	parts[1] = base64.RawURLEncoding.EncodeToString(payload)
	return strings.Join(parts, ".")
}
