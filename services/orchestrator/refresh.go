package orchestrator

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/digest"
	"github.com/v0m3/v0m3/internal/store"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/orchestrator/tasks"
)

// RefreshHandles mints new handles for an active task's offered
// capabilities under current policy and records the updated catalogue.
// What was offered stays what was offered (the mapping revisions and
// schemas the task was started with): a refresh renews handles, it does
// not recompile. A capability policy no longer finds eligible gets no new
// handle, nor does a target policy no longer allows. Handles minted
// earlier are not revoked: they keep their expiry.
//
// Handles are minted for the task's requester, so only the requester (or
// the actor who started the task for them) may refresh; anyone else needs
// policy to grant task.write on the task, which no default policy does.
func (s *Server) RefreshHandles(ctx context.Context, req *orchestratorv1.RefreshHandlesRequest) (*orchestratorv1.OfferedCatalogue, error) {
	if req.GetTaskId() == "" {
		return nil, missing("task_id")
	}
	task, err := s.openTask(ctx, req.GetTaskId(), taskWrite)
	if err != nil {
		return nil, err
	}
	if task.GetState() != orchestratorv1.TaskState_TASK_STATE_ACTIVE {
		return nil, apierror.New(codes.FailedPrecondition, "TASK_NOT_ACTIVE",
			fmt.Sprintf("task %s is %s; its handles are not refreshed", task.GetId(), tasks.Name(task.GetState())),
			map[string]string{"task_id": task.GetId()})
	}
	old, err := s.st.GetCatalogue(ctx, task.GetId())
	if errors.Is(err, store.ErrNotFound) {
		return nil, apierror.New(codes.NotFound, "CATALOGUE_UNKNOWN", "task "+task.GetId()+" has no offered catalogue", nil)
	}
	if err != nil {
		return nil, s.internal(ctx, "get catalogue", err)
	}
	el, err := s.deps.Policy.Eligible(ctx, &policyv1.EligibleRequest{
		TaskId: task.GetId(), Requester: task.GetRequester(), Purpose: purposeOf(task), NeededCapabilities: task.GetNeededCapabilities(),
	})
	if err != nil {
		return nil, apierror.Propagate(err, "policy eligibility")
	}
	stillEligible := map[string]bool{}
	for _, ce := range el.GetCapabilities() {
		if tasks.Offerable(ce) && ce.GetMappingId() != "" {
			stillEligible[eligibleKey(ce.GetCapability(), ce.GetMappingId(), ce.GetMappingRevision())] = true
		}
	}

	cat := proto.CloneOf(old)
	cat.PolicyRevision, cat.RefreshTime = el.GetPolicyRevision(), s.timestamp()
	for _, oc := range cat.GetOffered() {
		if len(oc.GetHandleFields()) == 0 && len(oc.GetHandles()) == 0 {
			continue
		}
		capb, err := s.offeredContract(ctx, oc)
		if err != nil {
			return nil, err
		}
		scoped := task
		if !stillEligible[eligibleKey(oc.GetName(), oc.GetMappingId(), oc.GetMappingRevision())] {
			// Policy no longer offers it through this mapping revision:
			// the declared fields and schema stay, with no handle to pick.
			scoped = &orchestratorv1.Task{Id: task.GetId(), Requester: task.GetRequester()}
		}
		if err := s.tasks.OfferHandles(ctx, scoped, capb, oc); err != nil {
			return nil, apierror.Propagate(err, "refresh handles")
		}
	}
	if err := s.st.PutCatalogue(ctx, cat); err != nil {
		return nil, s.internal(ctx, "persist catalogue", err)
	}
	detail := "handles refreshed: " + tasks.CatalogueDetail(cat)
	s.log.InfoContext(ctx, "handles refreshed", "task", task.GetId(), "policy_revision", cat.GetPolicyRevision())
	s.trace(ctx, task.GetId(), &evidencev1.ProductEvent{Kind: evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_CATALOGUE_OFFERED, Detail: detail})
	s.emit(ctx, task.GetId(), "", "catalogue.refreshed", detail)
	return cat, nil
}

// offeredContract returns the capability contract an offered capability
// was compiled from: the current revision when its declared schema is
// still the one offered. A changed contract is refused as at submit: its
// handles would fill a schema the model was not shown.
func (s *Server) offeredContract(ctx context.Context, oc *orchestratorv1.OfferedCapability) (*registryv1.Capability, error) {
	capb, err := s.deps.Registry.GetCapability(ctx, &registryv1.GetCapabilityRequest{Name: oc.GetName()})
	if err != nil {
		return nil, apierror.Propagate(err, "get capability")
	}
	shown := oc.GetInputSchemaDigest()
	if shown == "" {
		// Compiled before handles were listed: the schema is the declared one.
		shown, _ = digest.Struct(oc.GetInputSchema())
	}
	if current, _ := digest.Struct(capb.GetInputSchema()); current != shown {
		return nil, apierror.New(codes.FailedPrecondition, "CAPABILITY_CHANGED",
			fmt.Sprintf("capability %s changed since it was offered; start a new task to use the current contract", oc.GetName()),
			map[string]string{"capability": oc.GetName()})
	}
	return capb, nil
}

// eligibleKey identifies a capability offered through one mapping revision.
func eligibleKey(capability, mappingID string, revision int64) string {
	return fmt.Sprintf("%s\x00%s\x00%d", capability, mappingID, revision)
}
