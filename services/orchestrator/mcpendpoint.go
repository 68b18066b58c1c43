package orchestrator

import (
	"context"

	"google.golang.org/grpc/status"

	"github.com/v0m3/v0m3/internal/apierror"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	"github.com/v0m3/v0m3/services/orchestrator/taskmcp"
)

// The task-scoped MCP endpoint (issue 17) is package taskmcp; the
// orchestrator serves it because it owns tasks, catalogues and requests:
// a tool call is a SubmitToolRequest by the task's requester, decided by
// the same code.

// MCPBackend returns the orchestrator as the task MCP endpoint's backend,
// for taskmcp.Handler: every task's MCP endpoint at MCPPath(task
// id), and, with the orchestrator's credentials, its JWKS at
// taskmcp.JWKSPath.
func (s *Server) MCPBackend() taskmcp.Backend { return mcpBackend{s} }

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
