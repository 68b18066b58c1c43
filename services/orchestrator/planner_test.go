package orchestrator

import (
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

func need(capability string, when registryv1.NeedCondition) *registryv1.ProfileNeed {
	return &registryv1.ProfileNeed{Capability: capability, When: when}
}

// legacyTask is a task as recorded before profiles existed: a kind, no
// profile.
func legacyTask(kind orchestratorv1.TaskKind) *orchestratorv1.Task {
	//lint:ignore SA1019 tasks recorded with the deprecated kind must keep working.
	return &orchestratorv1.Task{Kind: kind}
}

// withKind sets the deprecated kind of a StartTask request.
func withKind(req *orchestratorv1.StartTaskRequest, kind orchestratorv1.TaskKind) *orchestratorv1.StartTaskRequest {
	//lint:ignore SA1019 the deprecated kind must keep starting its profile.
	req.Kind = kind
	return req
}

func TestPlanFollowsProfileNeedsAndConditions(t *testing.T) {
	t.Parallel()
	const (
		unset   = registryv1.NeedCondition_NEED_CONDITION_UNSPECIFIED
		always  = registryv1.NeedCondition_NEED_CONDITION_ALWAYS
		absent  = registryv1.NeedCondition_NEED_CONDITION_EVIDENCE_ABSENT
		present = registryv1.NeedCondition_NEED_CONDITION_EVIDENCE_PRESENT
	)
	mixed := []*registryv1.ProfileNeed{need("search", absent), need("cite", present), need("render", always), need("notes", unset)}
	tests := []struct {
		name            string
		needs           []*registryv1.ProfileNeed
		evidencePresent bool
		want            []string
	}{
		{"always needed without evidence", []*registryv1.ProfileNeed{need("search", always)}, false, []string{"search"}},
		{"always needed with evidence", []*registryv1.ProfileNeed{need("search", always)}, true, []string{"search"}},
		{"unset condition means always", []*registryv1.ProfileNeed{need("search", unset)}, true, []string{"search"}},
		{"evidence absent, none yet", []*registryv1.ProfileNeed{need("search", absent)}, false, []string{"search"}},
		{"evidence absent, evidence present: none", []*registryv1.ProfileNeed{need("search", absent)}, true, []string{}},
		{"evidence present, none yet: none", []*registryv1.ProfileNeed{need("cite", present)}, false, []string{}},
		{"evidence present, evidence present", []*registryv1.ProfileNeed{need("cite", present)}, true, []string{"cite"}},
		{"mixed without evidence, in profile order", mixed, false, []string{"search", "render", "notes"}},
		{"mixed with evidence, in profile order", mixed, true, []string{"cite", "render", "notes"}},
		{"a need named twice is needed once", []*registryv1.ProfileNeed{need("search", absent), need("search", always)}, false, []string{"search"}},
		{"an unknown condition never needs", []*registryv1.ProfileNeed{need("search", registryv1.NeedCondition(42))}, false, []string{}},
		{"a need without a capability is skipped", []*registryv1.ProfileNeed{need("", always)}, false, []string{}},
		{"no needs, nothing needed", nil, false, []string{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := plan(&registryv1.TaskProfile{Name: "p", Needs: tc.needs}, tc.evidencePresent)
			if !slices.Equal(got, tc.want) || got == nil {
				t.Errorf("plan = %#v, want %#v", got, tc.want)
			}
		})
	}
}

func TestPurposeOf(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		task *orchestratorv1.Task
		want string
	}{
		{"recorded at start", &orchestratorv1.Task{Profile: "release_check", PolicyPurpose: "release_review"}, "release_review"},
		{"profile without a recorded purpose", &orchestratorv1.Task{Profile: "release_check"}, "release_check"},
		{"started with a kind before profiles: source review", legacyTask(orchestratorv1.TaskKind_TASK_KIND_SOURCE_REVIEW), "source_review"},
		{"started with a kind before profiles: rewrite", legacyTask(orchestratorv1.TaskKind_TASK_KIND_REWRITE), "rewrite"},
		{"started with a kind before profiles: preview", legacyTask(orchestratorv1.TaskKind_TASK_KIND_PREVIEW), "preview"},
		{"started with a kind before profiles: export", legacyTask(orchestratorv1.TaskKind_TASK_KIND_EXPORT), "export"},
	}
	for _, tc := range tests {
		if got := purposeOf(tc.task); got != tc.want {
			t.Errorf("%s: purposeOf = %q, want %q", tc.name, got, tc.want)
		}
	}
	for _, p := range []*registryv1.TaskProfile{{Name: "rewrite"}, {Name: "rewrite", Purpose: "editing"}} {
		want := p.GetPurpose()
		if want == "" {
			want = p.GetName()
		}
		if got := profilePurpose(p); got != want {
			t.Errorf("profilePurpose(%v) = %q, want %q", p, got, want)
		}
	}
}

