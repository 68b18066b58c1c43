package identity_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/testkit"
)

// TestTokenReviewAgainstAPIServer authenticates real ServiceAccount tokens
// through a real kube-apiserver's TokenReview: a token the API server
// issued names its ServiceAccount and groups; a token for another audience
// and a forged one are refused.
func TestTokenReviewAgainstAPIServer(t *testing.T) {
	t.Parallel()
	cs, ns, token := serviceAccount(t, "writer")
	ctx := context.Background()
	review := &identity.TokenReview{Client: cs.AuthenticationV1().TokenReviews(), Audiences: []string{"v0m3"}}

	c, err := review.Authenticate(ctx, token("v0m3"))
	if err != nil {
		t.Fatalf("a token the API server issued for v0m3 was refused: %v", err)
	}
	if want := "system:serviceaccount:" + ns + ":writer"; c.ID != want || !slices.Contains(c.Groups, "system:serviceaccounts:"+ns) || c.Issuer != "kubernetes" {
		t.Fatalf("caller = %+v, want %s in its namespace's group", c, want)
	}
	for name, tok := range map[string]string{
		"another audience": token("someone-else"),
		"forged":           tamper(token("v0m3")),
		"not a token":      "hello",
	} {
		_, err := review.Authenticate(ctx, tok)
		var ae *identity.AuthError
		if !errors.As(err, &ae) || (ae.Reason != "TOKEN_INVALID" && ae.Reason != "TOKEN_AUDIENCE_MISMATCH") {
			t.Errorf("%s: %v, want refused", name, err)
		}
	}
}

// serviceAccount starts a kube-apiserver holding ServiceAccount name in a
// namespace of its own, and returns a client, the namespace and a function
// that has the API server issue the account a token for an audience.
func serviceAccount(t *testing.T, name string) (*kubernetes.Clientset, string, func(audience string) string) {
	t.Helper()
	testkit.NeedsExternal(t, "kube-apiserver and etcd (make envtest)")
	assets, err := testkit.EnvtestAssets()
	if err != nil {
		t.Fatal(err)
	}
	env := &envtest.Environment{BinaryAssetsDirectory: assets}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start kube-apiserver: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ns, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: name + "-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ServiceAccounts(ns.Name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return cs, ns.Name, func(audience string) string {
		t.Helper()
		tr, err := cs.CoreV1().ServiceAccounts(ns.Name).CreateToken(ctx, name,
			&authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{Audiences: []string{audience}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("request token: %v", err)
		}
		return tr.Status.Token
	}
}

// tamper changes one character of a token's signature.
func tamper(tok string) string {
	i := strings.LastIndex(tok, ".") + 5
	b := []byte(tok)
	if b[i] == 'A' {
		b[i] = 'B'
	} else {
		b[i] = 'A'
	}
	return string(b)
}

// countingReviewer counts the reviews that reach the real API server.
type countingReviewer struct {
	identity.TokenReviewer
	n atomic.Int64
}

func (c *countingReviewer) Create(ctx context.Context, tr *authnv1.TokenReview, opts metav1.CreateOptions) (*authnv1.TokenReview, error) {
	c.n.Add(1)
	return c.TokenReviewer.Create(ctx, tr, opts)
}

