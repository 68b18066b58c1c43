package policy

import (
	"context"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/digest"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

func TestAuthorizeDefaultPolicy(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	wantRevision := digest.Bytes(defaultPolicy)

	const (
		retrieval = "retrieval-for-review-and-rewrite"
		preview   = "authors-render-preview"
		deliver   = "publishers-deliver-approved-artifact"
	)
	tests := []struct {
		name       string
		principal  *policyv1.Principal
		capability string
		purpose    string
		wantAllow  bool
		wantReason []string
		wantApprov bool
	}{
		{"anyone may retrieve for source review", alice(), capRetrieve, "source_review", true, []string{retrieval}, false},
		{"anyone may retrieve for a rewrite", alice(), capRetrieve, "rewrite", true, []string{retrieval}, false},
		{"retrieval for another purpose is denied", alice(), capRetrieve, "publish", false, nil, false},
		{"retrieval with no purpose is denied", alice(), capRetrieve, "", false, nil, false},
		{"publishers retrieve for review too", carol(), capRetrieve, "source_review", true, []string{retrieval}, false},
		{"non-author may not render", alice(), capPreview, "rewrite", false, nil, false},
		{"author renders, after approval", bob(), capPreview, "rewrite", true, []string{preview}, true},
		{"publisher may not render", carol(), capPreview, "rewrite", false, nil, false},
		{"author may not deliver; external effects always need approval", bob(), capDeliver, "publish", false, nil, true},
		{"publisher delivers, after approval", carol(), capDeliver, "publish", true, []string{deliver}, true},
		{"both groups", &policyv1.Principal{Id: "dana", Groups: []string{"authors", "publishers"}}, capDeliver, "publish", true, []string{deliver}, true},
		{"group names are exact", &policyv1.Principal{Id: "eve", Groups: []string{"Publishers"}}, capDeliver, "publish", false, nil, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			resp, err := e.client.Authorize(context.Background(), &policyv1.AuthorizeRequest{
				Principal: tc.principal, Capability: tc.capability, Resource: connOK,
				TaskId: "task_1", Purpose: tc.purpose, MappingRevision: 1,
			})
			if err != nil {
				t.Fatalf("Authorize: %v", err)
			}
			wantDecision := policyv1.Decision_DECISION_DENY
			if tc.wantAllow {
				wantDecision = policyv1.Decision_DECISION_ALLOW
			}
			if resp.GetDecision() != wantDecision {
				t.Errorf("decision = %v, want %v", resp.GetDecision(), wantDecision)
			}
			if !slices.Equal(resp.GetReasons(), tc.wantReason) {
				t.Errorf("reasons = %v, want %v", resp.GetReasons(), tc.wantReason)
			}
			if resp.GetApprovalRequired() != tc.wantApprov {
				t.Errorf("approval_required = %v, want %v", resp.GetApprovalRequired(), tc.wantApprov)
			}
			if resp.GetPolicyRevision() != wantRevision {
				t.Errorf("policy_revision = %q, want %q", resp.GetPolicyRevision(), wantRevision)
			}
		})
	}
}

func TestAuthorizeTakesEffectClassFromRegistry(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	ctx := context.Background()

	// A caller claiming that delivery is a mere retrieval does not get the
	// retrieval permit.
	_, err := e.client.Authorize(ctx, &policyv1.AuthorizeRequest{
		Principal: alice(), Capability: capDeliver, Resource: connOK, Purpose: "source_review",
		EffectClass: registryv1.EffectClass_EFFECT_CLASS_RETRIEVAL,
	})
	if !apierror.Is(err, codes.FailedPrecondition, "EFFECT_CLASS_MISMATCH") {
		t.Fatalf("claimed milder effect class: err = %v, want FAILED_PRECONDITION EFFECT_CLASS_MISMATCH", err)
	}

	// Naming the right class is fine.
	resp, err := e.client.Authorize(ctx, &policyv1.AuthorizeRequest{
		Principal: alice(), Capability: capRetrieve, Resource: connOK, Purpose: "source_review",
		EffectClass: registryv1.EffectClass_EFFECT_CLASS_RETRIEVAL,
	})
	if err != nil || resp.GetDecision() != policyv1.Decision_DECISION_ALLOW {
		t.Fatalf("matching effect class: resp = %v, err = %v", resp, err)
	}

	// Unknown capabilities are the registry's NOT_FOUND.
	_, err = e.client.Authorize(ctx, &policyv1.AuthorizeRequest{
		Principal: alice(), Capability: "no_such_capability", Resource: connOK, Purpose: "source_review",
	})
	if apierror.Code(err) != codes.NotFound {
		t.Fatalf("unknown capability: err = %v, want NOT_FOUND", err)
	}
}

func TestAuthorizeValidates(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	_, err := e.client.Authorize(context.Background(), &policyv1.AuthorizeRequest{})
	if apierror.Code(err) != codes.InvalidArgument {
		t.Fatalf("err = %v, want INVALID_ARGUMENT", err)
	}
	if got, want := apierror.Fields(err), []string{"capability", "principal.id", "resource"}; !slices.Equal(got, want) {
		t.Errorf("fields = %v, want %v", got, want)
	}
}

func TestAuthorizeLogsDecisionWithoutTarget(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	const target = "notes://library/secret-plan"
	resp, err := e.client.Authorize(context.Background(), &policyv1.AuthorizeRequest{
		Principal: alice(), Capability: capRetrieve, Resource: target, MappingId: mapRetrieve,
		MappingRevision: 2, TaskId: "task_1", Purpose: "source_review",
	})
	if err != nil || resp.GetDecision() != policyv1.Decision_DECISION_ALLOW {
		t.Fatalf("resp = %v, err = %v", resp, err)
	}
	logs := e.logs.String()
	if !strings.Contains(logs, `"msg":"policy decision"`) || !strings.Contains(logs, `"decision":"allow"`) ||
		!strings.Contains(logs, `"policy_revision":"`+resp.GetPolicyRevision()+`"`) ||
		!strings.Contains(logs, `"retrieval-for-review-and-rewrite"`) {
		t.Errorf("decision not logged with capability, decision, policy ids and revision:\n%s", logs)
	}
	if strings.Contains(logs, "secret-plan") {
		t.Errorf("logs contain the target:\n%s", logs)
	}
}
