package suite

import (
	"context"
	"log/slog"
	"net"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/v0m3/v0m3/services/internal/serve"
	"github.com/v0m3/v0m3/services/internal/telemetry"
)

// ServeMetrics serves the process's Prometheus metrics on addr, a port of
// its own, until ctx ends (see serve.Metrics); the commands'
// --metrics-addr flag, off by default, calls it.
func ServeMetrics(ctx context.Context, addr string, log *slog.Logger) (net.Addr, error) {
	return serve.Metrics(ctx, addr, log)
}

// SetupTracing installs the process's tracer provider for service: OTLP
// export when OTEL_EXPORTER_OTLP_ENDPOINT is set, nothing otherwise (see
// telemetry.Setup). The returned func flushes buffered spans.
func SetupTracing(ctx context.Context, service string) (func(context.Context) error, error) {
	return telemetry.Setup(ctx, service)
}

// TelemetryDialOptions are the dial options that trace and time the calls
// of self (a process outside the suite, e.g. the operator) to V0M3
// services.
func TelemetryDialOptions(self string) []grpc.DialOption {
	return []grpc.DialOption{telemetry.DialOption(nil), grpc.WithChainUnaryInterceptor(telemetry.UnaryClient(self))}
}

// MetricCollectors are V0M3's own metrics (without the Go runtime and
// process ones), for a process that serves another registry: the
// operator adds them to controller-runtime's, so its calls to the
// registry are measured on its --metrics-addr.
func MetricCollectors() []prometheus.Collector { return telemetry.Collectors() }
