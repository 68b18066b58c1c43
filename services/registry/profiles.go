package registry

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/authz"
	"github.com/v0m3/v0m3/internal/paging"
	"github.com/v0m3/v0m3/internal/store"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

const (
	reasonInvalidProfile = "INVALID_PROFILE"
	reasonProfileExists  = "PROFILE_EXISTS"
)

// profileOf returns a copy of p without its output-only fields.
func profileOf(p *registryv1.TaskProfile) *registryv1.TaskProfile {
	out := proto.CloneOf(p)
	out.Revision, out.State, out.CreateTime, out.CreatedBy, out.DeprecationReason = 0, registryv1.DefinitionState_DEFINITION_STATE_UNSPECIFIED, nil, "", ""
	return out
}

// sameProfile says whether two profiles declare the same thing; who
// manages them is informational.
func sameProfile(a, b *registryv1.TaskProfile) bool {
	x, y := profileOf(a), profileOf(b)
	x.ManagedBy, y.ManagedBy = "", ""
	return proto.Equal(x, y)
}

// validateProfile checks a declared profile's shape and returns the
// profile to store. Whether the capabilities it needs exist is checked by
// checkNeeds.
func validateProfile(in *registryv1.TaskProfile) (*registryv1.TaskProfile, error) {
	if in == nil {
		return nil, required("profile", "the task profile is required")
	}
	p := profileOf(in)
	v := &violations{}
	checkName(v, "profile.name", p.GetName(), "source_review")
	seen := map[string]bool{}
	for i, n := range p.GetNeeds() {
		at := fmt.Sprintf("profile.needs[%d]", i)
		switch c := n.GetCapability(); {
		case c == "":
			v.add(reasonInvalidProfile, at+".capability", "the capability needed is required")
		case seen[c]:
			v.add(reasonInvalidProfile, at+".capability", fmt.Sprintf("capability %s is needed twice; name it once with the condition that selects it", c))
		}
		seen[n.GetCapability()] = true
		if !knownEnum(registryv1.NeedCondition_name, n.GetWhen()) {
			v.add(reasonInvalidProfile, at+".when", fmt.Sprintf("unknown condition %d", n.GetWhen()))
		}
	}
	b := p.GetDefaultBudget()
	for _, d := range []struct {
		field string
		n     int64
	}{{"max_calls", b.GetMaxCalls()}, {"max_response_bytes", b.GetMaxResponseBytes()}, {"max_cost_micros", b.GetMaxCostMicros()}} {
		if d.n < 0 {
			v.add(reasonInvalidProfile, "profile.default_budget."+d.field, "must be >= 0 (0: policy's configured default)")
		}
	}
	if err := v.err("task profile"); err != nil {
		return nil, err
	}
	return p, nil
}

// checkNeeds refuses a profile that needs a capability that is not
// declared (NOT_FOUND) or is deprecated (FAILED_PRECONDITION).
func (s *Server) checkNeeds(ctx context.Context, p *registryv1.TaskProfile) error {
	for i, n := range p.GetNeeds() {
		c, err := s.st.GetCapability(ctx, n.GetCapability(), 0)
		if errors.Is(err, store.ErrNotFound) {
			return apierror.New(codes.NotFound, "CAPABILITY_UNKNOWN",
				fmt.Sprintf("task profile %s needs capability %q, which is not declared; declare it first", p.GetName(), n.GetCapability()),
				map[string]string{"capability": n.GetCapability(), "field": fmt.Sprintf("profile.needs[%d].capability", i)})
		}
		if err != nil {
			return s.storeError(ctx, err, "get capability", nil)
		}
		if c.GetState() == registryv1.DefinitionState_DEFINITION_STATE_DEPRECATED {
			return capabilityDeprecated(c)
		}
	}
	return nil
}

// CreateTaskProfile declares a new task profile at revision 1.
func (s *Server) CreateTaskProfile(ctx context.Context, req *registryv1.CreateTaskProfileRequest) (*registryv1.TaskProfile, error) {
	creator, err := s.authz.Require(ctx, authz.ProfileWrite, authz.Resource{Type: "task_profile", ID: req.GetProfile().GetName()}, nil)
	if err != nil {
		return nil, err
	}
	p, err := validateProfile(req.GetProfile())
	if err != nil {
		return nil, err
	}
	if err := s.checkNeeds(ctx, p); err != nil {
		return nil, err
	}
	return s.createProfile(ctx, p, actor(creator))
}

