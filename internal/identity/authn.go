package identity

import (
	"context"
	"crypto"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/hashicorp/golang-lru/v2/expirable"
)

// Authenticator verifies a bearer token and says who it names.
type Authenticator interface {
	// Authenticate returns the caller the token names, or an error (an
	// *AuthError when the reason is known) safe to show the caller: it
	// never contains the token.
	Authenticate(ctx context.Context, token string) (Caller, error)
}

// AuthError is a refused token with a stable reason.
type AuthError struct {
	// Reason is the ErrorInfo reason, e.g. TOKEN_EXPIRED.
	Reason string
	// Msg says what is wrong, safely.
	Msg string
	// Unavailable: the token could not be checked (what checks it is
	// down), which is no verdict on it; the caller may try again.
	Unavailable bool
	// Cause is why, for the service's log only: it may name internal
	// addresses, so it never reaches the caller.
	Cause error
}

func (e *AuthError) Error() string { return e.Msg }

func authErr(reason, format string, args ...any) error {
	return &AuthError{Reason: reason, Msg: fmt.Sprintf(format, args...)}
}

// JWTConfig configures OIDC/JWT bearer verification.
type JWTConfig struct {
	// Issuer is the required "iss". Required.
	Issuer string
	// Audience must be in "aud". Required.
	Audience string
	// JWKSURL serves the issuer's keys; keys are cached and fetched again
	// when a token names a key not held, at most every 10 seconds.
	// Exactly one of JWKSURL and JWKSFile.
	JWKSURL string
	// JWKSFile holds the issuer's keys as a JWK set; it is re-read when it
	// changes.
	JWKSFile string
	// Skew is the clock skew tolerated on exp, nbf and iat; zero means one
	// minute.
	Skew time.Duration
	// GroupsClaim names the claim holding the caller's groups (a string or
	// a list of strings); empty means "groups".
	GroupsClaim string
	// Now returns the current time; nil means time.Now.
	Now func() time.Time
}

// algorithms are the signature algorithms accepted on bearer tokens.
var algorithms = []jose.SignatureAlgorithm{jose.RS256, jose.RS384, jose.RS512, jose.PS256, jose.PS384, jose.PS512, jose.ES256, jose.ES384, jose.ES512, jose.EdDSA}

// JWT verifies bearer JWTs against an issuer's keys: signature, issuer,
// audience, expiry (required) and not-before, with a bounded clock skew.
type JWT struct {
	cfg  JWTConfig
	keys oidc.KeySet
	// verified remembers recently verified claims by token digest, so a
	// product service presenting one token on every call pays for the
	// signature once per verifiedTTL. Time claims are still checked on
	// every call.
	verified *expirable.LRU[[sha256.Size]byte, verifiedClaims]
}

// verifiedTTL bounds how long a verified signature is reused. A key
// removed from a remote key set stops verifying tokens already seen at
// most this much later; a key file that changes invalidates at once.
const verifiedTTL = 30 * time.Second

// verifiedClaims is a token whose signature verified.
type verifiedClaims struct {
	claims jwt.Claims
	extra  map[string]any
	// keys is the key file generation it verified against (0 for a remote
	// key set).
	keys uint64
}

