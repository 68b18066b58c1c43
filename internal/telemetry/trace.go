// Package telemetry owns what V0M3 tells operators about itself while it
// runs: OpenTelemetry traces (gRPC instrumentation from the contrib
// library, W3C trace context carried into MCP requests, OTLP export only
// when OTEL_EXPORTER_OTLP_ENDPOINT is set) and Prometheus metrics (one
// registry per process, served on a port of its own).
//
// Nothing here records an argument value, a credential or a free-form
// remote text: span attributes and metric labels are ids, declared names
// and bounded enumerations.
package telemetry

import (
	"context"
	"fmt"
	"net/http"
	"os"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc/filters"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
)

// propagator is the one context format V0M3 sends and accepts: W3C trace
// context. Baggage is deliberately not propagated: it would carry
// caller-chosen text into every hop and every MCP server.
var propagator propagation.TextMapPropagator = propagation.TraceContext{}

// EndpointEnv is the standard OpenTelemetry variable that turns export on.
const EndpointEnv = "OTEL_EXPORTER_OTLP_ENDPOINT"

// Setup installs the process's tracer provider for service: an OTLP/gRPC
// exporter configured by the standard OTEL_EXPORTER_OTLP_* variables when
// OTEL_EXPORTER_OTLP_ENDPOINT (or its _TRACES_ form) is set; otherwise it
// installs nothing and spans cost next to nothing (the global no-op
// provider). The returned shutdown flushes spans still buffered.
func Setup(ctx context.Context, service string) (shutdown func(context.Context) error, err error) {
	if os.Getenv(EndpointEnv) == "" && os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
		return func(context.Context) error { return nil }, nil
	}
	exp, err := otlptracegrpc.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("telemetry: OTLP trace exporter: %w", err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName("v0m3-"+service)))
	if err != nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagator)
	return tp.Shutdown, nil
}

// instrumentation is the common otelgrpc configuration: W3C propagation
// only, health checks not traced (load balancers poll them), no OTel
// metrics (Prometheus metrics are this package's own).
func instrumentation(tp trace.TracerProvider) []otelgrpc.Option {
	opts := []otelgrpc.Option{
		otelgrpc.WithPropagators(propagator),
		otelgrpc.WithMeterProvider(noop.NewMeterProvider()),
		otelgrpc.WithFilter(filters.Not(filters.HealthCheck())),
	}
	if tp != nil {
		opts = append(opts, otelgrpc.WithTracerProvider(tp))
	}
	return opts
}

// ServerOption is the stats handler every V0M3 gRPC server uses: one
// server span per RPC, continuing the caller's trace. A nil tp means the
// global provider (see Setup).
func ServerOption(tp trace.TracerProvider) grpc.ServerOption {
	return grpc.StatsHandler(otelgrpc.NewServerHandler(instrumentation(tp)...))
}

// DialOption is the stats handler every V0M3 gRPC client uses: one client
// span per RPC, its context sent to the server. A nil tp means the global
// provider.
func DialOption(tp trace.TracerProvider) grpc.DialOption {
	return grpc.WithStatsHandler(otelgrpc.NewClientHandler(instrumentation(tp)...))
}

// InjectHTTP writes ctx's trace context into h (the traceparent header):
// how an MCP request over HTTP joins the governed call's trace.
func InjectHTTP(ctx context.Context, h http.Header) {
	propagator.Inject(ctx, propagation.HeaderCarrier(h))
}

// InjectMeta writes ctx's trace context into an MCP request's _meta map
// (traceparent, as the MCP trace-context convention names it): a server
// behind a transport without headers (stdio) can still join the trace.
// Nothing is written when ctx carries no valid span.
func InjectMeta(ctx context.Context, meta map[string]any) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	c := propagation.MapCarrier{}
	propagator.Inject(ctx, c)
	for k, v := range c {
		meta[k] = v
	}
}

// TraceID returns the OpenTelemetry trace id of ctx's span (32 hex
// digits), or "" when ctx carries none.
func TraceID(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return ""
	}
	return sc.TraceID().String()
}
