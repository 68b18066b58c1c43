package policy

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// TestMappingReadOnce: a mapping's capability and connection never change
// (the registry makes a different binding a new mapping), so decisions
// read the mapping from the registry once: a second decision with it does
// not, a request naming another capability is still refused from what was
// read, a mapping the registry does not know is read every time, and a
// new revision is read once, when first used.
func TestMappingReadOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	ctx := context.Background()
	h := mint(t, e, publicTarget, nil)
	decide := &policyv1.DecideRequest{
		Requester: alice(), TaskId: "task_1", Capability: capRetrieve, ConnectionId: connOK,
		MappingId: mapRetrieve, MappingRevision: 2, Purpose: "source_review",
		EffectClass: registryv1.EffectClass_EFFECT_CLASS_RETRIEVAL,
		Handles:     []*policyv1.HandleUse{{Field: "source", Token: h.GetToken()}},
	}
	for i := range 2 {
		res, err := e.client.Decide(ctx, decide)
		if err != nil || len(res.GetDecisions()) != 1 || res.GetDecisions()[0].GetDecision() != policyv1.Decision_DECISION_ALLOW {
			t.Fatalf("Decide %d = %v, %v; want one allow", i+1, res, err)
		}
	}
	if n := e.reg.reads(); n != 1 {
		t.Errorf("GetMapping called %d times for two decisions, want 1", n)
	}
	authorize := func(capability, mapping string) (*policyv1.AuthorizeResponse, error) {
		return e.client.Authorize(ctx, &policyv1.AuthorizeRequest{
			Principal: alice(), Capability: capability, Resource: connOK, MappingId: mapping,
			MappingRevision: 2, TaskId: "task_1", Purpose: "source_review",
		})
	}
	if az, err := authorize(capRetrieve, mapRetrieve); err != nil || az.GetDecision() != policyv1.Decision_DECISION_ALLOW {
		t.Errorf("Authorize = %v, %v; want allow", az, err)
	}
	// Another capability through the same mapping, from the cache: by
	// Authorize, and by a handle minted for it.
	_, err := authorize(capPreview, mapRetrieve)
	if !apierror.Is(err, codes.FailedPrecondition, "MAPPING_CAPABILITY_MISMATCH") {
		t.Errorf("Authorize(another capability) = %v, want MAPPING_CAPABILITY_MISMATCH", err)
	}
	preview, err := e.client.MintHandle(ctx, &policyv1.MintHandleRequest{
		TaskId: "task_1", Requester: "alice", Capability: capPreview, Target: publicTarget,
		Label: "note: API migration guide", MappingId: mapRetrieve, MappingRevision: 2,
	})
	if err != nil {
		t.Fatalf("MintHandle: %v", err)
	}
	req := resolveReq(preview.GetToken())
	req.Capability = capPreview
	if _, err := e.client.ResolveHandle(ctx, req); !apierror.Is(err, codes.FailedPrecondition, "MAPPING_CAPABILITY_MISMATCH") {
		t.Errorf("ResolveHandle(another capability) = %v, want MAPPING_CAPABILITY_MISMATCH", err)
	}
	if n := e.reg.reads(); n != 1 {
		t.Errorf("GetMapping called %d times, want still 1", n)
	}

	// A mapping the registry does not know is not kept: each use reads it.
	for range 2 {
		if _, err := authorize(capRetrieve, "map_missing"); apierror.Code(err) != codes.NotFound {
			t.Errorf("Authorize(unknown mapping) = %v, want NOT_FOUND", err)
		}
	}
	if n := e.reg.reads(); n != 3 {
		t.Errorf("GetMapping called %d times, want 3 (each unknown mapping read)", n)
	}

	// A new revision reviewed: its first use reads it (the capability
	// revision it was reviewed against is its own), then it is known.
	e.reg.putMapping(mapRetrieve, capRetrieve, connOK, 3, registryv1.MappingState_MAPPING_STATE_ACTIVE)
	h3, err := e.client.MintHandle(ctx, &policyv1.MintHandleRequest{
		TaskId: "task_1", Requester: "alice", Capability: capRetrieve, Target: publicTarget,
		Label: "note: API migration guide", MappingId: mapRetrieve, MappingRevision: 3,
	})
	if err != nil {
		t.Fatalf("MintHandle: %v", err)
	}
	req = resolveReq(h3.GetToken())
	req.MappingRevision = 3
	for range 2 {
		if _, err := e.client.ResolveHandle(ctx, req); err != nil {
			t.Fatalf("ResolveHandle(revision 3): %v", err)
		}
	}
	if n := e.reg.reads(); n != 4 {
		t.Errorf("GetMapping called %d times, want 4 (revision 3 read once)", n)
	}
}
