package adapter

import (
	"context"
	"errors"
	"fmt"
	"time"

	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/resultschema"
)

// CodeInvalidArguments is the safe code of a direct call whose arguments do
// not match the target's input schema.
const CodeInvalidArguments = "INVALID_ARGUMENTS"

// DirectSource is an adapter that is not MCP: it describes itself and
// answers calls in process. The adapter has none of its own: the
// composition root registers them by name (Deps.Direct). Its answers go through the same limits,
// media-type checks, digests and traces as an MCP server's, so a direct
// adapter and an MCP adapter for the same source produce the same source
// observation.
type DirectSource interface {
	// Describe returns what the source offers, as a snapshot without
	// identity fields (the registry assigns them).
	Describe(ctx context.Context) (*registryv1.DiscoverySnapshot, error)
	// Call runs one call. A *DirectCallError is the source's own refusal
	// (like an MCP tool error); any other error is a failure of the adapter.
	Call(ctx context.Context, target *registryv1.RemoteTarget, args *structpb.Struct) ([]*adapterv1.ContentItem, error)
}

// DirectCallError is a direct source's refusal of one call.
type DirectCallError struct {
	// Code is the safe code, e.g. TOOL_ERROR or INVALID_ARGUMENTS.
	Code string
	// Detail is the source's message, kept as untrusted detail.
	Detail string
}

func (e *DirectCallError) Error() string { return e.Code + ": " + e.Detail }

// directSource returns the direct adapter a connection names.
func (s *Server) directSource(conn *registryv1.Connection) (DirectSource, error) {
	name := conn.GetTransport().GetDirect().GetAdapter()
	src, ok := s.direct[name]
	if !ok {
		return nil, apierror.New(codes.FailedPrecondition, "DIRECT_ADAPTER_UNKNOWN",
			fmt.Sprintf("connection %s names the direct adapter %q, which this adapter does not have", conn.GetId(), truncate(name, 64)),
			map[string]string{"connection_id": conn.GetId()})
	}
	return src, nil
}

// executeDirect runs one call on a direct adapter under the same limits
// and checks as an MCP call.
func (s *Server) executeDirect(ctx context.Context, conn *registryv1.Connection, req *adapterv1.ExecuteRequest, schema *resultschema.Schema) *adapterv1.ExecuteResponse {
	method := "direct/tools/call"
	if req.GetTarget().GetKind() == registryv1.RemoteKind_REMOTE_KIND_RESOURCE {
		method = "direct/resources/read"
	}
	resp := &adapterv1.ExecuteResponse{Method: method, Stage: adapterv1.DeliveryStage_DELIVERY_STAGE_PREPARED}
	src, err := s.directSource(conn)
	if err != nil {
		return fail(resp, adapterv1.Outcome_OUTCOME_UNAVAILABLE, "DIRECT_ADAPTER_UNKNOWN", "")
	}
	snap, _ := src.Describe(ctx)
	resp.ServerInfo = snap.GetServerInfo()
	resp.SendTime = timestamppb.Now()
	resp.Stage = adapterv1.DeliveryStage_DELIVERY_STAGE_SENT
	items, err := src.Call(ctx, req.GetTarget(), req.GetArguments())
	resp.ObserveTime = timestamppb.New(time.Now())
	var ce *DirectCallError
	switch {
	case errors.As(err, &ce):
		resp.Stage = adapterv1.DeliveryStage_DELIVERY_STAGE_RESULT_OBSERVED
		return fail(resp, adapterv1.Outcome_OUTCOME_INVALID_REQUEST, ce.Code, truncate(ce.Detail, maxDetailBytes))
	case err != nil:
		return fail(resp, adapterv1.Outcome_OUTCOME_UNKNOWN, CodeMalformedResult, "")
	}
	resp.Stage = adapterv1.DeliveryStage_DELIVERY_STAGE_RESULT_OBSERVED
	if err := checkCount(len(items), req.GetLimits()); err != nil {
		var cerr *contentError
		errors.As(err, &cerr)
		return failFact(resp, adapterv1.Outcome_OUTCOME_INVALID_REQUEST, cerr.code, cerr.detail)
	}
	for _, it := range items {
		resp.ResponseBytes += int64(len(it.GetText())) + it.GetBlobSize()
	}
	// A direct source returns no structured content: a reviewed output
	// schema for its tool can never be met.
	if err := checkStructured(nil, schema); err != nil {
		return contentFailed(resp, err)
	}
	r, err := finish(items, nil, req.GetLimits())
	if err != nil {
		return contentFailed(resp, err)
	}
	resp.Items, resp.ResponseDigest, resp.Diagnostics, resp.Outcome = r.items, r.digest, r.diagnostics, adapterv1.Outcome_OUTCOME_OK
	return resp
}
