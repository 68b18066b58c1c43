package serve

import (
	"context"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// WatchDependency reports the server NOT_SERVING while check fails and
// SERVING once it passes again, checking every interval until ctx ends.
// Services whose state lives in a shared store (Redis) use it so that a
// load balancer stops sending them calls they could only answer with an
// error: they never answer from a stale copy instead.
//
// The status is set on every check, not only on changes, so it also
// overrides the SERVING that Serve sets when it starts.
func (s *Server) WatchDependency(ctx context.Context, interval time.Duration, check func(context.Context) error) {
	t := time.NewTicker(interval)
	defer t.Stop()
	healthy := true
	for {
		err := check(ctx)
		if ctx.Err() != nil {
			return
		}
		status := healthpb.HealthCheckResponse_SERVING
		if err != nil {
			status = healthpb.HealthCheckResponse_NOT_SERVING
		}
		switch {
		case err != nil && healthy:
			s.log.Warn("store unreachable or unusable; reporting NOT_SERVING", "service", s.name, "error", err)
		case err == nil && !healthy:
			s.log.Info("store usable again; reporting SERVING", "service", s.name)
		}
		healthy = err == nil
		s.Health.SetServingStatus("", status)
		for svc := range s.GRPC.GetServiceInfo() {
			s.Health.SetServingStatus(svc, status)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
