// Package serve runs a V0M3 gRPC server: the service's API plus
// grpc.health.v1 and server reflection, on one listener, with structured
// logs and a graceful stop.
package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/v0m3/v0m3/internal/bounds"
	"github.com/v0m3/v0m3/internal/fieldbehavior"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/stranger"
	"github.com/v0m3/v0m3/internal/telemetry"
)

// MaxMessageBytes bounds every gRPC message a V0M3 server or client (see
// Dial) sends or receives. It holds the largest result a mapping may allow
// (64 MiB, the adapter's cap on max_response_bytes) with its envelope, so
// whatever a mapping allows arrives, on every hop, instead of failing on
// gRPC's 4 MB default; a test in the adapter keeps the two in step.
const MaxMessageBytes = 72 << 20

// Flow-control windows, fixed on both ends of every connection. A fixed
// window turns off gRPC's bandwidth-delay estimator, which pings the
// peer (and is pinged back) on nearly every message when calls are
// sparse: four extra frames, each a TLS write and a wakeup, per internal
// call. The sizes bound one stream's and one connection's bytes in
// flight; on a cluster network they are well above what a round trip
// carries.
const (
	streamWindow = 4 << 20
	connWindow   = 16 << 20
)

// streamWorkers is the number of goroutines each server keeps for
// incoming RPCs: a few per CPU, since a governed call holds some RPCs open
// while it waits on others.
func streamWorkers() uint32 { return uint32(4 * runtime.GOMAXPROCS(0)) }

// Server is one gRPC server with health and reflection registered.
type Server struct {
	GRPC   *grpc.Server
	Health *health.Server
	name   string
	log    *slog.Logger
}

// New returns a server for the named service, guarded by guard: with its
// credentials it serves TLS, and every RPC is admitted by the access table,
// then bounded by the service's declared limits (bounds.UnaryServer,
// bounds.StreamServer), then refused if it misses a field its contract
// marks REQUIRED (fieldbehavior), before its handler runs. Every RPC is counted in
// the process's metrics (telemetry.UnaryServer), refusals included. extra adds server options,
// e.g. telemetry.ServerOption for traces, which the suite always passes.
// Register the service's API on s.GRPC before calling Serve.
func New(name string, log *slog.Logger, guard *identity.Guard, extra ...grpc.ServerOption) *Server {
	opts := []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(telemetry.UnaryServer(name), logUnary(name, log), guard.Unary(), bounds.UnaryServer(), fieldbehavior.UnaryServer()),
		grpc.ChainStreamInterceptor(guard.Stream(), bounds.StreamServer(), fieldbehavior.StreamServer()),
		grpc.MaxRecvMsgSize(MaxMessageBytes), grpc.MaxSendMsgSize(MaxMessageBytes),
		// Metadata is read before anyone is authenticated (health answers
		// anyone): a stranger's megabyte header is refused, not read.
		grpc.MaxHeaderListSize(stranger.MaxGRPCHeaderBytes),
		// Workers keep their grown stacks between RPCs; a goroutine per
		// RPC grew its stack anew each time (runtime.morestack was about
		// 6 % of a governed call's CPU). A stream that finds every worker
		// busy still gets its own goroutine.
		grpc.NumStreamWorkers(streamWorkers()),
		grpc.StaticStreamWindowSize(streamWindow), grpc.StaticConnWindowSize(connWindow),
	}
	opts = append(opts, extra...)
	if guard.Creds != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(guard.Creds.ServerTLS())))
	}
	g := grpc.NewServer(opts...)
	h := health.NewServer()
	healthpb.RegisterHealthServer(g, h)
	reflection.Register(g)
	return &Server{GRPC: g, Health: h, name: name, log: log}
}

// Serve marks the service SERVING and serves on lis until ctx ends, then
// stops gracefully (bounded by 5 seconds).
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	s.Health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	for svc := range s.GRPC.GetServiceInfo() {
		s.Health.SetServingStatus(svc, healthpb.HealthCheckResponse_SERVING)
	}
	s.log.Info("serving", "service", s.name, "addr", lis.Addr().String())
	errc := make(chan error, 1)
	go func() { errc <- s.GRPC.Serve(lis) }()
	select {
	case err := <-errc:
		if errors.Is(err, grpc.ErrServerStopped) {
			return nil
		}
		return fmt.Errorf("serve %s: %w", s.name, err)
	case <-ctx.Done():
	}
	s.Health.Shutdown()
	done := make(chan struct{})
	go func() { s.GRPC.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		s.GRPC.Stop()
	}
	return nil
}

// Dial returns a client connection to a V0M3 service at addr (host:port),
// sending and receiving messages up to MaxMessageBytes, with the given options (identity.PeerDialOptions for a service calling a
// peer, identity.CallerDialOptions for a product or admin caller).
func Dial(addr string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	opts = append([]grpc.DialOption{grpc.WithDefaultCallOptions(
		grpc.MaxCallRecvMsgSize(MaxMessageBytes), grpc.MaxCallSendMsgSize(MaxMessageBytes)),
		grpc.WithStaticStreamWindowSize(streamWindow), grpc.WithStaticConnWindowSize(connWindow)}, opts...)
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	return conn, nil
}

// logUnary logs each call's method, code and duration. It never logs
// request or response bodies: they may carry arguments a person did not
// mean to have recorded.
func logUnary(name string, log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		lvl := slog.LevelDebug
		if err != nil {
			lvl = slog.LevelInfo
		}
		log.Log(ctx, lvl, "rpc", "service", name, "method", info.FullMethod, "code", codeOf(err), "duration", time.Since(start))
		return resp, err
	}
}

func codeOf(err error) string {
	if err == nil {
		return "OK"
	}
	if se, ok := err.(interface{ GRPCStatus() *status.Status }); ok {
		return se.GRPCStatus().Code().String()
	}
	return "Unknown"
}
