package policy

import (
	"context"
	"testing"

	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
)

// TestDefaultDelegatedGroupsAndScopes: the built-in policy lets product
// services assert only authors for their users, and lets authors,
// publishers and product services scope tasks, nobody else.
func TestDefaultDelegatedGroupsAndScopes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	p := func(id string, groups ...string) *policyv1.Principal {
		return &policyv1.Principal{Id: id, Groups: groups}
	}
	user := map[string]string{"user": "alice"}
	scope := map[string]string{"requester": "alice", "actor": "", "purpose": "source_review", "profile": "source_review"}
	const faq = "v0m3-sources://notes/migration-faq"
	tests := []struct {
		name    string
		req     *policyv1.AuthorizeActionRequest
		allowed bool
	}{
		{"a product service asserts authors", &policyv1.AuthorizeActionRequest{Principal: p("writer", "product-services"), Action: "group.assert", ResourceType: "group", ResourceId: "authors", Attributes: user}, true},
		{"not approvers", &policyv1.AuthorizeActionRequest{Principal: p("writer", "product-services"), Action: "group.assert", ResourceType: "group", ResourceId: "approvers", Attributes: user}, false},
		{"not platform", &policyv1.AuthorizeActionRequest{Principal: p("writer", "product-services"), Action: "group.assert", ResourceType: "group", ResourceId: "platform", Attributes: user}, false},
		{"a person asserts nothing", &policyv1.AuthorizeActionRequest{Principal: p("mallory", "authors"), Action: "group.assert", ResourceType: "group", ResourceId: "authors", Attributes: user}, false},
		{"an author reads a source", &policyv1.AuthorizeActionRequest{Principal: p("alice", "authors"), Action: "source.read", ResourceType: "source", ResourceId: faq, Attributes: scope}, true},
		{"a publisher reaches a destination", &policyv1.AuthorizeActionRequest{Principal: p("pia", "publishers"), Action: "destination.reach", ResourceType: "destination", ResourceId: "https://docs.example/", Attributes: scope}, true},
		{"a product service uses an artifact", &policyv1.AuthorizeActionRequest{Principal: p("writer", "product-services"), Action: "artifact.use", ResourceType: "artifact", ResourceId: "sha256:ab", Attributes: scope}, true},
		{"someone in no group does not", &policyv1.AuthorizeActionRequest{Principal: p("mallory"), Action: "source.read", ResourceType: "source", ResourceId: faq, Attributes: scope}, false},
		{"an auditor does not", &policyv1.AuthorizeActionRequest{Principal: p("ada", "auditors"), Action: "source.read", ResourceType: "source", ResourceId: faq, Attributes: scope}, false},
		{"platform does not", &policyv1.AuthorizeActionRequest{Principal: p("ines", "platform"), Action: "destination.reach", ResourceType: "destination", ResourceId: "https://docs.example/", Attributes: scope}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			resp, err := e.client.AuthorizeAction(context.Background(), tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if got := resp.GetDecision() == policyv1.Decision_DECISION_ALLOW; got != tc.allowed {
				t.Fatalf("decision %v (policies %v), want allowed=%v", resp.GetDecision(), resp.GetReasons(), tc.allowed)
			}
			if !tc.allowed && resp.GetRefusalReason() != "ROLE_NOT_GRANTED" {
				t.Fatalf("refusal %q, want ROLE_NOT_GRANTED", resp.GetRefusalReason())
			}
		})
	}
}
