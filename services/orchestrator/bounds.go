package orchestrator

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	"github.com/v0m3/v0m3/services/internal/bounds"
)

// Bounds of what a caller may send the product API (services/internal/bounds
// holds the limits every service shares and the error over them).
const (
	maxIDBytes        = bounds.ID
	maxNameBytes      = bounds.Name
	maxURIBytes       = bounds.URI
	maxTextBytes      = bounds.Text
	maxScopeEntries   = bounds.Entries
	maxArgumentsBytes = bounds.Structured
	// maxEchoBytes bounds caller text quoted back in an error message.
	maxEchoBytes = bounds.Echo
)

// reasonFieldTooLong refuses a field over its bound.
const reasonFieldTooLong = bounds.ReasonFieldTooLong

// checkInput bounds the caller-supplied fields of a request to the
// product API, before anything else reads them.
func checkInput(in proto.Message) error {
	switch r := in.(type) {
	case *orchestratorv1.SubmitToolRequestRequest:
		return bounds.Check(
			bounds.Bytes("task_id", r.GetTaskId(), maxIDBytes),
			bounds.Bytes("provider_call_id", r.GetProviderCallId(), maxIDBytes),
			bounds.Bytes("capability", r.GetCapability(), maxNameBytes),
			bounds.Bytes("document_digest", r.GetDocumentDigest(), maxIDBytes),
			bounds.Bound{Field: "arguments", Size: proto.Size(r.GetArguments()), Limit: maxArgumentsBytes})
	case *orchestratorv1.StartTaskRequest:
		bs := []bounds.Bound{
			bounds.Bytes("purpose", r.GetPurpose(), maxTextBytes),
			bounds.Bytes("profile", r.GetProfile(), maxNameBytes),
			bounds.Bytes("on_behalf_of.id", r.GetOnBehalfOf().GetId(), maxIDBytes),
		}
		for _, sc := range []struct {
			field string
			refs  []*orchestratorv1.SourceRef
		}{{"source_scope", r.GetSourceScope()}, {"artifact_scope", r.GetArtifactScope()}, {"destination_scope", r.GetDestinationScope()}} {
			if len(sc.refs) > maxScopeEntries {
				return bounds.TooMany(bounds.ReasonScopeTooLarge, sc.field, len(sc.refs), maxScopeEntries)
			}
			for i, ref := range sc.refs {
				bs = append(bs,
					bounds.Bytes(fmt.Sprintf("%s[%d].uri", sc.field, i), ref.GetUri(), maxURIBytes),
					bounds.Bytes(fmt.Sprintf("%s[%d].title", sc.field, i), ref.GetTitle(), maxNameBytes))
			}
		}
		return bounds.Check(bs...)
	case *orchestratorv1.ApproveRequest:
		return bounds.Check(bounds.Bytes("request_id", r.GetRequestId(), maxIDBytes), bounds.Bytes("document_digest", r.GetDocumentDigest(), maxIDBytes))
	case *orchestratorv1.DenyRequest:
		return bounds.Check(bounds.Bytes("request_id", r.GetRequestId(), maxIDBytes), bounds.Bytes("reason", r.GetReason(), maxTextBytes))
	case *orchestratorv1.CancelTaskRequest:
		return bounds.Check(bounds.Bytes("id", r.GetId(), maxIDBytes), bounds.Bytes("reason", r.GetReason(), maxTextBytes))
	case *orchestratorv1.MintMcpTokenRequest:
		return bounds.Check(bounds.Bytes("task_id", r.GetTaskId(), maxIDBytes))
	case *orchestratorv1.CompleteTaskRequest:
		return bounds.Check(bounds.Bytes("id", r.GetId(), maxIDBytes), bounds.Bytes("reason", r.GetReason(), maxTextBytes))
	}
	return nil
}