// NewJWT returns a JWT authenticator.
func NewJWT(ctx context.Context, cfg JWTConfig) (*JWT, error) {
	switch {
	case cfg.Issuer == "":
		return nil, errors.New("identity: an OIDC issuer is required")
	case cfg.Audience == "":
		return nil, errors.New("identity: an OIDC audience is required")
	case cfg.Issuer == IssuerKubernetes:
		// Its subjects could claim the product service namespace.
		return nil, fmt.Errorf("identity: the OIDC issuer may not be %q: that names Kubernetes TokenReview", IssuerKubernetes)
	case (cfg.JWKSURL == "") == (cfg.JWKSFile == ""):
		return nil, errors.New("identity: give exactly one of a JWKS URL and a JWKS file")
	}
	if cfg.Skew == 0 {
		cfg.Skew = time.Minute
	}
	if cfg.GroupsClaim == "" {
		cfg.GroupsClaim = "groups"
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	j := &JWT{cfg: cfg, verified: expirable.NewLRU[[sha256.Size]byte, verifiedClaims](4096, nil, verifiedTTL)}
	if cfg.JWKSURL != "" {
		j.keys = newRemoteKeys(cfg.JWKSURL, cfg.Now)
	} else {
		fk := &fileKeys{path: cfg.JWKSFile}
		if _, err := fk.load(); err != nil {
			return nil, err
		}
		j.keys = fk
	}
	return j, nil
}

// Authenticate verifies token.
func (j *JWT) Authenticate(ctx context.Context, token string) (Caller, error) {
	v, err := j.verify(ctx, token)
	if err != nil {
		return Caller{}, err
	}
	claims, extra := v.claims, v.extra
	now := j.cfg.Now()
	switch {
	case claims.Issuer != j.cfg.Issuer:
		return Caller{}, authErr("TOKEN_ISSUER_MISMATCH", "the token was issued by %q, not by %q", claims.Issuer, j.cfg.Issuer)
	case !slices.Contains([]string(claims.Audience), j.cfg.Audience):
		return Caller{}, authErr("TOKEN_AUDIENCE_MISMATCH", "the token's audience does not include %q", j.cfg.Audience)
	case claims.Expiry == nil:
		return Caller{}, authErr("TOKEN_EXPIRED", "the token has no expiry (exp); only expiring tokens are accepted")
	case now.Add(-j.cfg.Skew).After(claims.Expiry.Time()):
		return Caller{}, authErr("TOKEN_EXPIRED", "the token expired at %s", claims.Expiry.Time().UTC().Format(time.RFC3339))
	case claims.NotBefore != nil && now.Add(j.cfg.Skew).Before(claims.NotBefore.Time()):
		return Caller{}, authErr("TOKEN_NOT_YET_VALID", "the token is not valid before %s", claims.NotBefore.Time().UTC().Format(time.RFC3339))
	case claims.IssuedAt != nil && now.Add(j.cfg.Skew).Before(claims.IssuedAt.Time()):
		return Caller{}, authErr("TOKEN_NOT_YET_VALID", "the token was issued in the future (%s)", claims.IssuedAt.Time().UTC().Format(time.RFC3339))
	case claims.Subject == "":
		return Caller{}, authErr("TOKEN_MALFORMED", "the token has no subject (sub)")
	}
	groups, err := stringsClaim(extra[j.cfg.GroupsClaim])
	if err != nil {
		return Caller{}, authErr("TOKEN_MALFORMED", "the token's %q claim must be a string or a list of strings", j.cfg.GroupsClaim)
	}
	return Caller{ID: claims.Subject, Groups: groups, Issuer: claims.Issuer}, nil
}

// verify checks token's signature, or finds that it was checked recently
// against the same keys, and returns its claims.
func (j *JWT) verify(ctx context.Context, token string) (verifiedClaims, error) {
	key := sha256.Sum256([]byte(token))
	fk, _ := j.keys.(*fileKeys)
	var gen uint64
	if fk != nil {
		if _, err := fk.load(); err != nil {
			return verifiedClaims{}, authErr("TOKEN_SIGNATURE_INVALID", "the issuer's keys could not be read")
		}
		gen = fk.generation()
	}
	if v, ok := j.verified.Get(key); ok && v.keys == gen {
		return v, nil
	}
	if _, err := jwt.ParseSigned(token, algorithms); err != nil {
		return verifiedClaims{}, authErr("TOKEN_MALFORMED", "the token is not a signed JWT")
	}
	payload, err := j.keys.VerifySignature(ctx, token)
	if errors.Is(err, errKeysUnavailable) {
		return verifiedClaims{}, &AuthError{Reason: "ISSUER_KEYS_UNAVAILABLE", Msg: "the token issuer's keys could not be fetched; try again shortly", Unavailable: true, Cause: err}
	}
	if err != nil {
		return verifiedClaims{}, authErr("TOKEN_SIGNATURE_INVALID", "the token's signature does not verify with the issuer's keys")
	}
	v := verifiedClaims{keys: gen}
	if err := json.Unmarshal(payload, &v.claims); err != nil {
		return verifiedClaims{}, authErr("TOKEN_MALFORMED", "the token's claims are not valid JSON")
	}
	if err := json.Unmarshal(payload, &v.extra); err != nil {
		return verifiedClaims{}, authErr("TOKEN_MALFORMED", "the token's claims are not valid JSON")
	}
	j.verified.Add(key, v)
	return v, nil
}

func stringsClaim(v any) ([]string, error) {
	switch v := v.(type) {
	case nil:
		return nil, nil
	case string:
		return strings.Fields(v), nil
	case []any:
		out := make([]string, 0, len(v))
		for _, x := range v {
			s, ok := x.(string)
			if !ok {
				return nil, errors.New("not a string")
			}
			out = append(out, s)
		}
		return out, nil
	default:
		return nil, errors.New("not a string list")
	}
}

// fileKeys is a JWK set in a file, re-read when the file changes.
type fileKeys struct {
	path string

	mu    sync.Mutex
	mtime time.Time
	keys  []crypto.PublicKey
	// gen counts the times the file was (re)loaded.
	gen uint64
}

// generation says which load of the file the current keys come from.
func (f *fileKeys) generation() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.gen
}

func (f *fileKeys) load() ([]crypto.PublicKey, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, err := os.Stat(f.path)
	if err != nil {
		return nil, fmt.Errorf("identity: JWKS file: %w", err)
	}
	if f.keys != nil && st.ModTime().Equal(f.mtime) {
		return f.keys, nil
	}
	data, err := os.ReadFile(f.path)
	if err != nil {
		return nil, fmt.Errorf("identity: JWKS file: %w", err)
	}
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(data, &set); err != nil {
		return nil, fmt.Errorf("identity: JWKS file %s: %w", f.path, err)
	}
	var keys []crypto.PublicKey
	for _, k := range set.Keys {
		if k.IsPublic() {
			keys = append(keys, k.Key)
		}
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("identity: JWKS file %s holds no public key", f.path)
	}
	f.keys, f.mtime = keys, st.ModTime()
	f.gen++
	return keys, nil
}

// VerifySignature implements oidc.KeySet.
func (f *fileKeys) VerifySignature(ctx context.Context, token string) ([]byte, error) {
	keys, err := f.load()
	if err != nil {
		return nil, err
	}
	return (&oidc.StaticKeySet{PublicKeys: keys}).VerifySignature(ctx, token)
}

// Chain tries authenticators in order; the first that accepts the token
// wins. When all refuse, the first that could not check it is returned
// (the token may be good there, so the caller should try again), else the
// first refusal.
type Chain []Authenticator

// Authenticate implements Authenticator.
func (c Chain) Authenticate(ctx context.Context, token string) (Caller, error) {
	var first error
	for _, a := range c {
		caller, err := a.Authenticate(ctx, token)
		if err == nil {
			return caller, nil
		}
		var ae *AuthError
		if errors.As(err, &ae) && ae.Unavailable {
			return Caller{}, err
		}
		if first == nil {
			first = err
		}
	}
	if first == nil {
		first = authErr("AUTHENTICATION_NOT_CONFIGURED", "no authenticator is configured")
	}
	return Caller{}, first
}
