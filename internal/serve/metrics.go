package serve

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"

	"github.com/v0m3/v0m3/internal/telemetry"
)

// Metrics serves the process's Prometheus metrics (telemetry.Handler) on
// /metrics at addr, a listener of its own (never the gRPC port), until ctx
// ends, and returns the address it listens on. Empty addr serves nothing.
// Metrics hold no secrets or ids, so unlike profiles any address is
// allowed: the chart exposes it to Prometheus in-cluster.
func Metrics(ctx context.Context, addr string, log *slog.Logger) (net.Addr, error) {
	if addr == "" {
		return nil, nil
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: listen on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", telemetry.Handler())
	serveHTTP(ctx, lis, mux, "metrics", log)
	log.Info("serving metrics", "addr", "http://"+lis.Addr().String()+"/metrics")
	return lis.Addr(), nil
}