func TestStartTaskRecordsProfile(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.registry.putProfile(&registryv1.TaskProfile{
		Name: "migration_review", Purpose: "source_review",
		Needs:         []*registryv1.ProfileNeed{need(capRetrieveAuthorizedSource, registryv1.NeedCondition_NEED_CONDITION_EVIDENCE_ABSENT)},
		DefaultBudget: &registryv1.TaskBudget{MaxCalls: 7, MaxResponseBytes: 4096},
	})
	resp := h.start(t, "migration_review", false)
	task := resp.GetTask()
	if task.GetProfile() != "migration_review" || task.GetProfileRevision() != 1 || task.GetPolicyPurpose() != "source_review" ||
		task.GetKind() != orchestratorv1.TaskKind_TASK_KIND_UNSPECIFIED || !slices.Equal(task.GetNeededCapabilities(), []string{capRetrieveAuthorizedSource}) {
		t.Errorf("task = %v", task)
	}
	if got := offeredNames(resp.GetCatalogue()); !slices.Equal(got, []string{capRetrieveAuthorizedSource}) {
		t.Errorf("offered = %v", got)
	}
	stored, err := h.client.GetTask(t.Context(), &orchestratorv1.GetTaskRequest{Id: task.GetId()})
	if err != nil || stored.GetProfile() != "migration_review" || stored.GetProfileRevision() != 1 || stored.GetPolicyPurpose() != "source_review" {
		t.Errorf("stored task = %v, %v", stored, err)
	}
	// Policy learns the profile's default budget with the task's scope.
	h.policy.mu.Lock()
	reg := h.policy.registered
	h.policy.mu.Unlock()
	if len(reg) != 1 || reg[0].GetBudget().GetMaxCalls() != 7 || reg[0].GetBudget().GetMaxResponseBytes() != 4096 || reg[0].GetBudget().GetMaxCostMicros() != 0 {
		t.Errorf("registered = %v", reg)
	}

	// A new revision of the profile changes nothing for the running task:
	// it keeps the purpose it started with, which policy keeps hearing.
	h.registry.putProfile(&registryv1.TaskProfile{Name: "migration_review", Purpose: "other_purpose",
		Needs: []*registryv1.ProfileNeed{need(capRetrieveAuthorizedSource, registryv1.NeedCondition_NEED_CONDITION_ALWAYS)}})
	r, err := h.submit(t, task.GetId(), "call_1", capRetrieveAuthorizedSource,
		map[string]any{"source": handleFor(t, resp.GetCatalogue(), capRetrieveAuthorizedSource, migrationGuide.GetTitle())})
	if err != nil || r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
		t.Fatalf("submit = %v, %v", r, err)
	}
	h.policy.mu.Lock()
	purposes := slices.Clone(h.policy.purposes)
	h.policy.mu.Unlock()
	if len(purposes) < 2 || slices.ContainsFunc(purposes, func(p string) bool { return p != "source_review" }) {
		t.Errorf("purposes policy evaluated = %v, want only source_review", purposes)
	}
	if next := h.start(t, "migration_review", false).GetTask(); next.GetProfileRevision() != 2 || next.GetPolicyPurpose() != "other_purpose" {
		t.Errorf("a task started after the revision = %v", next)
	}
}

func TestStartTaskWithKindStartsTheSameNamedProfile(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	for _, req := range []*orchestratorv1.StartTaskRequest{
		withKind(&orchestratorv1.StartTaskRequest{}, orchestratorv1.TaskKind_TASK_KIND_PREVIEW),
		withKind(&orchestratorv1.StartTaskRequest{Profile: "preview"}, orchestratorv1.TaskKind_TASK_KIND_PREVIEW),
	} {
		resp, err := h.client.StartTask(t.Context(), req)
		if err != nil {
			t.Fatalf("StartTask(%v): %v", req, err)
		}
		task := resp.GetTask()
		if task.GetProfile() != "preview" || task.GetProfileRevision() != 1 || task.GetKind() != orchestratorv1.TaskKind_TASK_KIND_PREVIEW ||
			task.GetPolicyPurpose() != "preview" {
			t.Errorf("task = %v", task)
		}
		if got := offeredNames(resp.GetCatalogue()); !slices.Equal(got, []string{capRenderPreview}) {
			t.Errorf("offered = %v", got)
		}
	}
}