// TestTokenReviewReusesAnswers: a product service presenting the same
// ServiceAccount token on every call costs one review per cache period,
// not one per call; a different token, and the same token once the period
// has passed, are asked about again; a refused token stays refused without
// asking again; a token that expires before the period ends is not
// accepted after its expiry; forged tokens do not push accepted answers
// out of the cache.
func TestTokenReviewReusesAnswers(t *testing.T) {
	t.Parallel()
	cs, ns, token := serviceAccount(t, "product")
	ctx := context.Background()
	client := &countingReviewer{TokenReviewer: cs.AuthenticationV1().TokenReviews()}
	const ttl = 2 * time.Second
	review := &identity.TokenReview{Client: client, Audiences: []string{"v0m3"}, CacheTTL: ttl}
	authenticate := func(tok string) (identity.Caller, error) { return review.Authenticate(ctx, tok) }

	first, second := token("v0m3"), token("v0m3")
	for range 5 {
		if c, err := authenticate(first); err != nil || c.ID != "system:serviceaccount:"+ns+":product" {
			t.Fatalf("authenticate = %+v, %v", c, err)
		}
	}
	if n := client.n.Load(); n != 1 {
		t.Errorf("five calls with one token made %d reviews, want 1", n)
	}
	if _, err := authenticate(second); err != nil {
		t.Fatal(err)
	}
	if n := client.n.Load(); n != 2 {
		t.Errorf("a second token made %d reviews in all, want 2", n)
	}
	forged := tamper(first)
	for range 3 {
		var ae *identity.AuthError
		if _, err := authenticate(forged); !errors.As(err, &ae) || ae.Reason != "TOKEN_INVALID" {
			t.Fatalf("forged token: %v, want TOKEN_INVALID", err)
		}
	}
	if n := client.n.Load(); n != 3 {
		t.Errorf("a forged token presented three times made %d reviews in all, want 3", n)
	}
	time.Sleep(ttl + 100*time.Millisecond)
	if _, err := authenticate(first); err != nil {
		t.Fatal(err)
	}
	if n := client.n.Load(); n != 4 {
		t.Errorf("after the cache period the token made %d reviews in all, want 4 (asked again)", n)
	}

	// An answer is not reused past the token's own expiry, even within
	// the cache period. The API server issues tokens for at least 10
	// minutes, so this token is made here: it is refused, and the refusal
	// is reused only until its exp.
	long := &identity.TokenReview{Client: client, Audiences: []string{"v0m3"}, CacheTTL: time.Hour}
	exp := time.Now().Add(time.Second).Unix()
	payload := base64.RawURLEncoding.EncodeToString([]byte(fmt.Sprintf(`{"sub":"x","exp":%d}`, exp)))
	soon := "eyJhbGciOiJSUzI1NiJ9." + payload + ".c2ln"
	before := client.n.Load()
	for range 2 {
		if _, err := long.Authenticate(ctx, soon); err == nil {
			t.Fatal("a made-up token was accepted")
		}
	}
	if n := client.n.Load() - before; n != 1 {
		t.Errorf("two presentations before its expiry made %d reviews, want 1", n)
	}
	time.Sleep(time.Until(time.Unix(exp, 0)) + 100*time.Millisecond)
	if _, err := long.Authenticate(ctx, soon); err == nil {
		t.Fatal("a made-up token was accepted")
	}
	if n := client.n.Load() - before; n != 2 {
		t.Errorf("after its expiry the token made %d reviews in all, want 2 (asked again)", n)
	}

	// A flood of forged tokens, more than the cache holds, does not evict
	// the answer for the token a product service presents on every call.
	small := &identity.TokenReview{Client: client, Audiences: []string{"v0m3"}, CacheTTL: time.Hour}
	small.SetCacheSize(4)
	if _, err := small.Authenticate(ctx, first); err != nil {
		t.Fatal(err)
	}
	before = client.n.Load()
	for i := range 10 {
		forged := "eyJhbGciOiJSUzI1NiJ9." + base64.RawURLEncoding.EncodeToString([]byte(fmt.Sprintf(`{"sub":"forged-%d"}`, i))) + ".c2ln"
		if _, err := small.Authenticate(ctx, forged); err == nil {
			t.Fatal("a forged token was accepted")
		}
	}
	if _, err := small.Authenticate(ctx, first); err != nil {
		t.Fatal(err)
	}
	if n := client.n.Load() - before; n != 10 {
		t.Errorf("ten forged tokens and the product service's token again made %d reviews, want 10 (its answer kept)", n)
	}
}

// failingReviewer is an API server that cannot be reached.
type failingReviewer struct{ n atomic.Int64 }

func (f *failingReviewer) Create(context.Context, *authnv1.TokenReview, metav1.CreateOptions) (*authnv1.TokenReview, error) {
	f.n.Add(1)
	return nil, errors.New("dial tcp 10.0.0.1:443: connect: connection refused")
}

// TestTokenReviewUnreachable: when the API server cannot be reached, a
// token is not refused but could not be checked (the guard answers
// UNAVAILABLE, see TestGuardSaysWhenATokenCannotBeChecked), the client
// library's error stays out of the answer, and the answer is not reused:
// the next call asks again.
func TestTokenReviewUnreachable(t *testing.T) {
	t.Parallel()
	client := &failingReviewer{}
	review := &identity.TokenReview{Client: client}
	for range 2 {
		_, err := review.Authenticate(context.Background(), "eyJhbGciOiJSUzI1NiJ9.e30.c2ln")
		var ae *identity.AuthError
		if !errors.As(err, &ae) || ae.Reason != "TOKEN_REVIEW_UNAVAILABLE" || !ae.Unavailable {
			t.Fatalf("API server unreachable: %v, want TOKEN_REVIEW_UNAVAILABLE, unavailable", err)
		}
		// The cause names an internal address: it is for the log, not
		// for whoever sent the token.
		if strings.Contains(err.Error(), "10.0.0.1") || ae.Cause == nil || !strings.Contains(ae.Cause.Error(), "10.0.0.1") {
			t.Fatalf("the caller reads %q (cause %v); want the API server's error kept for the log only", err, ae.Cause)
		}
	}
	if n := client.n.Load(); n != 2 {
		t.Fatalf("two calls made %d reviews, want 2 (an unreachable API server's error is not reused)", n)
	}
}
