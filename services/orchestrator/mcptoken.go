package orchestrator

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/v0m3/v0m3/internal/apierror"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	"github.com/v0m3/v0m3/services/orchestrator/tasks"
)

// DefaultMCPTokenTTL is how long a task-scoped MCP token lasts when
// Deps.MCPTokenTTL is zero: long enough for an agent's session, short
// enough that a leaked token soon stops working.
const DefaultMCPTokenTTL = time.Hour

// mcpTokenPrefix marks a task-scoped MCP token, so a secret scanner (and a
// person) recognises one.
const mcpTokenPrefix = "v0m3tt_"

// MCPPath is the path of a task's MCP endpoint under the endpoint's base
// URL.
func MCPPath(taskID string) string { return "/tasks/" + url.PathEscape(taskID) + "/mcp" }

// errMCPDisabled is the refusal of MCP access when the orchestrator does
// not serve the endpoint.
func errMCPDisabled() error {
	return apierror.New(codes.FailedPrecondition, "MCP_ENDPOINT_DISABLED",
		"this orchestrator does not serve task MCP endpoints; start it with --mcp-addr", nil)
}

// MintMcpToken mints a fresh MCP token for an active task. Only the task's
// requester or its actor may: the token acts as the requester.
func (s *Server) MintMcpToken(ctx context.Context, req *orchestratorv1.MintMcpTokenRequest) (*orchestratorv1.McpEndpoint, error) {
	if req.GetTaskId() == "" {
		return nil, missing("task_id")
	}
	task, err := s.openTask(ctx, req.GetTaskId(), taskWrite)
	if err != nil {
		return nil, err
	}
	c, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	if c.ID != task.GetRequester().GetId() && (task.GetActor() == "" || c.ID != task.GetActor()) {
		return nil, apierror.New(codes.PermissionDenied, "NOT_TASK_REQUESTER",
			fmt.Sprintf("only the requester of task %s (or the service that started it for them) may mint its MCP token", task.GetId()),
			map[string]string{"task_id": task.GetId()})
	}
	return s.mintMCPToken(ctx, task)
}

// mintMCPToken mints a token for task, records its digest and returns the
// endpoint with the token. The token itself is never stored or logged.
func (s *Server) mintMCPToken(ctx context.Context, task *orchestratorv1.Task) (*orchestratorv1.McpEndpoint, error) {
	if s.deps.MCPBaseURL == "" {
		return nil, errMCPDisabled()
	}
	if task.GetState() != orchestratorv1.TaskState_TASK_STATE_ACTIVE {
		return nil, apierror.New(codes.FailedPrecondition, "TASK_NOT_ACTIVE",
			fmt.Sprintf("task %s is %s; it gets no MCP token", task.GetId(), tasks.Name(task.GetState())),
			map[string]string{"task_id": task.GetId(), "state": tasks.Name(task.GetState())})
	}
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, s.internal(ctx, "mint an MCP token", err)
	}
	token := mcpTokenPrefix + base64.RawURLEncoding.EncodeToString(secret)
	now := s.now()
	ttl := s.deps.MCPTokenTTL
	if ttl <= 0 {
		ttl = DefaultMCPTokenTTL
	}
	rec := &orchestratorv1.TaskAccessToken{
		TaskId: task.GetId(), TokenDigest: tokenDigest(token), Requester: task.GetRequester().GetId(),
		CreateTime: timestamppb.New(now), ExpireTime: timestamppb.New(now.Add(ttl)),
	}
	if err := s.st.AddAccessToken(ctx, rec); err != nil {
		return nil, s.internal(ctx, "record the MCP token", err)
	}
	s.log.InfoContext(ctx, "MCP token minted", "task", task.GetId(), "requester", rec.GetRequester(), "expire_time", rec.GetExpireTime().AsTime())
	return &orchestratorv1.McpEndpoint{
		Url: strings.TrimRight(s.deps.MCPBaseURL, "/") + MCPPath(task.GetId()), Token: token, ExpireTime: rec.GetExpireTime(),
	}, nil
}

// tokenDigest is what is stored of a token.
func tokenDigest(token string) string {
	sum := sha256.Sum256([]byte(token))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// errTokenRefused is every refusal of a presented token; why says which
// rule refused it, for the log only (the client learns no more than
// "invalid").
type errTokenRefused struct{ why string }

func (e errTokenRefused) Error() string { return "token refused: " + e.why }

// verifyMCPToken returns the task a presented token opens: it must be one
// of the task's recorded tokens (compared in constant time), unexpired,
// minted for the task's requester, and the task must be active. Anything
// else is an errTokenRefused; a storage failure is returned as it is.
func (s *Server) verifyMCPToken(ctx context.Context, taskID, token string) (*orchestratorv1.Task, error) {
	if !strings.HasPrefix(token, mcpTokenPrefix) || len(token) > 256 {
		return nil, errTokenRefused{"not a task token"}
	}
	want := []byte(tokenDigest(token))
	recs, err := s.st.ListAccessTokens(ctx, taskID)
	if err != nil {
		return nil, err
	}
	var match *orchestratorv1.TaskAccessToken
	for _, r := range recs {
		// Every record is compared, so the time taken says nothing about
		// which (or whether one) matched.
		if subtle.ConstantTimeCompare([]byte(r.GetTokenDigest()), want) == 1 {
			match = r
		}
	}
	if match == nil {
		return nil, errTokenRefused{"no such token for this task"}
	}
	if !s.now().Before(match.GetExpireTime().AsTime()) {
		return nil, errTokenRefused{"expired"}
	}
	task, err := s.st.GetTask(ctx, taskID)
	if err != nil {
		return nil, err
	}
	if task.GetRequester().GetId() != match.GetRequester() {
		return nil, errTokenRefused{"minted for another requester"}
	}
	if task.GetState() != orchestratorv1.TaskState_TASK_STATE_ACTIVE {
		return nil, errTokenRefused{"task " + tasks.Name(task.GetState())}
	}
	return task, nil
}

// isTokenRefused reports whether err is a refusal of the token itself.
func isTokenRefused(err error) bool {
	var r errTokenRefused
	return errors.As(err, &r)
}