// A task recorded before profiles existed (kind set, no profile) keeps
// working: policy hears the kind's purpose when its requests are decided.
func TestTaskStartedBeforeProfilesKeepsWorking(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := t.Context()
	task := legacyTask(orchestratorv1.TaskKind_TASK_KIND_SOURCE_REVIEW)
	task.Id, task.Requester = "task_legacy", &policyv1.Principal{Id: "alice", Groups: []string{"authors"}}
	task.SourceScope = []*orchestratorv1.SourceRef{migrationGuide}
	task.NeededCapabilities, task.State = []string{capRetrieveAuthorizedSource}, orchestratorv1.TaskState_TASK_STATE_ACTIVE
	if err := h.server.st.CreateTask(ctx, task); err != nil {
		t.Fatal(err)
	}
	if err := h.server.tasks.RegisterWithPolicy(ctx, task, nil); err != nil {
		t.Fatal(err)
	}
	cat, err := h.server.tasks.CompileCatalogue(ctx, task)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.server.st.PutCatalogue(ctx, cat); err != nil {
		t.Fatal(err)
	}
	r, err := h.submit(t, task.GetId(), "call_1", capRetrieveAuthorizedSource,
		map[string]any{"source": handleFor(t, cat, capRetrieveAuthorizedSource, migrationGuide.GetTitle())})
	if err != nil || r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
		t.Fatalf("submit = %v, %v", r, err)
	}
	h.policy.mu.Lock()
	purposes := slices.Clone(h.policy.purposes)
	h.policy.mu.Unlock()
	if len(purposes) < 2 || slices.ContainsFunc(purposes, func(p string) bool { return p != "source_review" }) {
		t.Errorf("purposes policy evaluated = %v, want only source_review", purposes)
	}
}

func TestStartTaskRefusesProfile(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.registry.putProfile(&registryv1.TaskProfile{Name: "old_export", State: registryv1.DefinitionState_DEFINITION_STATE_DEPRECATED,
		DeprecationReason: "use export", Needs: []*registryv1.ProfileNeed{need(capDeliverApprovedArtifact, registryv1.NeedCondition_NEED_CONDITION_ALWAYS)}})
	tests := []struct {
		name    string
		req     *orchestratorv1.StartTaskRequest
		code    codes.Code
		reason  string
		field   string
		message string
	}{
		{"neither profile nor kind", &orchestratorv1.StartTaskRequest{}, codes.InvalidArgument, "FIELD_REQUIRED", "profile", "profile is required"},
		{"kind and profile disagree",
			withKind(&orchestratorv1.StartTaskRequest{Profile: "export"}, orchestratorv1.TaskKind_TASK_KIND_SOURCE_REVIEW),
			codes.InvalidArgument, "PROFILE_KIND_MISMATCH", "kind", `names profile "source_review" but profile is "export"`},
		{"kind not in the enum", withKind(&orchestratorv1.StartTaskRequest{}, orchestratorv1.TaskKind(99)), codes.InvalidArgument, "UNKNOWN_TASK_KIND", "kind", "kind 99"},
		{"unknown profile names the known ones", &orchestratorv1.StartTaskRequest{Profile: "exfiltrate"}, codes.NotFound, "PROFILE_UNKNOWN", "",
			`task profile "exfiltrate" does not exist; known profiles: export, preview, rewrite, source_review`},
		{"deprecated profile", &orchestratorv1.StartTaskRequest{Profile: "old_export"}, codes.FailedPrecondition, "PROFILE_DEPRECATED", "",
			`task profile "old_export" is deprecated (use export)`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := h.client.StartTask(t.Context(), tc.req)
			if !apierror.Is(err, tc.code, tc.reason) {
				t.Fatalf("error = %v (reason %q), want %s %s", err, apierror.Reason(err), tc.code, tc.reason)
			}
			if tc.field != "" && !slices.Equal(apierror.Fields(err), []string{tc.field}) {
				t.Errorf("field violations = %v, want %s", apierror.Fields(err), tc.field)
			}
			if !strings.Contains(errorMessage(err), tc.message) {
				t.Errorf("message = %q, want it to contain %q", errorMessage(err), tc.message)
			}
		})
	}
	// A refused start leaves nothing behind: policy never heard of a task,
	// nothing was offered, nothing traced.
	h.policy.mu.Lock()
	defer h.policy.mu.Unlock()
	if len(h.policy.registered) != 0 || len(h.policy.purposes) != 0 {
		t.Errorf("policy registered %v and was asked about %v", h.policy.registered, h.policy.purposes)
	}
	h.evidence.mu.Lock()
	defer h.evidence.mu.Unlock()
	if len(h.evidence.traces) != 0 {
		t.Errorf("traces = %v", h.evidence.traces)
	}
}
