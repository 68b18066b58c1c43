package adapter

import (
	"context"
	"time"

	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"

	"github.com/v0m3/v0m3/internal/apierror"
)

// A health check is up to healthAttempts probes (each a fresh initialize,
// whose connect is itself retried, and a ping), with backoff between them,
// all within healthTimeout. Only after every probe failed is the
// connection reported DEGRADED to policy, which then stops offering it.
const (
	healthTimeout  = 15 * time.Second
	healthAttempts = 2
)

// Health connects to a connection's server, sends an MCP ping and reports
// the result to policy. An unreachable server is a result, not an error.
func (s *Server) Health(ctx context.Context, req *adapterv1.HealthRequest) (*adapterv1.HealthResponse, error) {
	if req.GetConnectionId() == "" {
		return nil, apierror.InvalidArgument(apierror.ReasonFieldRequired, "connection_id is required",
			apierror.FieldViolation{Field: "connection_id", Description: "required"})
	}
	conn, err := s.connection(ctx, req.GetConnectionId())
	if err != nil {
		return nil, err
	}
	resp := &adapterv1.HealthResponse{ConnectionId: conn.GetId()}
	switch {
	case s.replaying():
		// Nothing is contacted in replay; health is not a recorded call.
		resp.Detail = "replay mode: no server is contacted"
		return resp, nil
	case conn.GetTransport().GetDirect() != nil:
		if _, err := s.directSource(conn); err != nil {
			return nil, err
		}
		resp.Healthy, resp.Detail = true, "direct adapter in process"
		s.reportHealth(ctx, conn.GetId(), true, resp.Detail)
		return resp, nil
	}
	ctx, cancel := context.WithTimeout(ctx, healthTimeout)
	defer cancel()
	backoff := connectBackoff
	for attempt := 1; ; attempt++ {
		ok, detail, latency, err := s.probe(ctx, conn)
		if err != nil {
			return nil, err
		}
		if ok {
			resp.Healthy, resp.Detail, resp.LatencyMs = true, detail, latency
			s.reportHealth(ctx, conn.GetId(), true, detail)
			return resp, nil
		}
		resp.Detail = detail
		if attempt == healthAttempts || ctx.Err() != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff *= 2
	}
	s.log.Warn("health check failed; connection degraded", "connection_id", conn.GetId(), "detail", resp.Detail)
	s.reportHealth(ctx, conn.GetId(), false, resp.Detail)
	return resp, nil
}

// probe runs one initialize + ping on a fresh session. A failure the caller
// must see (registry, credential, shutdown) is returned as err; a server
// that did not answer gives ok=false with a safe detail.
func (s *Server) probe(ctx context.Context, conn *registryv1.Connection) (ok bool, detail string, latencyMs int64, err error) {
	ss, err := s.openSession(ctx, conn, discoveryMessageLimit, nil)
	if err != nil {
		if err := connectError(conn.GetId(), err, ss.m); err != nil {
			return false, "", 0, err
		}
		if pv := unsupportedVersion(err); pv != nil {
			s.log.Warn("health check: protocol version unsupported", "connection_id", conn.GetId(), "server_version", pv.version)
			return false, pv.healthDetail(), 0, nil
		}
		s.log.Warn("health check: connect failed", "connection_id", conn.GetId(), "error", logText(err))
		return false, "server unreachable", 0, nil
	}
	defer ss.close()
	start := time.Now()
	if err := ss.ping(ctx); err != nil {
		s.log.Warn("health check: ping failed", "connection_id", conn.GetId(), "error", logText(err))
		return false, "ping failed", 0, nil
	}
	return true, "initialize and ping answered", time.Since(start).Milliseconds(), nil
}