func (s *Server) createProfile(ctx context.Context, p *registryv1.TaskProfile, by string) (*registryv1.TaskProfile, error) {
	p = s.stampProfile(p, by)
	ev := s.definitionEvent(registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_PROFILE_REVISED, p.GetName(),
		fmt.Sprintf("task profile %s declared at revision 1 by %s", p.GetName(), by))
	if err := s.st.CreateTaskProfile(ctx, p, []*registryv1.RegistryEvent{ev}); err != nil {
		if errors.Is(err, store.ErrExists) {
			return nil, apierror.New(codes.AlreadyExists, reasonProfileExists,
				fmt.Sprintf("task profile %s already exists; declare a new revision with UpdateTaskProfile", p.GetName()),
				map[string]string{"profile": p.GetName()})
		}
		return nil, s.storeError(ctx, err, "create task profile", nil)
	}
	s.notify()
	s.log.InfoContext(ctx, "task profile declared", "profile", p.GetName(), "revision", 1, "created_by", by)
	return p, nil
}

// UpdateTaskProfile declares a new revision of a profile unless it is the
// current one. Tasks keep the revision they started with.
func (s *Server) UpdateTaskProfile(ctx context.Context, req *registryv1.UpdateTaskProfileRequest) (*registryv1.TaskProfile, error) {
	name := req.GetProfile().GetName()
	caller, err := s.authz.Require(ctx, authz.ProfileWrite, authz.Resource{Type: "task_profile", ID: name}, nil)
	if err != nil {
		return nil, err
	}
	if req.GetExpectedRevision() < 0 {
		return nil, apierror.InvalidArgument(apierror.ReasonFieldInvalid, "expected_revision must be >= 0 (0: whatever is current)",
			apierror.FieldViolation{Field: "expected_revision", Description: "must be >= 0"})
	}
	next, err := validateProfile(req.GetProfile())
	if err != nil {
		return nil, err
	}
	if err := s.checkNeeds(ctx, next); err != nil {
		return nil, err
	}
	by := actor(caller)
	var out *registryv1.TaskProfile
	err = s.st.UpdateTaskProfile(ctx, name, func(u *ProfileUpdate) error {
		cur := u.Current
		if r := req.GetExpectedRevision(); r != 0 && r != cur.GetRevision() {
			return revisionConflict("profile", name, r, cur.GetRevision())
		}
		active := cur.GetState() == registryv1.DefinitionState_DEFINITION_STATE_ACTIVE
		if active && sameProfile(cur, next) {
			out = cur
			if cur.GetManagedBy() != next.GetManagedBy() {
				out = proto.CloneOf(cur)
				out.ManagedBy = next.GetManagedBy()
				u.Write = out
				u.Events = []*registryv1.RegistryEvent{s.definitionEvent(registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_PROFILE_REVISED, name,
					fmt.Sprintf("task profile %s revision %d is now managed by %q (profile unchanged)", name, cur.GetRevision(), out.GetManagedBy()))}
			}
			return nil
		}
		n := proto.CloneOf(next)
		n.Revision, n.State, n.CreateTime, n.CreatedBy = cur.GetRevision()+1, registryv1.DefinitionState_DEFINITION_STATE_ACTIVE, s.timestamp(), by
		u.Write, out = n, n
		detail := fmt.Sprintf("task profile %s revised to revision %d by %s", name, n.GetRevision(), by)
		if !active {
			detail += "; no longer deprecated"
		}
		u.Events = []*registryv1.RegistryEvent{s.definitionEvent(registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_PROFILE_REVISED, name, detail)}
		return nil
	})
	if err != nil {
		return nil, s.storeError(ctx, err, "update task profile", func() error { return profileUnknown(name, 0) })
	}
	s.notify()
	s.log.InfoContext(ctx, "task profile updated", "profile", name, "revision", out.GetRevision(), "by", by)
	return out, nil
}

