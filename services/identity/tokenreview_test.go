package identity_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/v0m3/v0m3/services/identity"
	"github.com/v0m3/v0m3/services/internal/testkit"
)

// TestTokenReviewAgainstAPIServer authenticates real ServiceAccount tokens
// through a real kube-apiserver's TokenReview: a token the API server
// issued names its ServiceAccount and groups; a token for another audience
// and a forged one are refused.
func TestTokenReviewAgainstAPIServer(t *testing.T) {
	t.Parallel()
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
	ns, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "writer-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ServiceAccounts(ns.Name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "writer"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	token := func(audience string) string {
		t.Helper()
		tr, err := cs.CoreV1().ServiceAccounts(ns.Name).CreateToken(ctx, "writer",
			&authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{Audiences: []string{audience}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("request token: %v", err)
		}
		return tr.Status.Token
	}
	review := &identity.TokenReview{Client: cs.AuthenticationV1().TokenReviews(), Audiences: []string{"v0m3"}}

	c, err := review.Authenticate(ctx, token("v0m3"))
	if err != nil {
		t.Fatalf("a token the API server issued for v0m3 was refused: %v", err)
	}
	if want := "system:serviceaccount:" + ns.Name + ":writer"; c.ID != want || !slices.Contains(c.Groups, "system:serviceaccounts:"+ns.Name) || c.Issuer != "kubernetes" {
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
