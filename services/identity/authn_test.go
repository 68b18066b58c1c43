package identity_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/v0m3/v0m3/services/identity"
)

// signer signs test tokens with its own key.
type signer struct {
	key *ecdsa.PrivateKey
	kid string
}

func newSigner(t *testing.T, kid string) *signer {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return &signer{key: k, kid: kid}
}

func (s *signer) jwks() jose.JSONWebKeySet {
	return jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: s.key.Public(), KeyID: s.kid, Algorithm: "ES256", Use: "sig"}}}
}

func (s *signer) sign(t *testing.T, claims map[string]any) string {
	t.Helper()
	sig, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: s.key}, (&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", s.kid))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jwt.Signed(sig).Claims(claims).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

const (
	testIssuer   = "https://issuer.example"
	testAudience = "v0m3"
)

// claims returns valid claims for alice at now, with overrides applied.
func claims(now time.Time, override map[string]any) map[string]any {
	c := map[string]any{
		"iss": testIssuer, "aud": []string{testAudience, "other"}, "sub": "alice",
		"exp": now.Add(time.Hour).Unix(), "iat": now.Unix(), "groups": []string{"authors", "reviewers"},
	}
	for k, v := range override {
		if v == nil {
			delete(c, k)
			continue
		}
		c[k] = v
	}
	return c
}

func writeJWKS(t *testing.T, set jose.JSONWebKeySet) string {
	t.Helper()
	data, err := jsonMarshal(set)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "jwks.json")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestJWTVerification: only a token signed by the issuer's key, from that
// issuer, for this audience, within its lifetime (give or take the skew)
// and naming a subject authenticates; each refusal says why.
func TestJWTVerification(t *testing.T) {
	t.Parallel()
	now := time.Now()
	good := newSigner(t, "k1")
	other := newSigner(t, "k1") // same key id, different key
	// The clock is pinned: the parallel subtests may start seconds later,
	// and the margins below (20 s into a 30 s skew) are about the rule,
	// not about how soon the test runs.
	authn, err := identity.NewJWT(context.Background(), identity.JWTConfig{
		Issuer: testIssuer, Audience: testAudience, JWKSFile: writeJWKS(t, good.jwks()), Skew: 30 * time.Second,
		Now: func() time.Time { return now },
	})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		token  string
		reason string
	}{
		{"valid", good.sign(t, claims(now, nil)), ""},
		{"within skew after expiry", good.sign(t, claims(now, map[string]any{"exp": now.Add(-20 * time.Second).Unix()})), ""},
		{"expired", good.sign(t, claims(now, map[string]any{"exp": now.Add(-time.Minute).Unix()})), "TOKEN_EXPIRED"},
		{"no expiry", good.sign(t, claims(now, map[string]any{"exp": nil})), "TOKEN_EXPIRED"},
		{"not yet valid", good.sign(t, claims(now, map[string]any{"nbf": now.Add(time.Minute).Unix()})), "TOKEN_NOT_YET_VALID"},
		{"wrong audience", good.sign(t, claims(now, map[string]any{"aud": "someone-else"})), "TOKEN_AUDIENCE_MISMATCH"},
		{"wrong issuer", good.sign(t, claims(now, map[string]any{"iss": "https://evil.example"})), "TOKEN_ISSUER_MISMATCH"},
		{"bad signature", other.sign(t, claims(now, nil)), "TOKEN_SIGNATURE_INVALID"},
		{"no subject", good.sign(t, claims(now, map[string]any{"sub": nil})), "TOKEN_MALFORMED"},
		{"groups not strings", good.sign(t, claims(now, map[string]any{"groups": []int{1}})), "TOKEN_MALFORMED"},
		{"not a JWT", "not-a-token", "TOKEN_MALFORMED"},
		{"unsigned", unsigned(t, claims(now, nil)), "TOKEN_MALFORMED"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := authn.Authenticate(context.Background(), tc.token)
			if tc.reason == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if c.ID != "alice" || len(c.Groups) != 2 || c.Groups[0] != "authors" || c.Issuer != testIssuer {
					t.Fatalf("caller = %+v", c)
				}
				return
			}
			var ae *identity.AuthError
			if !errors.As(err, &ae) || ae.Reason != tc.reason {
				t.Fatalf("err = %v, want reason %s", err, tc.reason)
			}
		})
	}
}

// unsigned returns a token with alg "none".
func unsigned(t *testing.T, c map[string]any) string {
	t.Helper()
	payload, err := jsonMarshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return b64(`{"alg":"none","typ":"JWT"}`) + "." + b64(string(payload)) + "."
}

