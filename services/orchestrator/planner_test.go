package orchestrator

import (
	"slices"
	"testing"

	"google.golang.org/grpc/codes"

	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
)

func TestPlan(t *testing.T) {
	t.Parallel()
	tests := []struct {
		kind            orchestratorv1.TaskKind
		evidencePresent bool
		want            []string
		purpose         string
	}{
		{orchestratorv1.TaskKind_TASK_KIND_SOURCE_REVIEW, false, []string{capRetrieveAuthorizedSource}, "source_review"},
		{orchestratorv1.TaskKind_TASK_KIND_SOURCE_REVIEW, true, []string{capRetrieveAuthorizedSource}, "source_review"},
		{orchestratorv1.TaskKind_TASK_KIND_REWRITE, false, []string{capRetrieveAuthorizedSource}, "rewrite"},
		{orchestratorv1.TaskKind_TASK_KIND_REWRITE, true, []string{}, "rewrite"},
		{orchestratorv1.TaskKind_TASK_KIND_PREVIEW, false, []string{capRenderPreview}, "preview"},
		{orchestratorv1.TaskKind_TASK_KIND_EXPORT, false, []string{capDeliverApprovedArtifact}, "export"},
	}
	for _, tc := range tests {
		got, err := plan(tc.kind, tc.evidencePresent)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("plan(%s, %t) = %v, %v; want %v", tc.kind, tc.evidencePresent, got, err, tc.want)
		}
		if p := purposeOf(tc.kind); p != tc.purpose {
			t.Errorf("purposeOf(%s) = %q, want %q", tc.kind, p, tc.purpose)
		}
	}
	for _, bad := range []orchestratorv1.TaskKind{orchestratorv1.TaskKind_TASK_KIND_UNSPECIFIED, orchestratorv1.TaskKind(99)} {
		if _, err := plan(bad, false); codeOf(err) != codes.InvalidArgument {
			t.Errorf("plan(%v) error = %v, want INVALID_ARGUMENT", bad, err)
		}
	}
}
