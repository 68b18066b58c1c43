package policy

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// approvalPolicy permits everything; a permit annotated for approval also
// applies when the purpose is "ask", so the table can say whether Cedar
// asks for a person.
const approvalPolicy = `
@id("permit-all")
permit (principal, action, resource);

@id("ask-a-person")
@approval("required")
permit (principal, action, resource)
when { context has purpose && context.purpose == "ask" };
`

// TestApprovalRequirement: the capability's declared approval requirement
// decides whether a person must approve, through Authorize and through a
// handle's resolution alike: ALWAYS always; POLICY and nothing declared as
// the permitting Cedar policies say. An external effect (and an effect
// class nobody declared) needs a person whatever its contract or Cedar
// says.
func TestApprovalRequirement(t *testing.T) {
	t.Parallel()
	const (
		retrieval = registryv1.EffectClass_EFFECT_CLASS_RETRIEVAL
		local     = registryv1.EffectClass_EFFECT_CLASS_LOCAL_TRANSFORMATION
		external  = registryv1.EffectClass_EFFECT_CLASS_EXTERNAL_EFFECT
		noClass   = registryv1.EffectClass_EFFECT_CLASS_UNSPECIFIED
		unset     = registryv1.ApprovalRequirement_APPROVAL_REQUIREMENT_UNSPECIFIED
		byPolicy  = registryv1.ApprovalRequirement_APPROVAL_REQUIREMENT_POLICY
		always    = registryv1.ApprovalRequirement_APPROVAL_REQUIREMENT_ALWAYS
	)
	tests := []struct {
		effect    registryv1.EffectClass
		approval  registryv1.ApprovalRequirement
		cedarAsks bool
		want      bool
	}{
		{retrieval, unset, false, false},
		{retrieval, unset, true, true},
		{retrieval, byPolicy, false, false},
		{retrieval, byPolicy, true, true},
		{retrieval, always, false, true},
		{retrieval, always, true, true},
		{local, unset, false, false},
		{local, byPolicy, false, false},
		{local, byPolicy, true, true},
		{local, always, false, true},
		// Defense in depth: external effects always need a person.
		{external, unset, false, true},
		{external, byPolicy, false, true},
		{external, always, false, true},
		{external, registryv1.ApprovalRequirement(42), false, true},
		{noClass, byPolicy, false, true},
		// A requirement this service does not know is left to Cedar, which
		// is what it was before requirements were declared.
		{retrieval, registryv1.ApprovalRequirement(42), false, false},
	}
	path := filepath.Join(t.TempDir(), "policy.cedar")
	writePolicy(t, path, approvalPolicy)
	e := newEnv(t, options{policyFile: path})
	registerTask1(t, e)
	ctx := context.Background()
	for i, tc := range tests {
		name := fmt.Sprintf("%s/%s/cedar asks %t", effectClassName(tc.effect), approvalName(tc.approval), tc.cedarAsks)
		t.Run(name, func(t *testing.T) {
			capability, mappingID := fmt.Sprintf("cap_%d", i), fmt.Sprintf("map_%d", i)
			e.reg.mu.Lock()
			e.reg.caps[capability] = &registryv1.Capability{Name: capability, Revision: 1, EffectClass: tc.effect, Approval: tc.approval}
			e.reg.mappings[mappingID] = &registryv1.Mapping{Id: mappingID, Revision: 1, Capability: capability, ConnectionId: connOK,
				State: registryv1.MappingState_MAPPING_STATE_ACTIVE}
			e.reg.mu.Unlock()
			purpose := "plain"
			if tc.cedarAsks {
				purpose = "ask"
			}
			az, err := e.client.Authorize(ctx, &policyv1.AuthorizeRequest{
				Principal: alice(), Capability: capability, Resource: connOK, TaskId: "task_1", Purpose: purpose,
				MappingId: mappingID, MappingRevision: 1,
			})
			if err != nil || az.GetDecision() != policyv1.Decision_DECISION_ALLOW {
				t.Fatalf("Authorize = %v, %v; want allow", az, err)
			}
			if az.GetApprovalRequired() != tc.want {
				t.Errorf("Authorize: approval_required = %t, want %t", az.GetApprovalRequired(), tc.want)
			}
			h, err := e.client.MintHandle(ctx, &policyv1.MintHandleRequest{
				TaskId: "task_1", Requester: "alice", Capability: capability, Target: publicTarget, Label: "guide",
				MappingId: mappingID, MappingRevision: 1,
			})
			if err != nil {
				t.Fatalf("MintHandle: %v", err)
			}
			res, err := e.client.ResolveHandle(ctx, &policyv1.ResolveHandleRequest{
				Token: h.GetToken(), TaskId: "task_1", Requester: alice(), Capability: capability,
				MappingId: mappingID, MappingRevision: 1, Purpose: purpose,
			})
			if err != nil {
				t.Fatalf("ResolveHandle: %v", err)
			}
			if got := res.GetAuthorization().GetApprovalRequired(); got != tc.want {
				t.Errorf("ResolveHandle: approval_required = %t, want %t", got, tc.want)
			}
		})
	}
}
