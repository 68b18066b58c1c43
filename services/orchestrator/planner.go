package orchestrator

import (
	"strings"

	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	"github.com/v0m3/v0m3/services/internal/apierror"
)

// Product capability names the planner asks for. They are V0M3 contracts,
// never remote tool names.
const (
	capRetrieveAuthorizedSource = "retrieve_authorized_source"
	capRenderPreview            = "render_preview"
	capDeliverApprovedArtifact  = "deliver_approved_artifact"
)

// plan derives the capabilities a task needs from what it is for. This is
// the only place that knows it: a capability the plan does not name is never
// offered, whatever policy or discovery says.
func plan(kind orchestratorv1.TaskKind, evidencePresent bool) ([]string, error) {
	switch kind {
	case orchestratorv1.TaskKind_TASK_KIND_SOURCE_REVIEW:
		return []string{capRetrieveAuthorizedSource}, nil
	case orchestratorv1.TaskKind_TASK_KIND_REWRITE:
		if evidencePresent {
			return []string{}, nil
		}
		return []string{capRetrieveAuthorizedSource}, nil
	case orchestratorv1.TaskKind_TASK_KIND_PREVIEW:
		return []string{capRenderPreview}, nil
	case orchestratorv1.TaskKind_TASK_KIND_EXPORT:
		return []string{capDeliverApprovedArtifact}, nil
	case orchestratorv1.TaskKind_TASK_KIND_UNSPECIFIED:
		return nil, apierror.InvalidArgument("MISSING_FIELD", "kind is required",
			apierror.FieldViolation{Field: "kind", Description: "set a task kind, e.g. TASK_KIND_SOURCE_REVIEW"})
	default:
		return nil, apierror.InvalidArgument("UNKNOWN_TASK_KIND", "kind "+kind.String()+" is not a known task kind",
			apierror.FieldViolation{Field: "kind", Description: "unknown task kind"})
	}
}

// purposeOf is the purpose policy evaluates: the kind's name in lower snake
// case, e.g. "source_review".
func purposeOf(kind orchestratorv1.TaskKind) string {
	return strings.ToLower(strings.TrimPrefix(kind.String(), "TASK_KIND_"))
}
