package tasks

import (
	"context"
	"fmt"
	"path"
	"slices"
	"strings"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/digest"
	"github.com/v0m3/v0m3/internal/handlekind"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// CompileCatalogue asks policy which capabilities the task may be offered
// and compiles those into what the model will see: the local capability
// description and product schema (never the remote description), with the
// task's opaque handles listed in each handle field (see OfferHandles).
// The catalogue never contains a URI.
func (s *Service) CompileCatalogue(ctx context.Context, task *orchestratorv1.Task) (*orchestratorv1.OfferedCatalogue, error) {
	el, err := s.policy.Eligible(ctx, &policyv1.EligibleRequest{
		TaskId:             task.GetId(),
		Requester:          task.GetRequester(),
		Purpose:            Purpose(task),
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
		if !Offerable(ce) {
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
		capb, err := s.registry.GetCapability(ctx, &registryv1.GetCapabilityRequest{Name: ce.GetCapability()})
		if err != nil {
			return nil, fmt.Errorf("get capability %s: %w", ce.GetCapability(), err)
		}
		oc := &orchestratorv1.OfferedCapability{
			Name:            capb.GetName(),
			Description:     capb.GetDescription(),
			MappingId:       ce.GetMappingId(),
			MappingRevision: ce.GetMappingRevision(),
		}
		if err := s.OfferHandles(ctx, task, capb, oc); err != nil {
			return nil, err
		}
		ce.Stage = policyv1.EligibilityStage_ELIGIBILITY_STAGE_OFFERED
		cat.Offered = append(cat.Offered, oc)
	}
	return cat, nil
}

// RegisterWithPolicy records the task's requester, its source, artifact and
// destination scopes and its budget (its profile's default budget) with
// policy.
func (s *Service) RegisterWithPolicy(ctx context.Context, task *orchestratorv1.Task, budget *registryv1.TaskBudget) error {
	if _, err := s.policy.RegisterTask(ctx, &policyv1.RegisterTaskRequest{
		TaskId: task.GetId(), Requester: task.GetRequester().GetId(), Budget: budget,
		SourceScope:      uris(task.GetSourceScope()),
		ArtifactScope:    uris(task.GetArtifactScope()),
		DestinationScope: uris(task.GetDestinationScope()),
	}); err != nil {
		return fmt.Errorf("register task scope with policy: %w", err)
	}
	return nil
}

// uris lists the URIs of scope entries.
func uris(refs []*orchestratorv1.SourceRef) []string {
	out := make([]string, 0, len(refs))
	for _, r := range refs {
		out = append(out, r.GetUri())
	}
	return out
}

// scopeOf returns the task's targets of one handle kind.
func scopeOf(task *orchestratorv1.Task, kind registryv1.HandleKind) []*orchestratorv1.SourceRef {
	switch handlekind.Of(kind) {
	case registryv1.HandleKind_HANDLE_KIND_ARTIFACT:
		return task.GetArtifactScope()
	case registryv1.HandleKind_HANDLE_KIND_DESTINATION:
		return task.GetDestinationScope()
	case registryv1.HandleKind_HANDLE_KIND_SOURCE:
		return task.GetSourceScope()
	}
	return nil
}

// OfferHandles fills an offered capability's handle fields, handles and
// model-facing schema. Fields of one kind share handles: a handle is bound
// to its kind and capability, not to one field. A handle is minted for a
// target of the task's scope of that kind only when current policy allows
// the capability on it, so a target policy stopped allowing gets no new
// handle. Each handle field of the schema lists the handles as a "oneOf"
// of consts titled with their labels: a tool call can only pick one, and
// the schema holds no URI.
func (s *Service) OfferHandles(ctx context.Context, task *orchestratorv1.Task, capb *registryv1.Capability, oc *orchestratorv1.OfferedCapability) error {
	oc.HandleFields, oc.Handles = nil, nil
	var kinds []registryv1.HandleKind
	for _, hf := range capb.GetHandles() {
		k := handlekind.Of(hf.GetKind())
		oc.HandleFields = append(oc.HandleFields, &orchestratorv1.HandleFieldOffer{Field: hf.GetField(), Kind: k, RefersTo: hf.GetRefersTo()})
		if !slices.Contains(kinds, k) {
			kinds = append(kinds, k)
		}
	}
	for _, k := range kinds {
		for _, ref := range scopeOf(task, k) {
			az, err := s.policy.Authorize(ctx, &policyv1.AuthorizeRequest{
				Principal: task.GetRequester(), Capability: capb.GetName(), Resource: ref.GetUri(),
				TaskId: task.GetId(), Purpose: Purpose(task), EffectClass: capb.GetEffectClass(),
				MappingId: oc.GetMappingId(), MappingRevision: oc.GetMappingRevision(),
			})
			if err != nil {
				return fmt.Errorf("authorize a %s handle for %s: %w", handlekind.Name(k), capb.GetName(), err)
			}
			if az.GetDecision() != policyv1.Decision_DECISION_ALLOW {
				s.log.InfoContext(ctx, "no handle: policy does not allow the target", "task", task.GetId(), "capability", capb.GetName(),
					"kind", handlekind.Name(k), "policy_revision", az.GetPolicyRevision())
				continue
			}
			h, err := s.policy.MintHandle(ctx, &policyv1.MintHandleRequest{
				TaskId:          task.GetId(),
				Requester:       task.GetRequester().GetId(),
				Capability:      capb.GetName(),
				Target:          ref.GetUri(),
				Label:           sourceLabel(ref),
				MappingId:       oc.GetMappingId(),
				MappingRevision: oc.GetMappingRevision(),
				Kind:            k,
			})
			if err != nil {
				return fmt.Errorf("mint a %s handle for %s: %w", handlekind.Name(k), capb.GetName(), err)
			}
			oc.Handles = append(oc.Handles, &orchestratorv1.HandleOffer{
				Handle: h.GetToken(), Label: h.GetLabel(), ExpireTime: h.GetExpireTime(), Kind: k,
			})
		}
	}
	var err error
	if oc.InputSchemaDigest, err = digest.Struct(capb.GetInputSchema()); err != nil {
		return fmt.Errorf("digest the input schema of %s: %w", capb.GetName(), err)
	}
	if oc.InputSchema, err = toolSchema(capb.GetInputSchema(), oc); err != nil {
		return fmt.Errorf("list handles in the input schema of %s: %w", capb.GetName(), err)
	}
	return nil
}

// toolSchema is a capability's declared input schema with each handle
// field listing the offered handles of its kind as "oneOf" of
// {"const": handle, "title": label}. A handle field with no handle (the
// task's scope of its kind is empty, or policy allows none of it) keeps
// its declared schema: there is nothing to pick, and any value is refused
// as an unknown handle.
func toolSchema(declared *structpb.Struct, oc *orchestratorv1.OfferedCapability) (*structpb.Struct, error) {
	if declared == nil {
		return nil, nil
	}
	schema := proto.CloneOf(declared)
	props := schema.GetFields()["properties"].GetStructValue()
	for _, hf := range oc.GetHandleFields() {
		prop := props.GetFields()[hf.GetField()].GetStructValue()
		if prop == nil {
			return nil, fmt.Errorf("handle field %q is not a property of the schema", hf.GetField())
		}
		var choices []*structpb.Value
		for _, h := range oc.GetHandles() {
			if h.GetKind() != hf.GetKind() {
				continue
			}
			choices = append(choices, structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
				"const": structpb.NewStringValue(h.GetHandle()),
				"title": structpb.NewStringValue(h.GetLabel()),
			}}))
		}
		if len(choices) > 0 {
			prop.Fields["oneOf"] = structpb.NewListValue(&structpb.ListValue{Values: choices})
		}
	}
	return schema, nil
}

