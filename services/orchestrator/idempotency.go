package orchestrator

import (
	"context"

	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	"github.com/v0m3/v0m3/services/orchestrator/tasks"
)

// StartTask is idempotent through its request_id (AIP-155): see package
// tasks, which derives the task id from the key and replays a start.

// reasonIdempotencyKeyReused refuses a request_id reused with another
// payload, for a task (tasks.ReasonKeyReused) as for a tool request.
const reasonIdempotencyKeyReused = tasks.ReasonKeyReused

// replayStart answers a StartTask whose task already exists under its
// request id: the same task and catalogue when the payload is the same
// (see tasks.Service.Replay).
func (s *Server) replayStart(ctx context.Context, req *orchestratorv1.StartTaskRequest, id string, requester *policyv1.Principal, actor string) (*orchestratorv1.StartTaskResponse, error) {
	task, cat, err := s.tasks.Replay(ctx, req, id, requester, actor)
	if err != nil {
		return nil, err
	}
	out := &orchestratorv1.StartTaskResponse{Task: task, Catalogue: cat}
	if req.GetMcpAccess() {
		// The first answer's token is not stored: a replay mints a fresh
		// one for the same requester.
		if out.McpEndpoint, err = s.mintMCPToken(ctx, task); err != nil {
			return nil, err
		}
	}
	return out, nil
}