// DeprecateTaskProfile stops new tasks from starting with a profile.
// Deprecating a deprecated profile changes nothing.
func (s *Server) DeprecateTaskProfile(ctx context.Context, req *registryv1.DeprecateTaskProfileRequest) (*registryv1.TaskProfile, error) {
	name := req.GetName()
	caller, err := s.authz.Require(ctx, authz.ProfileWrite, authz.Resource{Type: "task_profile", ID: name}, nil)
	if err != nil {
		return nil, err
	}
	if err := deprecationViolations(req.GetName(), req.GetReason(), req.GetExpectedRevision()); err != nil {
		return nil, err
	}
	by := actor(caller)
	var out *registryv1.TaskProfile
	err = s.st.UpdateTaskProfile(ctx, name, func(u *ProfileUpdate) error {
		out = u.Current
		if r := req.GetExpectedRevision(); r != 0 && r != out.GetRevision() {
			return revisionConflict("profile", name, r, out.GetRevision())
		}
		if out.GetState() == registryv1.DefinitionState_DEFINITION_STATE_DEPRECATED {
			return nil
		}
		out = proto.CloneOf(u.Current)
		out.State, out.DeprecationReason = registryv1.DefinitionState_DEFINITION_STATE_DEPRECATED, req.GetReason()
		u.Write = out
		u.Events = []*registryv1.RegistryEvent{s.definitionEvent(registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_PROFILE_REVISED, name,
			fmt.Sprintf("task profile %s revision %d deprecated by %s: %s", name, out.GetRevision(), by, req.GetReason()))}
		return nil
	})
	if err != nil {
		return nil, s.storeError(ctx, err, "deprecate task profile", func() error { return profileUnknown(name, 0) })
	}
	s.notify()
	s.log.InfoContext(ctx, "task profile deprecated", "profile", name, "revision", out.GetRevision(), "by", by)
	return out, nil
}

// GetTaskProfile returns a profile at its current or a past revision.
func (s *Server) GetTaskProfile(ctx context.Context, req *registryv1.GetTaskProfileRequest) (*registryv1.TaskProfile, error) {
	if err := s.requireRead(ctx, authz.ProfileRead, "task_profile", req.GetName()); err != nil {
		return nil, err
	}
	if req.GetName() == "" {
		return nil, apierror.InvalidArgument(apierror.ReasonFieldRequired, "name is required",
			apierror.FieldViolation{Field: "name", Description: "the task profile name, e.g. source_review"})
	}
	if req.GetRevision() < 0 {
		return nil, apierror.InvalidArgument(apierror.ReasonFieldInvalid, "revision must be >= 0 (0 means current)",
			apierror.FieldViolation{Field: "revision", Description: "must be >= 0"})
	}
	p, err := s.st.GetTaskProfile(ctx, req.GetName(), req.GetRevision())
	if err != nil {
		return nil, s.storeError(ctx, err, "get task profile", func() error { return profileUnknown(req.GetName(), req.GetRevision()) })
	}
	return p, nil
}

// ListTaskProfiles returns profiles at their current revisions, sorted by
// name; deprecated ones only when asked for.
func (s *Server) ListTaskProfiles(ctx context.Context, req *registryv1.ListTaskProfilesRequest) (*registryv1.ListTaskProfilesResponse, error) {
	if err := s.requireRead(ctx, authz.ProfileRead, "task_profile", ""); err != nil {
		return nil, err
	}
	all, err := s.st.ListTaskProfiles(ctx)
	if err != nil {
		return nil, s.storeError(ctx, err, "list task profiles", nil)
	}
	out := slices.DeleteFunc(all, func(p *registryv1.TaskProfile) bool {
		return !req.GetShowDeprecated() && p.GetState() == registryv1.DefinitionState_DEFINITION_STATE_DEPRECATED
	})
	page, next, err := paging.Page(req, paging.Filter("show_deprecated", strconv.FormatBool(req.GetShowDeprecated())), out,
		func(p *registryv1.TaskProfile) string { return p.GetName() })
	if err != nil {
		return nil, err
	}
	return &registryv1.ListTaskProfilesResponse{Profiles: page, NextPageToken: next}, nil
}

func profileUnknown(name string, revision int64) error {
	if revision != 0 {
		return apierror.New(codes.NotFound, "PROFILE_REVISION_UNKNOWN",
			fmt.Sprintf("task profile %q has no revision %d", name, revision),
			map[string]string{"profile": name, "revision": strconv.FormatInt(revision, 10)})
	}
	return apierror.New(codes.NotFound, "PROFILE_UNKNOWN",
		fmt.Sprintf("task profile %q is not declared; declare it with CreateTaskProfile (v0m3 profile apply) or a TaskProfile resource", name),
		map[string]string{"profile": name})
}