// Offerable reports whether policy let a capability through: eligible (the
// orchestrator is what compiles it into context) or already marked offered.
func Offerable(ce *policyv1.CapabilityEligibility) bool {
	if ce.GetReason() != policyv1.NotOfferedReason_NOT_OFFERED_REASON_UNSPECIFIED {
		return false
	}
	switch ce.GetStage() {
	case policyv1.EligibilityStage_ELIGIBILITY_STAGE_ELIGIBLE, policyv1.EligibilityStage_ELIGIBILITY_STAGE_OFFERED:
		return true
	}
	return false
}

// sourceLabel is what the model may see for a scope entry (a source, an
// artifact or a destination): its title, else the last segment of its
// URI. Never the URI itself.
func sourceLabel(src *orchestratorv1.SourceRef) string {
	if src.GetTitle() != "" {
		return src.GetTitle()
	}
	return LastSegment(src.GetUri())
}

// LastSegment returns the last path segment of a URI, without scheme,
// query or fragment, e.g. "api-migration.md" for
// "note://library/api-migration.md?rev=2".
func LastSegment(uri string) string {
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

// CatalogueDetail describes a catalogue for people: what was offered and
// why everything else was not.
func CatalogueDetail(cat *orchestratorv1.OfferedCatalogue) string {
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

// Purpose is the purpose policy evaluates for a task: the one fixed when
// it started from its profile. A task started before profiles existed has
// none recorded; its purpose is its kind's profile name, as it always was.
func Purpose(task *orchestratorv1.Task) string {
	if p := task.GetPolicyPurpose(); p != "" {
		return p
	}
	if task.GetProfile() != "" {
		return task.GetProfile()
	}
	return KindProfile(task.GetKind())
}

// listOrNone joins xs, or says "nothing".
func listOrNone(xs []string) string {
	if len(xs) == 0 {
		return "nothing"
	}
	return strings.Join(xs, ", ")
}

// Offer gives task, just recorded, its catalogue: it registers the task
// with policy (with budget), compiles the catalogue, stores it and tells
// the task's trace and events. A task that cannot be given one is
// stopped (see StopStart) and the error says why.
func (s *Service) Offer(ctx context.Context, task *orchestratorv1.Task, budget *registryv1.TaskBudget) (*orchestratorv1.OfferedCatalogue, error) {
	// Policy learns the task's requester and scopes before it is asked
	// for any handle: it mints handles only within them.
	var cat *orchestratorv1.OfferedCatalogue
	err := s.RegisterWithPolicy(ctx, task, budget)
	if err == nil {
		cat, err = s.CompileCatalogue(ctx, task)
	}
	if err != nil {
		s.StopStart(ctx, task, "catalogue could not be compiled: "+status.Convert(err).Message())
		return nil, apierror.Propagate(err, "compile catalogue")
	}
	if err := s.st.PutCatalogue(ctx, cat); err != nil {
		s.StopStart(ctx, task, "catalogue could not be stored")
		return nil, s.internal(ctx, "store the catalogue of task "+task.GetId()+" (the task was recorded and is stopped; a retry with the same request_id answers TASK_START_FAILED)", err)
	}
	s.report.Trace(ctx, task.GetId(), &evidencev1.ProductEvent{
		Kind:   evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_CATALOGUE_OFFERED,
		Detail: CatalogueDetail(cat),
	})
	s.report.Emit(ctx, task.GetId(), "", "catalogue.offered", CatalogueDetail(cat))
	return cat, nil
}
