package registry_test

import (
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/apierror"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

func notesReview() *registryv1.TaskProfile {
	return &registryv1.TaskProfile{
		Name:        "notes_review",
		Description: "Check a draft against the team's notes.",
		Purpose:     "source_review",
		Needs: []*registryv1.ProfileNeed{
			{Capability: "search_notes", When: registryv1.NeedCondition_NEED_CONDITION_EVIDENCE_ABSENT},
			{Capability: "retrieve_authorized_source", When: registryv1.NeedCondition_NEED_CONDITION_ALWAYS},
		},
		DefaultBudget: &registryv1.TaskBudget{MaxCalls: 10, MaxResponseBytes: 1 << 20},
	}
}

func TestTaskProfileLifecycle(t *testing.T) {
	t.Parallel()
	r := start(t)
	ctx := t.Context()
	_, err := r.client.CreateTaskProfile(ctx, &registryv1.CreateTaskProfileRequest{Profile: notesReview()})
	wantErr(t, err, codes.NotFound, "CAPABILITY_UNKNOWN")
	createCap(t, r.client, searchNotes(t))

	before := lastSequence(t, r)
	p, err := r.client.CreateTaskProfile(ctx, &registryv1.CreateTaskProfileRequest{Profile: notesReview()})
	if err != nil || p.GetRevision() != 1 || p.GetState() != registryv1.DefinitionState_DEFINITION_STATE_ACTIVE || p.GetCreatedBy() != "integrator" {
		t.Fatalf("create = %v, %v", p, err)
	}
	if evs := eventsAfter(t, r, before); len(evs) != 1 || evs[0].GetType() != registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_PROFILE_REVISED || evs[0].GetDefinition() != "notes_review" {
		t.Errorf("events = %v", evs)
	}
	_, err = r.client.CreateTaskProfile(ctx, &registryv1.CreateTaskProfileRequest{Profile: notesReview()})
	wantErr(t, err, codes.AlreadyExists, "PROFILE_EXISTS")

	// The same profile again, even as read back, changes nothing.
	before = lastSequence(t, r)
	for _, same := range []*registryv1.TaskProfile{notesReview(), p} {
		got, err := r.client.UpdateTaskProfile(ctx, &registryv1.UpdateTaskProfileRequest{Profile: same})
		if err != nil || !proto.Equal(got, p) {
			t.Errorf("identical update = %v, %v", got, err)
		}
	}
	if evs := eventsAfter(t, r, before); len(evs) != 0 {
		t.Errorf("identical updates wrote %d events", len(evs))
	}

	next := notesReview()
	next.Needs = next.Needs[:1]
	p2, err := r.client.UpdateTaskProfile(ctx, &registryv1.UpdateTaskProfileRequest{Profile: next, ExpectedRevision: 1})
	if err != nil || p2.GetRevision() != 2 || len(p2.GetNeeds()) != 1 {
		t.Fatalf("update = %v, %v", p2, err)
	}
	_, err = r.client.UpdateTaskProfile(ctx, &registryv1.UpdateTaskProfileRequest{Profile: notesReview(), ExpectedRevision: 1})
	wantErr(t, err, codes.Aborted, "REVISION_CONFLICT")
	if old, err := r.client.GetTaskProfile(ctx, &registryv1.GetTaskProfileRequest{Name: "notes_review", Revision: 1}); err != nil || len(old.GetNeeds()) != 2 {
		t.Errorf("revision 1 = %v, %v; want it kept", old, err)
	}
	_, err = r.client.GetTaskProfile(ctx, &registryv1.GetTaskProfileRequest{Name: "notes_review", Revision: 9})
	wantErr(t, err, codes.NotFound, "PROFILE_REVISION_UNKNOWN")
	_, err = r.client.GetTaskProfile(ctx, &registryv1.GetTaskProfileRequest{Name: "unknown_profile"})
	wantErr(t, err, codes.NotFound, "PROFILE_UNKNOWN")
	_, err = r.client.UpdateTaskProfile(ctx, &registryv1.UpdateTaskProfileRequest{Profile: &registryv1.TaskProfile{Name: "unknown_profile"}})
	wantErr(t, err, codes.NotFound, "PROFILE_UNKNOWN")

	dep, err := r.client.DeprecateTaskProfile(ctx, &registryv1.DeprecateTaskProfileRequest{Name: "notes_review", Reason: "merged into source_review"})
	if err != nil || dep.GetState() != registryv1.DefinitionState_DEFINITION_STATE_DEPRECATED || dep.GetRevision() != 2 {
		t.Fatalf("deprecate = %v, %v", dep, err)
	}
	_, err = r.client.DeprecateTaskProfile(ctx, &registryv1.DeprecateTaskProfileRequest{Name: "notes_review"})
	wantErr(t, err, codes.InvalidArgument, "INVALID_DEPRECATION")
	list, err := r.client.ListTaskProfiles(ctx, &registryv1.ListTaskProfilesRequest{})
	if err != nil || slices.ContainsFunc(list.GetProfiles(), func(p *registryv1.TaskProfile) bool { return p.GetName() == "notes_review" }) {
		t.Errorf("list hides nothing: %v, %v", list, err)
	}
	list, err = r.client.ListTaskProfiles(ctx, &registryv1.ListTaskProfilesRequest{ShowDeprecated: true})
	if err != nil || len(list.GetProfiles()) != 5 {
		t.Errorf("list with deprecated = %d, %v; want the 4 defaults and notes_review", len(list.GetProfiles()), err)
	}
	back, err := r.client.UpdateTaskProfile(ctx, &registryv1.UpdateTaskProfileRequest{Profile: next})
	if err != nil || back.GetRevision() != 3 || back.GetState() != registryv1.DefinitionState_DEFINITION_STATE_ACTIVE {
		t.Errorf("update of a deprecated profile = %v, %v; want revision 3, active", back, err)
	}
}

// TestTaskProfileValidation: every refusal names its reason and field and
// stores nothing.
func TestTaskProfileValidation(t *testing.T) {
	t.Parallel()
	r := start(t)
	createCap(t, r.client, searchNotes(t))
	retired := searchNotes(t)
	retired.Name = "search_archive"
	createCap(t, r.client, retired)
	if _, err := r.client.DeprecateCapability(t.Context(), &registryv1.DeprecateCapabilityRequest{Name: "search_archive", Reason: "archive closed"}); err != nil {
		t.Fatal(err)
	}
	base := lastSequence(t, r)
	tests := []struct {
		name   string
		mutate func(*registryv1.TaskProfile)
		code   codes.Code
		reason string
		field  string
	}{
		{"no profile", nil, codes.InvalidArgument, "FIELD_REQUIRED", "profile"},
		{"bad name", func(p *registryv1.TaskProfile) { p.Name = "Notes Review" }, codes.InvalidArgument, "INVALID_NAME", "profile.name"},
		{"need without a capability", func(p *registryv1.TaskProfile) { p.Needs[0].Capability = "" }, codes.InvalidArgument, "INVALID_PROFILE", "profile.needs[0].capability"},
		{"capability needed twice", func(p *registryv1.TaskProfile) {
			p.Needs = append(p.Needs, &registryv1.ProfileNeed{Capability: "search_notes", When: registryv1.NeedCondition_NEED_CONDITION_ALWAYS})
		}, codes.InvalidArgument, "INVALID_PROFILE", "profile.needs[2].capability"},
		{"unknown condition", func(p *registryv1.TaskProfile) { p.Needs[0].When = 9 }, codes.InvalidArgument, "INVALID_PROFILE", "profile.needs[0].when"},
		{"negative call budget", func(p *registryv1.TaskProfile) { p.DefaultBudget.MaxCalls = -1 }, codes.InvalidArgument, "INVALID_PROFILE", "profile.default_budget.max_calls"},
		{"negative byte budget", func(p *registryv1.TaskProfile) { p.DefaultBudget.MaxResponseBytes = -1 }, codes.InvalidArgument, "INVALID_PROFILE", "profile.default_budget.max_response_bytes"},
		{"negative cost budget", func(p *registryv1.TaskProfile) { p.DefaultBudget.MaxCostMicros = -5 }, codes.InvalidArgument, "INVALID_PROFILE", "profile.default_budget.max_cost_micros"},
		{"undeclared capability", func(p *registryv1.TaskProfile) { p.Needs[1].Capability = "send_email" }, codes.NotFound, "CAPABILITY_UNKNOWN", ""},
		{"deprecated capability", func(p *registryv1.TaskProfile) { p.Needs[1].Capability = "search_archive" }, codes.FailedPrecondition, "CAPABILITY_DEPRECATED", ""},
	}
	for _, tc := range tests {
		var p *registryv1.TaskProfile
		if tc.mutate != nil {
			p = notesReview()
			tc.mutate(p)
		}
		for _, op := range []string{"create", "update"} {
			var err error
			if op == "create" {
				_, err = r.client.CreateTaskProfile(t.Context(), &registryv1.CreateTaskProfileRequest{Profile: p})
			} else {
				_, err = r.client.UpdateTaskProfile(t.Context(), &registryv1.UpdateTaskProfileRequest{Profile: p})
			}
			if !apierror.Is(err, tc.code, tc.reason) {
				t.Errorf("%s %s: %v (reason %q), want %v %s", op, tc.name, err, apierror.Reason(err), tc.code, tc.reason)
				continue
			}
			if tc.field != "" && !slices.Contains(apierror.Fields(err), tc.field) {
				t.Errorf("%s %s: fields %v, want %s", op, tc.name, apierror.Fields(err), tc.field)
			}
		}
	}
	if _, err := r.client.GetTaskProfile(t.Context(), &registryv1.GetTaskProfileRequest{Name: "notes_review"}); !apierror.Is(err, codes.NotFound, "PROFILE_UNKNOWN") {
		t.Errorf("a refused profile was stored: %v", err)
	}
	if evs := eventsAfter(t, r, base); len(evs) != 0 {
		t.Errorf("refusals wrote %d events", len(evs))
	}
}
