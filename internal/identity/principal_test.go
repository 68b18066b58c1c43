package identity_test

import (
	"context"
	"errors"
	"testing"

	"github.com/v0m3/v0m3/internal/identity"
)

// TestCheckSubject: no issuer vouches for a V0M3 service's principal, and
// only TokenReview for a Kubernetes workload's; people keep their ids.
func TestCheckSubject(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		subject, issuer string
		ok              bool
	}{
		{"alice", "https://idp.example", true},
		{"operator", "https://idp.example", true},
		{"alice@service.example", "https://idp.example", true},
		{"system:serviceaccount:writer:writer", identity.IssuerKubernetes, true},
		{"service:operator", "https://idp.example", false},
		{"service:operator", identity.IssuerKubernetes, false},
		{"SERVICE:operator", "https://idp.example", false},
		{"spiffe://v0m3/service/operator", "https://idp.example", false},
		{"Spiffe://v0m3/service/operator", identity.IssuerKubernetes, false},
		{"system:serviceaccount:writer:writer", "https://idp.example", false},
		{"System:node:n1", "v0m3-dev", false},
	} {
		t.Run(tc.subject+" from "+tc.issuer, func(t *testing.T) {
			t.Parallel()
			err := identity.CheckSubject(tc.subject, tc.issuer)
			var ae *identity.AuthError
			switch {
			case tc.ok && err != nil:
				t.Fatalf("refused: %v", err)
			case !tc.ok && (!errors.As(err, &ae) || ae.Reason != identity.ReasonPrincipalReserved):
				t.Fatalf("err = %v, want an AuthError %s", err, identity.ReasonPrincipalReserved)
			}
		})
	}
	for id, ok := range map[string]bool{"alice": true, "service:operator": false, "spiffe://v0m3/service/x": false, "system:serviceaccount:a:b": false} {
		if err := identity.CheckPerson(id); (err == nil) != ok {
			t.Errorf("CheckPerson(%q) = %v", id, err)
		}
	}
	if c := (identity.Caller{ID: "operator", Kind: identity.KindService}); c.Principal() != "spiffe://v0m3/service/operator" {
		t.Errorf("a service's principal is %q", c.Principal())
	}
	if c := (identity.Caller{ID: "operator", Kind: identity.KindUser}); c.Principal() != "operator" {
		t.Errorf("a person's principal is %q", c.Principal())
	}
}

// TestJWTIssuerIsNotKubernetes: an OIDC issuer named like TokenReview's
// would let its tokens claim Kubernetes workloads' names.
func TestJWTIssuerIsNotKubernetes(t *testing.T) {
	t.Parallel()
	if _, err := identity.NewJWT(context.Background(), identity.JWTConfig{Issuer: identity.IssuerKubernetes, Audience: "v0m3", JWKSFile: "/nonexistent"}); err == nil {
		t.Fatal("an OIDC issuer named kubernetes was accepted")
	}
}