// TestJWKSFromURL: keys served by the issuer are fetched, and a rotated key
// (a token naming a new key id) is picked up without a restart.
func TestJWKSFromURL(t *testing.T) {
	t.Parallel()
	first, second := newSigner(t, "k1"), newSigner(t, "k2")
	// The handler reads the published set while the test rotates it: the
	// race detector sees no ordering through the socket, so a lock gives one.
	var mu sync.Mutex
	set := first.jwks()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		data, _ := jsonMarshal(set)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(data)
	}))
	t.Cleanup(srv.Close)
	authn, err := identity.NewJWT(context.Background(), identity.JWTConfig{Issuer: testIssuer, Audience: testAudience, JWKSURL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if _, err := authn.Authenticate(context.Background(), first.sign(t, claims(now, nil))); err != nil {
		t.Fatalf("first key: %v", err)
	}
	if _, err := authn.Authenticate(context.Background(), second.sign(t, claims(now, nil))); err == nil {
		t.Fatal("a key the issuer does not publish was accepted")
	}
	mu.Lock()
	set.Keys = append(set.Keys, second.jwks().Keys...)
	mu.Unlock()
	// go-oidc shares one fetch among concurrent lookups and may hand a call
	// that arrives just after a fetch ends that fetch's (older) result, so
	// the rotated key is accepted on a following call, not necessarily the
	// first one.
	token := second.sign(t, claims(now, nil))
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := authn.Authenticate(context.Background(), token)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rotated key: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestJWTConfigRefused: a verifier without issuer, audience or keys is
// refused at start, not at the first call.
func TestJWTConfigRefused(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]identity.JWTConfig{
		"no issuer":    {Audience: "a", JWKSURL: "http://x"},
		"no audience":  {Issuer: "i", JWKSURL: "http://x"},
		"no keys":      {Issuer: "i", Audience: "a"},
		"both keys":    {Issuer: "i", Audience: "a", JWKSURL: "http://x", JWKSFile: "/x"},
		"missing file": {Issuer: "i", Audience: "a", JWKSFile: filepath.Join(t.TempDir(), "none.json")},
	} {
		if _, err := identity.NewJWT(context.Background(), cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestJWTVerifiedTokensStayChecked: a token presented again is served from
// the verification cache, but that never outlives what makes it valid:
// its expiry is checked on every call, and replacing the issuer's key file
// refuses a token signed by the removed key at once.
func TestJWTVerifiedTokensStayChecked(t *testing.T) {
	t.Parallel()
	start := time.Now()
	var now atomic.Int64
	now.Store(start.UnixNano())
	old, next := newSigner(t, "k1"), newSigner(t, "k2")
	jwks := writeJWKS(t, old.jwks())
	authn, err := identity.NewJWT(context.Background(), identity.JWTConfig{
		Issuer: testIssuer, Audience: testAudience, JWKSFile: jwks, Skew: time.Second,
		Now: func() time.Time { return time.Unix(0, now.Load()) },
	})
	if err != nil {
		t.Fatal(err)
	}
	tok := old.sign(t, claims(start, map[string]any{"exp": start.Add(time.Minute).Unix()}))
	authenticate := func() error { _, err := authn.Authenticate(context.Background(), tok); return err }
	for range 3 {
		if err := authenticate(); err != nil {
			t.Fatalf("a valid token was refused: %v", err)
		}
	}
	now.Store(start.Add(2 * time.Minute).UnixNano())
	var ae *identity.AuthError
	if err := authenticate(); !errors.As(err, &ae) || ae.Reason != "TOKEN_EXPIRED" {
		t.Fatalf("an expired token seen before: %v, want TOKEN_EXPIRED", err)
	}
	now.Store(start.UnixNano())
	if err := authenticate(); err != nil {
		t.Fatalf("within its life again: %v", err)
	}

	// The issuer rotates its key: the file now holds only the new one.
	data, err := jsonMarshal(next.jwks())
	if err != nil {
		t.Fatal(err)
	}
	tmp := jwks + ".new"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		t.Fatal(err)
	}
	// A later modification time than the first write, whatever the file
	// system's timestamp resolution.
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(tmp, later, later); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, jwks); err != nil {
		t.Fatal(err)
	}
	if err := authenticate(); !errors.As(err, &ae) || ae.Reason != "TOKEN_SIGNATURE_INVALID" {
		t.Fatalf("a token signed by the removed key: %v, want TOKEN_SIGNATURE_INVALID", err)
	}
	if _, err := authn.Authenticate(context.Background(), next.sign(t, claims(start, nil))); err != nil {
		t.Fatalf("a token signed by the new key: %v", err)
	}
}

// BenchmarkJWTAuthenticate measures authenticating the same bearer token
// again, as a product service's every call does.
func BenchmarkJWTAuthenticate(b *testing.B) {
	d, err := identity.NewDevIssuer()
	if err != nil {
		b.Fatal(err)
	}
	path, err := d.WriteFiles(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	a, err := d.Authenticator(path)
	if err != nil {
		b.Fatal(err)
	}
	tok, err := d.Mint("alice", []string{"authors"}, time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := a.Authenticate(context.Background(), tok); err != nil {
			b.Fatal(err)
		}
	}
}
