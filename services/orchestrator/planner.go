package orchestrator

import (
	"context"
	"fmt"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/paging"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/orchestrator/tasks"
)

// profileOf reads the task profile a StartTask request names, at its
// current revision. The deprecated kind names the profile of the same name
// in lower snake case; a request naming both must name the same profile.
// A profile that is unknown or deprecated starts no task.
func (s *Server) profileOf(ctx context.Context, req *orchestratorv1.StartTaskRequest) (*registryv1.TaskProfile, error) {
	name := req.GetProfile()
	if kind := req.GetKind(); kind != orchestratorv1.TaskKind_TASK_KIND_UNSPECIFIED {
		if _, known := orchestratorv1.TaskKind_name[int32(kind)]; !known {
			return nil, apierror.InvalidArgument("UNKNOWN_TASK_KIND", fmt.Sprintf("kind %d is not a known task kind; set profile instead", kind),
				apierror.FieldViolation{Field: "kind", Description: "unknown task kind; kind is deprecated, set profile"})
		}
		byKind := tasks.KindProfile(kind)
		switch {
		case name == "":
			name = byKind
		case name != byKind:
			return nil, apierror.InvalidArgument("PROFILE_KIND_MISMATCH",
				fmt.Sprintf("kind %s names profile %q but profile is %q; set only profile (kind is deprecated)", kind, byKind, name),
				apierror.FieldViolation{Field: "kind", Description: fmt.Sprintf("names profile %q, not %q; leave kind unset", byKind, name)})
		}
	}
	if name == "" {
		return nil, apierror.InvalidArgument(apierror.ReasonFieldRequired, "profile is required",
			apierror.FieldViolation{Field: "profile", Description: `set a task profile, e.g. "source_review"`})
	}
	p, err := s.deps.Registry.GetTaskProfile(ctx, &registryv1.GetTaskProfileRequest{Name: name})
	if status.Code(err) == codes.NotFound {
		return nil, s.unknownProfile(ctx, name)
	}
	if err != nil {
		return nil, apierror.Propagate(err, "get task profile")
	}
	if p.GetState() == registryv1.DefinitionState_DEFINITION_STATE_DEPRECATED {
		why := p.GetDeprecationReason()
		if why == "" {
			why = "no reason given"
		}
		return nil, apierror.New(codes.FailedPrecondition, "PROFILE_DEPRECATED",
			fmt.Sprintf("task profile %q is deprecated (%s); it starts no new task", name, why),
			map[string]string{"profile": name, "profile_revision": fmt.Sprint(p.GetRevision())})
	}
	return p, nil
}

// unknownProfile is the refusal of a profile the registry does not know,
// naming the profiles it does know so the caller can pick one.
func (s *Server) unknownProfile(ctx context.Context, name string) error {
	known := "unavailable"
	if list, err := s.deps.Registry.ListTaskProfiles(ctx, &registryv1.ListTaskProfilesRequest{PageSize: paging.MaxSize}); err != nil {
		s.log.WarnContext(ctx, "list task profiles for an unknown profile", "err", err)
	} else {
		var names []string
		for _, p := range list.GetProfiles() {
			names = append(names, p.GetName())
		}
		slices.Sort(names)
		known = listOrNone(names)
	}
	return apierror.New(codes.NotFound, "PROFILE_UNKNOWN",
		fmt.Sprintf("task profile %q does not exist; known profiles: %s", name, known),
		map[string]string{"profile": name})
}

// plan derives the capabilities a task needs from its profile and nothing
// else: a capability the profile does not name is never offered, whatever
// policy or discovery says. Each need applies under its condition; a
// condition this orchestrator does not know never makes a capability
// needed (a plan only ever errs towards offering less).
func plan(profile *registryv1.TaskProfile, evidencePresent bool) []string {
	needed := []string{}
	for _, n := range profile.GetNeeds() {
		var applies bool
		switch n.GetWhen() {
		case registryv1.NeedCondition_NEED_CONDITION_UNSPECIFIED, registryv1.NeedCondition_NEED_CONDITION_ALWAYS:
			applies = true
		case registryv1.NeedCondition_NEED_CONDITION_EVIDENCE_ABSENT:
			applies = !evidencePresent
		case registryv1.NeedCondition_NEED_CONDITION_EVIDENCE_PRESENT:
			applies = evidencePresent
		}
		if applies && n.GetCapability() != "" && !slices.Contains(needed, n.GetCapability()) {
			needed = append(needed, n.GetCapability())
		}
	}
	return needed
}

// profilePurpose is the purpose policy evaluates for tasks of a profile:
// the purpose it declares, else its name.
func profilePurpose(p *registryv1.TaskProfile) string {
	if p.GetPurpose() != "" {
		return p.GetPurpose()
	}
	return p.GetName()
}

// purposeOf is the purpose policy evaluates for a task (see tasks.Purpose).
func purposeOf(task *orchestratorv1.Task) string { return tasks.Purpose(task) }
