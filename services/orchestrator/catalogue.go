package orchestrator

import (
	"context"
	"fmt"
	"path"
	"slices"
	"strings"

	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// compileCatalogue asks policy which capabilities the task may be offered
// and compiles those into what the model will see: the local capability
// description and product schema (never the remote description), and one
// opaque handle per source in scope for capabilities that take handles. The
// catalogue never contains a source URI.
func (s *Server) compileCatalogue(ctx context.Context, task *orchestratorv1.Task) (*orchestratorv1.OfferedCatalogue, error) {
	el, err := s.deps.Policy.Eligible(ctx, &policyv1.EligibleRequest{
		TaskId:             task.GetId(),
		Requester:          task.GetRequester(),
		Purpose:            purposeOf(task),
		NeededCapabilities: task.GetNeededCapabilities(),
	})
	if err != nil {
		return nil, fmt.Errorf("policy eligibility: %w", err)
	}
	cat := &orchestratorv1.OfferedCatalogue{
		TaskId:         task.GetId(),
		Considered:     el.GetCapabilities(),
		PolicyRevision: el.GetPolicyRevision(),
		CompileTime:    s.timestamp(),
	}
	for _, ce := range cat.Considered {
		if !offerable(ce) {
			continue
		}
		if !slices.Contains(task.GetNeededCapabilities(), ce.GetCapability()) {
			// Policy should never offer what the plan does not need; if it
			// does, the plan wins and the record says why.
			s.log.WarnContext(ctx, "policy offered a capability the plan does not need", "task", task.GetId(), "capability", ce.GetCapability())
			ce.Stage = policyv1.EligibilityStage_ELIGIBILITY_STAGE_ELIGIBLE
			ce.Reason = policyv1.NotOfferedReason_NOT_OFFERED_REASON_NOT_NEEDED
			ce.Detail = "the task's plan does not need " + ce.GetCapability()
			continue
		}
		capb, err := s.deps.Registry.GetCapability(ctx, &registryv1.GetCapabilityRequest{Name: ce.GetCapability()})
		if err != nil {
			return nil, fmt.Errorf("get capability %s: %w", ce.GetCapability(), err)
		}
		oc := &orchestratorv1.OfferedCapability{
			Name:            capb.GetName(),
			Description:     capb.GetDescription(),
			InputSchema:     capb.GetInputSchema(),
			MappingId:       ce.GetMappingId(),
			MappingRevision: ce.GetMappingRevision(),
		}
		// A handle is bound to the capability, not to one field, so one
		// handle per source serves every handle field of the capability.
		if len(capb.GetHandles()) > 0 {
			for _, src := range task.GetSourceScope() {
				h, err := s.deps.Policy.MintHandle(ctx, &policyv1.MintHandleRequest{
					TaskId:          task.GetId(),
					Requester:       task.GetRequester().GetId(),
					Capability:      capb.GetName(),
					Target:          src.GetUri(),
					Label:           sourceLabel(src),
					MappingId:       ce.GetMappingId(),
					MappingRevision: ce.GetMappingRevision(),
				})
				if err != nil {
					return nil, fmt.Errorf("mint handle for %s: %w", capb.GetName(), err)
				}
				oc.Handles = append(oc.Handles, &orchestratorv1.HandleOffer{
					Handle: h.GetToken(), Label: h.GetLabel(), ExpireTime: h.GetExpireTime(),
				})
			}
		}
		ce.Stage = policyv1.EligibilityStage_ELIGIBILITY_STAGE_OFFERED
		cat.Offered = append(cat.Offered, oc)
	}
	return cat, nil
}

// registerTask records the task's requester, source scope and budget (its
// profile's default budget) with policy.
func (s *Server) registerTask(ctx context.Context, task *orchestratorv1.Task, budget *registryv1.TaskBudget) error {
	scope := make([]string, 0, len(task.GetSourceScope()))
	for _, src := range task.GetSourceScope() {
		scope = append(scope, src.GetUri())
	}
	if _, err := s.deps.Policy.RegisterTask(ctx, &policyv1.RegisterTaskRequest{
		TaskId: task.GetId(), Requester: task.GetRequester().GetId(), SourceScope: scope, Budget: budget,
	}); err != nil {
		return fmt.Errorf("register task scope with policy: %w", err)
	}
	return nil
}

// offerable reports whether policy let a capability through: eligible (the
// orchestrator is what compiles it into context) or already marked offered.
func offerable(ce *policyv1.CapabilityEligibility) bool {
	if ce.GetReason() != policyv1.NotOfferedReason_NOT_OFFERED_REASON_UNSPECIFIED {
		return false
	}
	switch ce.GetStage() {
	case policyv1.EligibilityStage_ELIGIBILITY_STAGE_ELIGIBLE, policyv1.EligibilityStage_ELIGIBILITY_STAGE_OFFERED:
		return true
	}
	return false
}

// sourceLabel is what the model may see for a source: its title, else the
// last segment of its URI. Never the URI itself.
func sourceLabel(src *orchestratorv1.SourceRef) string {
	if src.GetTitle() != "" {
		return src.GetTitle()
	}
	return lastSegment(src.GetUri())
}

// lastSegment returns the last path segment of a URI, without scheme,
// query or fragment, e.g. "api-migration.md" for
// "note://library/api-migration.md?rev=2".
func lastSegment(uri string) string {
	u := uri
	if i := strings.IndexAny(u, "?#"); i >= 0 {
		u = u[:i]
	}
	if i := strings.Index(u, "://"); i >= 0 {
		u = u[i+3:]
	}
	u = strings.TrimRight(u, "/")
	if u == "" {
		return "source"
	}
	return path.Base(u)
}

// catalogueDetail describes a catalogue for people: what was offered and
// why everything else was not.
func catalogueDetail(cat *orchestratorv1.OfferedCatalogue) string {
	var offered, notOffered []string
	for _, oc := range cat.GetOffered() {
		offered = append(offered, fmt.Sprintf("%s (mapping %s r%d, %d handles)", oc.GetName(), oc.GetMappingId(), oc.GetMappingRevision(), len(oc.GetHandles())))
	}
	for _, ce := range cat.GetConsidered() {
		if ce.GetStage() == policyv1.EligibilityStage_ELIGIBILITY_STAGE_OFFERED {
			continue
		}
		reason := strings.ToLower(strings.TrimPrefix(ce.GetReason().String(), "NOT_OFFERED_REASON_"))
		item := fmt.Sprintf("%s (%s", ce.GetCapability(), reason)
		if ce.GetDetail() != "" {
			item += ": " + ce.GetDetail()
		}
		notOffered = append(notOffered, item+")")
	}
	return fmt.Sprintf("offered: %s; not offered: %s; policy revision %s", listOrNone(offered), listOrNone(notOffered), cat.GetPolicyRevision())
}

// offeredCapability returns the named capability of a catalogue, or nil.
func offeredCapability(cat *orchestratorv1.OfferedCatalogue, name string) *orchestratorv1.OfferedCapability {
	for _, oc := range cat.GetOffered() {
		if oc.GetName() == name {
			return oc
		}
	}
	return nil
}

// offeredNames lists the names of a catalogue's offered capabilities.
func offeredNames(cat *orchestratorv1.OfferedCatalogue) []string {
	var out []string
	for _, oc := range cat.GetOffered() {
		out = append(out, oc.GetName())
	}
	return out
}
