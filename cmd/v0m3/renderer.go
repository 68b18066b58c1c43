package main

import (
	"context"
	"io"

	"github.com/v0m3/v0m3/demo/fixture/renderer"
)

// runRenderer serves the synthetic "V0M3 Renderer" MCP server.
func runRenderer(ctx context.Context, args []string, stderr io.Writer) error {
	fs := newFlags("fixture-renderer", stderr)
	transport := fs.String("transport", "stdio", "stdio or http (streamable HTTP at /mcp)")
	addr := fs.String("addr", "127.0.0.1:0", "listen address for --transport http")
	var opts renderer.Options
	fs.StringVar(&opts.WorkDir, "work-dir", "", "directory for artifacts and request records (required; shared by every process of one renderer)")
	fs.StringVar(&opts.CallLog, "call-log", "", "append one JSON line per tool call and per render performed to this file")
	fs.DurationVar(&opts.Delay, "delay", 0, "wait this long after an artifact is durable before replying (holds an attempt open)")
	fs.StringVar(&opts.Mode, "mode", renderer.ModeNormal, "normal, crash-after-render (exit after the artifact is durable, before replying) or down (exit before serving)")
	fs.StringVar(&opts.DownIfExists, "down-if-exists", "", "behave as --mode down while this file exists")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *transport != "stdio" && *transport != "http" {
		return usageError{"--transport must be stdio or http"}
	}
	if opts.WorkDir == "" {
		return usageError{"--work-dir is required"}
	}
	return renderer.Run(ctx, opts, *transport, *addr)
}
