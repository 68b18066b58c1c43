package orchestrator

import (
	"context"
	"net/http"

	"google.golang.org/grpc/status"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/identity"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	"github.com/v0m3/v0m3/services/orchestrator/taskmcp"
)

// The task-scoped MCP endpoint (issue 17) is package taskmcp; the
// orchestrator serves it because it owns tasks, catalogues and requests:
// a tool call is a SubmitToolRequest by the task's requester, decided by
// the same code.

// Names of the task MCP endpoint, as taskmcp defines them.
const (
	// MetaProviderCallID is taskmcp.MetaProviderCallID.
	MetaProviderCallID = taskmcp.MetaProviderCallID
	// MetaDocumentDigest is taskmcp.MetaDocumentDigest.
	MetaDocumentDigest = taskmcp.MetaDocumentDigest
	// JWKSPath is taskmcp.JWKSPath.
	JWKSPath = taskmcp.JWKSPath
)

// MCPOptions configure the task MCP endpoint.
type MCPOptions struct {
	// AllowedHosts are the host names clients may use in Host and Origin
	// besides loopback (see hostguard); others get 403 (DNS rebinding).
	AllowedHosts []string
	// Limit admits the requests of each task's requester at its rate,
	// sharing the requester's bucket with the orchestrator's gRPC API (the
	// guard's limiter); nil admits them without limit.
	Limit *identity.CallerLimiter
}

// MCPHandler returns the HTTP handler of every task's MCP endpoint, at
// MCPPath(task id), and, with credentials, of the orchestrator's JWKS at
// JWKSPath.
func (s *Server) MCPHandler(opts MCPOptions) http.Handler {
	return taskmcp.Handler(mcpBackend{s}, taskmcp.Options{
		AllowedHosts: opts.AllowedHosts, Limit: opts.Limit,
		Credentials: s.deps.Credentials, ApprovalURL: s.deps.ApprovalURL, Log: s.log,
	})
}

// mcpBackend is the orchestrator as the task MCP endpoint's Backend.
type mcpBackend struct{ s *Server }

func (b mcpBackend) VerifyToken(ctx context.Context, taskID, token string) (*orchestratorv1.Task, bool, error) {
	task, err := b.s.verifyMCPToken(ctx, taskID, token)
	return task, err != nil && isTokenRefused(err), err
}

func (b mcpBackend) Catalogue(ctx context.Context, taskID string) (*orchestratorv1.OfferedCatalogue, error) {
	return b.s.st.GetCatalogue(ctx, taskID)
}

// Submit applies the API's limits, which a gRPC call gets from its
// interceptor, and submits.
func (b mcpBackend) Submit(ctx context.Context, in *orchestratorv1.SubmitToolRequestRequest) (*orchestratorv1.ToolRequest, error) {
	if err := limits.Check(in); err != nil {
		return nil, err
	}
	return b.s.SubmitToolRequest(ctx, in)
}

func (mcpBackend) Refusal(r *orchestratorv1.ToolRequest) error { return replayedRefusal(r) }

func (mcpBackend) Reason(err error) string {
	if reason := apierror.Reason(err); reason != "" {
		return reason
	}
	return "DEPENDENCY_" + codeName(status.Code(err))
}
