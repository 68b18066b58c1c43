package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"

	"github.com/v0m3/v0m3/internal/stranger"
)

// Profiling serves Go's runtime profiles (net/http/pprof, under
// /debug/pprof/) on addr until ctx ends, and returns the address it
// listens on. It is off unless a command's --pprof flag asks for it: the
// profiles show what the process is doing, so they get a listener of their
// own on a loopback address, never the gRPC port, and any other address is
// refused.
func Profiling(ctx context.Context, addr string, log *slog.Logger) (net.Addr, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("pprof address %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, fmt.Errorf("pprof address %q: profiles are served on a loopback address only (e.g. 127.0.0.1:6060)", addr)
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("pprof: listen on %s: %w", addr, err)
	}
	if tcp, ok := lis.Addr().(*net.TCPAddr); !ok || !tcp.IP.IsLoopback() {
		_ = lis.Close()
		return nil, fmt.Errorf("pprof address %q resolved to %s, which is not loopback", addr, lis.Addr())
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	serveHTTP(ctx, lis, mux, "pprof", log)
	log.Info("serving runtime profiles", "addr", "http://"+lis.Addr().String()+"/debug/pprof/")
	return lis.Addr(), nil
}

// serveHTTP serves mux on lis, a listener of its own beside the gRPC
// port, until ctx ends.
func serveHTTP(ctx context.Context, lis net.Listener, mux *http.ServeMux, what string, log *slog.Logger) {
	srv := stranger.HTTPServer(mux)
	go func() {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn(what+" server stopped", "err", err)
		}
	}()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
}
