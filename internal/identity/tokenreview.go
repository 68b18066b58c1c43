package identity

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/expirable"
	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DefaultTokenReviewTTL is how long a TokenReview answer is reused when
// TokenReview.CacheTTL is zero. Short, like the API server's own webhook
// token cache: a deleted ServiceAccount's token stays accepted at most
// this long, and a busy product service costs one review per token per
// period instead of one per call.
const DefaultTokenReviewTTL = 10 * time.Second

// tokenReviewCacheSize bounds the answers kept of each kind (accepted,
// refused); the oldest go first, so a flood of distinct tokens costs
// reviews, never memory. Refusals are kept apart: a flood of forged tokens
// evicts other refusals, never the answers for the tokens product services
// present, which would cost a review per call again.
const tokenReviewCacheSize = 4096

// TokenReviewer is the part of a Kubernetes client TokenReview needs.
type TokenReviewer interface {
	Create(ctx context.Context, tr *authnv1.TokenReview, opts metav1.CreateOptions) (*authnv1.TokenReview, error)
}

// TokenReview authenticates Kubernetes ServiceAccount (or other cluster)
// tokens by asking the API server, reusing each answer for CacheTTL.
type TokenReview struct {
	// Client creates TokenReviews, e.g.
	// clientset.AuthenticationV1().TokenReviews().
	Client TokenReviewer
	// Audiences the token must be valid for; empty means the API server's.
	Audiences []string
	// CacheTTL is how long an answer (accepted or refused) is reused; zero
	// means DefaultTokenReviewTTL, negative asks the API server every time.
	// An unreachable API server's error is never reused.
	CacheTTL time.Duration

	once sync.Once
	// size overrides tokenReviewCacheSize (tests).
	size int
	// accepted and refused hold the answers, apart (see
	// tokenReviewCacheSize); both nil when answers are not reused.
	accepted, refused *expirable.LRU[[sha256.Size]byte, review]
}

// review is one remembered answer.
type review struct {
	caller Caller
	err    error
	// until is when the answer stops being reused: the cache's TTL, or
	// sooner when the token itself expires sooner.
	until time.Time
}

// Authenticate asks the API server whether token is valid, or reuses its
// recent answer. The cache is keyed by the token's SHA-256: the token
// itself is never kept.
func (t *TokenReview) Authenticate(ctx context.Context, token string) (Caller, error) {
	t.once.Do(func() {
		if ttl := t.ttl(); ttl > 0 {
			t.accepted = expirable.NewLRU[[sha256.Size]byte, review](t.cacheSize(), nil, ttl)
			t.refused = expirable.NewLRU[[sha256.Size]byte, review](t.cacheSize(), nil, ttl)
		}
	})
	if t.accepted == nil {
		return t.ask(ctx, token)
	}
	key := sha256.Sum256([]byte(token))
	now := time.Now()
	for _, c := range []*expirable.LRU[[sha256.Size]byte, review]{t.accepted, t.refused} {
		if r, ok := c.Get(key); ok && now.Before(r.until) {
			return r.caller, r.err
		}
	}
	caller, err := t.ask(ctx, token)
	cache := t.accepted
	if err != nil {
		cache = t.refused
		var ae *AuthError
		if !errors.As(err, &ae) || ae.Unavailable {
			return caller, err // no answer to reuse
		}
	}
	until := now.Add(t.ttl())
	if exp, ok := expiry(token); ok && exp.Before(until) {
		until = exp
	}
	cache.Add(key, review{caller: caller, err: err, until: until})
	return caller, err
}

func (t *TokenReview) cacheSize() int {
	if t.size > 0 {
		return t.size
	}
	return tokenReviewCacheSize
}

func (t *TokenReview) ttl() time.Duration {
	if t.CacheTTL == 0 {
		return DefaultTokenReviewTTL
	}
	return t.CacheTTL
}

// expiry reads the exp claim of a JWT without verifying it. It can only
// shorten how long an answer the API server gave is reused, so an
// unverified value is safe here.
func expiry(token string) (time.Time, bool) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return time.Time{}, false
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return time.Time{}, false
	}
	var claims struct {
		Exp *float64 `json:"exp"`
	}
	if json.Unmarshal(payload, &claims) != nil || claims.Exp == nil {
		return time.Time{}, false
	}
	return time.Unix(int64(*claims.Exp), 0), true
}

// ask creates one TokenReview.
func (t *TokenReview) ask(ctx context.Context, token string) (Caller, error) {
	res, err := t.Client.Create(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token, Audiences: t.Audiences}}, metav1.CreateOptions{})
	if err != nil {
		return Caller{}, &AuthError{Reason: "TOKEN_REVIEW_UNAVAILABLE", Msg: "the Kubernetes API server could not review the token; try again shortly", Unavailable: true, Cause: err}
	}
	if !res.Status.Authenticated {
		return Caller{}, authErr("TOKEN_INVALID", "the Kubernetes API server did not authenticate the token")
	}
	if len(t.Audiences) > 0 && !slices.ContainsFunc(res.Status.Audiences, func(a string) bool { return slices.Contains(t.Audiences, a) }) {
		return Caller{}, authErr("TOKEN_AUDIENCE_MISMATCH", "the token is not valid for audience %s", strings.Join(t.Audiences, ", "))
	}
	return Caller{ID: res.Status.User.Username, Groups: res.Status.User.Groups, Issuer: IssuerKubernetes}, nil
}
