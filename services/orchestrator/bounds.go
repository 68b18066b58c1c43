package orchestrator

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	"github.com/v0m3/v0m3/services/internal/apierror"
)

// Bounds of what a caller may send. Ids and names are short; free text is
// bounded so that what repeats it (errors, logs, traces, approval pages)
// stays small; a longer value is refused before anything reads or records
// it, with the limit named.
const (
	maxIDBytes        = 256
	maxNameBytes      = 256
	maxURIBytes       = 4096
	maxTextBytes      = 4096
	maxScopeEntries   = 1000
	maxArgumentsBytes = 1 << 20
	// maxEchoBytes bounds caller text quoted back in an error message.
	maxEchoBytes = 128
)

// reasonFieldTooLong refuses a field over its bound.
const reasonFieldTooLong = "FIELD_TOO_LONG"

// bound is one field's length and its limit.
type bound struct {
	field string
	size  int
	limit int
}

// fieldTooLong is the error of a field over its limit.
func fieldTooLong(field string, limit int) error {
	return apierror.InvalidArgument(reasonFieldTooLong, fmt.Sprintf("%s is longer than %d bytes", field, limit),
		apierror.FieldViolation{Field: field, Description: fmt.Sprintf("at most %d bytes", limit)})
}

// checkBounds refuses the first of bs over its limit.
func checkBounds(bs ...bound) error {
	for _, b := range bs {
		if b.size > b.limit {
			return fieldTooLong(b.field, b.limit)
		}
	}
	return nil
}

// checkInput bounds the caller-supplied fields of a request to the
// product API, before anything else reads them.
func checkInput(in proto.Message) error {
	switch r := in.(type) {
	case *orchestratorv1.SubmitToolRequestRequest:
		return checkBounds(
			bound{"task_id", len(r.GetTaskId()), maxIDBytes},
			bound{"provider_call_id", len(r.GetProviderCallId()), maxIDBytes},
			bound{"capability", len(r.GetCapability()), maxNameBytes},
			bound{"document_digest", len(r.GetDocumentDigest()), maxIDBytes},
			bound{"arguments", proto.Size(r.GetArguments()), maxArgumentsBytes})
	case *orchestratorv1.StartTaskRequest:
		bs := []bound{
			{"purpose", len(r.GetPurpose()), maxTextBytes},
			{"profile", len(r.GetProfile()), maxNameBytes},
			{"on_behalf_of.id", len(r.GetOnBehalfOf().GetId()), maxIDBytes},
		}
		for _, sc := range []struct {
			field string
			refs  []*orchestratorv1.SourceRef
		}{{"source_scope", r.GetSourceScope()}, {"artifact_scope", r.GetArtifactScope()}, {"destination_scope", r.GetDestinationScope()}} {
			if len(sc.refs) > maxScopeEntries {
				return apierror.InvalidArgument("SCOPE_TOO_LARGE", fmt.Sprintf("%s lists %d entries, more than %d", sc.field, len(sc.refs), maxScopeEntries),
					apierror.FieldViolation{Field: sc.field, Description: fmt.Sprintf("at most %d entries", maxScopeEntries)})
			}
			for i, ref := range sc.refs {
				bs = append(bs,
					bound{fmt.Sprintf("%s[%d].uri", sc.field, i), len(ref.GetUri()), maxURIBytes},
					bound{fmt.Sprintf("%s[%d].title", sc.field, i), len(ref.GetTitle()), maxNameBytes})
			}
		}
		return checkBounds(bs...)
	case *orchestratorv1.ApproveRequest:
		return checkBounds(bound{"request_id", len(r.GetRequestId()), maxIDBytes}, bound{"document_digest", len(r.GetDocumentDigest()), maxIDBytes})
	case *orchestratorv1.DenyRequest:
		return checkBounds(bound{"request_id", len(r.GetRequestId()), maxIDBytes}, bound{"reason", len(r.GetReason()), maxTextBytes})
	case *orchestratorv1.CancelTaskRequest:
		return checkBounds(bound{"id", len(r.GetId()), maxIDBytes}, bound{"reason", len(r.GetReason()), maxTextBytes})
	case *orchestratorv1.CompleteTaskRequest:
		return checkBounds(bound{"id", len(r.GetId()), maxIDBytes}, bound{"reason", len(r.GetReason()), maxTextBytes})
	}
	return nil
}

// maxEchoedNames bounds how many caller-chosen names an error lists.
const maxEchoedNames = 10

// echoNames returns caller-chosen names as an error may quote them: at
// most maxEchoedNames, each cut to maxEchoBytes, and how many were left
// out.
func echoNames(names []string) (shown []string, more int) {
	if len(names) > maxEchoedNames {
		names, more = names[:maxEchoedNames], len(names)-maxEchoedNames
	}
	shown = make([]string, len(names))
	for i, n := range names {
		shown[i] = truncate(n, maxEchoBytes)
	}
	return shown, more
}
