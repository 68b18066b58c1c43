package identity_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"fmt"
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

	"github.com/v0m3/v0m3/internal/identity"
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
// (a token naming a new key id) is picked up without a restart. Forged
// tokens cost the issuer nothing: one naming a key the set holds is
// refused without a fetch, and a flood naming keys it lacks costs one
// fetch per 10 seconds, not one per token. An issuer whose keys cannot be
// fetched makes tokens UNAVAILABLE to check, not invalid.
func TestJWKSFromURL(t *testing.T) {
	t.Parallel()
	first, second := newSigner(t, "k1"), newSigner(t, "k2")
	forger := newSigner(t, "k1") // the issuer's key id, another key
	// The handler reads the published set while the test rotates it: the
	// race detector sees no ordering through the socket, so a lock gives one.
	var (
		mu      sync.Mutex
		set     = first.jwks()
		down    bool
		fetches atomic.Int64
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fetches.Add(1)
		mu.Lock()
		defer mu.Unlock()
		if down {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		data, _ := jsonMarshal(set)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(data)
	}))
	t.Cleanup(srv.Close)
	start := time.Now()
	var now atomic.Int64
	now.Store(start.UnixNano())
	later := func(d time.Duration) { now.Add(int64(d)) }
	authn, err := identity.NewJWT(context.Background(), identity.JWTConfig{Issuer: testIssuer, Audience: testAudience, JWKSURL: srv.URL,
		Now: func() time.Time { return time.Unix(0, now.Load()) }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	reason := func(tok string) string {
		_, err := authn.Authenticate(ctx, tok)
		var ae *identity.AuthError
		switch {
		case err == nil:
			return ""
		case errors.As(err, &ae):
			return ae.Reason
		}
		return err.Error()
	}
	wantFetches := func(step string, want int64) {
		t.Helper()
		if n := fetches.Load(); n != want {
			t.Fatalf("%s: the issuer served its keys %d times in all, want %d", step, n, want)
		}
	}

	if r := reason(first.sign(t, claims(start, nil))); r != "" {
		t.Fatalf("first key: %s", r)
	}
	wantFetches("the first token", 1)
	for i := range 50 {
		if r := reason(forger.sign(t, claims(start, map[string]any{"sub": fmt.Sprint("forged-", i)}))); r != "TOKEN_SIGNATURE_INVALID" {
			t.Fatalf("a forged token naming the issuer's key: %s, want TOKEN_SIGNATURE_INVALID", r)
		}
		stranger := newSigner(t, fmt.Sprint("made-up-", i))
		if r := reason(stranger.sign(t, claims(start, nil))); r != "TOKEN_SIGNATURE_INVALID" {
			t.Fatalf("a token naming a key the issuer does not publish: %s, want TOKEN_SIGNATURE_INVALID", r)
		}
	}
	wantFetches("100 forged tokens within 10 seconds of the first fetch", 1)

	// The issuer rotates: a token naming the new key is refused until
	// 10 seconds after the last fetch, then fetches the set once.
	mu.Lock()
	set.Keys = append(set.Keys, second.jwks().Keys...)
	mu.Unlock()
	rotated := second.sign(t, claims(start, nil))
	if r := reason(rotated); r != "TOKEN_SIGNATURE_INVALID" {
		t.Fatalf("a new key within 10 seconds of the last fetch: %s, want TOKEN_SIGNATURE_INVALID", r)
	}
	later(10 * time.Second)
	if r := reason(rotated); r != "" {
		t.Fatalf("rotated key: %s", r)
	}
	if r := reason(first.sign(t, claims(start, map[string]any{"sub": "bob"}))); r != "" {
		t.Fatalf("the first key after the rotation: %s", r)
	}
	wantFetches("the rotation", 2)

	// The issuer goes down: held keys keep working, a new key id cannot
	// be checked, and the failed fetch is not repeated within 10 seconds.
	mu.Lock()
	down = true
	mu.Unlock()
	later(10 * time.Second)
	for range 3 {
		if r := reason(newSigner(t, "k3").sign(t, claims(start, nil))); r != "TOKEN_SIGNATURE_INVALID" {
			t.Fatalf("a key not held while the issuer is down: %s, want TOKEN_SIGNATURE_INVALID", r)
		}
	}
	if r := reason(first.sign(t, claims(start, map[string]any{"sub": "carol"}))); r != "" {
		t.Fatalf("a held key while the issuer is down: %s", r)
	}
	wantFetches("the issuer down", 3)
}

// TestJWKSIssuerDownAtStart: before any key was fetched, a token cannot
// be checked: UNAVAILABLE ISSUER_KEYS_UNAVAILABLE, no verdict on it, and
// the fetch is tried again 10 seconds later, not per token.
func TestJWKSIssuerDownAtStart(t *testing.T) {
	t.Parallel()
	s := newSigner(t, "k1")
	var (
		up      atomic.Bool
		fetches atomic.Int64
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fetches.Add(1)
		if !up.Load() {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		data, _ := jsonMarshal(s.jwks())
		_, _ = w.Write(data)
	}))
	t.Cleanup(srv.Close)
	start := time.Now()
	var now atomic.Int64
	now.Store(start.UnixNano())
	authn, err := identity.NewJWT(context.Background(), identity.JWTConfig{Issuer: testIssuer, Audience: testAudience, JWKSURL: srv.URL,
		Now: func() time.Time { return time.Unix(0, now.Load()) }})
	if err != nil {
		t.Fatal(err)
	}
	tok := s.sign(t, claims(start, nil))
	for range 3 {
		_, err := authn.Authenticate(context.Background(), tok)
		var ae *identity.AuthError
		if !errors.As(err, &ae) || ae.Reason != "ISSUER_KEYS_UNAVAILABLE" || !ae.Unavailable {
			t.Fatalf("a token while the issuer's keys cannot be fetched: %v, want ISSUER_KEYS_UNAVAILABLE", err)
		}
	}
	if n := fetches.Load(); n != 1 {
		t.Fatalf("three tokens within 10 seconds made %d fetches, want 1", n)
	}
	up.Store(true)
	now.Add(int64(10 * time.Second))
	if _, err := authn.Authenticate(context.Background(), tok); err != nil {
		t.Fatalf("once the issuer is up: %v", err)
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
