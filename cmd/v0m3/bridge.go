package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/v0m3/v0m3/internal/stranger"
	"github.com/v0m3/v0m3/operator/bridge"
)

// runBridge serves a stdio MCP server over streamable HTTP, running the
// command after "--" as a child per session; or, with --install, copies
// this binary into a directory (the init container of a stdio MCPServer).
func runBridge(ctx context.Context, args []string, stderr io.Writer) error {
	var command []string
	if i := slices.Index(args, "--"); i >= 0 {
		args, command = args[:i], args[i+1:]
	}
	fs := newFlags("bridge", stderr)
	listen := fs.String("listen", ":8080", "listen address")
	path := fs.String("path", "/mcp", "MCP endpoint path")
	install := fs.String("install", "", "copy this binary into DIR and exit (init container)")
	maxSessions := fs.Int("max-sessions", bridge.DefaultMaxSessions, "concurrent sessions (each runs its own child)")
	idle := fs.Duration("session-idle-timeout", bridge.DefaultIdleTimeout, "end a session (and stop its child) after this long without a request in progress")
	allowedHosts := fs.String("allowed-hosts", "", "comma-separated host names clients may use in Host and Origin (loopback and the --listen host are always allowed; others get 403, against DNS rebinding)")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: v0m3 bridge [flags] -- COMMAND [ARGS...]\n       v0m3 bridge --install DIR")
		fs.PrintDefaults()
	}
	if err := parse(fs, args); err != nil {
		return err
	}
	log, err := newLogger(stderr, *level)
	if err != nil {
		return err
	}
	if *install != "" {
		dst, err := bridge.Install(*install)
		if err != nil {
			return err
		}
		log.Info("bridge installed", "path", dst)
		return nil
	}
	if len(command) == 0 {
		return usageError{"bridge: the server's command goes after --"}
	}
	hosts := strings.Split(*allowedHosts, ",")
	if h, _, err := net.SplitHostPort(*listen); err == nil && h != "" {
		hosts = append(hosts, h) // a wildcard listen address ("", 0.0.0.0) names no host
	}
	b, err := bridge.New(bridge.Options{Command: command, MaxSessions: *maxSessions, IdleTimeout: *idle,
		AllowedHosts: hosts, Log: log, Stderr: stderr})
	if err != nil {
		return err
	}
	defer b.Close()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle(*path, b)
	srv := stranger.HTTPServer(mux)
	log.Info("bridge serving", "addr", ln.Addr().String(), "path", *path, "command", command[0])
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}
}
