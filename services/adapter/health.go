package adapter

import (
	"context"
	"time"

	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	"google.golang.org/grpc/status"

	"github.com/v0m3/v0m3/services/internal/apierror"
)

// healthTimeout bounds one health check.
const healthTimeout = 15 * time.Second

// Health connects to a connection's server, sends an MCP ping and reports
// the result to policy. An unreachable server is a result, not an error.
func (s *Server) Health(ctx context.Context, req *adapterv1.HealthRequest) (*adapterv1.HealthResponse, error) {
	if req.GetConnectionId() == "" {
		return nil, apierror.InvalidArgument("CONNECTION_ID_REQUIRED", "connection_id is required",
			apierror.FieldViolation{Field: "connection_id", Description: "required"})
	}
	conn, err := s.connection(ctx, req.GetConnectionId())
	if err != nil {
		return nil, err
	}
	resp := &adapterv1.HealthResponse{ConnectionId: conn.GetId()}
	ctx, cancel := context.WithTimeout(ctx, healthTimeout)
	defer cancel()
	ss, err := s.openSession(ctx, conn, discoveryMessageLimit)
	if err != nil {
		if _, ok := status.FromError(err); ok {
			return nil, err
		}
		s.log.Warn("health check: connect failed", "connection_id", conn.GetId(), "error", err)
		resp.Detail = "server unreachable"
		s.reportHealth(ctx, conn.GetId(), false, resp.Detail)
		return resp, nil
	}
	defer ss.close()
	start := time.Now()
	if err := ss.cs.Ping(ctx, nil); err != nil {
		s.log.Warn("health check: ping failed", "connection_id", conn.GetId(), "error", err)
		resp.Detail = "ping failed"
		s.reportHealth(ctx, conn.GetId(), false, resp.Detail)
		return resp, nil
	}
	resp.Healthy = true
	resp.LatencyMs = time.Since(start).Milliseconds()
	resp.Detail = "ping answered"
	s.reportHealth(ctx, conn.GetId(), true, resp.Detail)
	return resp, nil
}
