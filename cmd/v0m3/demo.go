package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/v0m3/v0m3/demo/fixture/fixturedirect"
	"github.com/v0m3/v0m3/demo/scenario"
	"github.com/v0m3/v0m3/suite"
)

// runDemo starts the suite on the embedded store, runs the first
// experiment with this binary as the fixture MCP server over stdio, and
// prints each stage.
func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("demo", stderr)
	dataDir := fs.String("data-dir", "", "directory for the embedded stores (default: a new temporary directory)")
	logLevel := fs.String("log-level", "warn", "service log level: debug, info, warn or error")
	if err := parse(fs, args); err != nil {
		return err
	}
	log, err := newLogger(stderr, *logLevel)
	if err != nil {
		return err
	}
	dir := *dataDir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "v0m3-demo-"); err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		defer os.RemoveAll(dir)
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("demo: locate own binary for the fixture server: %w", err)
	}
	s, err := suite.Start(ctx, suite.Config{DataDir: dir, Log: log, Direct: fixturedirect.Sources()})
	if err != nil {
		return err
	}
	defer s.Close()
	fmt.Fprintf(stdout, "V0M3 Boundary demo: five services over gRPC on loopback, embedded store in %s\n", dir)
	r, err := scenario.Run(ctx, s.Clients, scenario.Config{Transport: scenario.StdioFixture(exe), Out: stdout, As: s.As})
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	if r.ExportRefusal == nil || r.ForeignHandle == nil || r.UnknownField == nil || r.SelfReview == nil || r.Anonymous == nil || r.Unreviewed == nil {
		return fmt.Errorf("demo: a request that must be refused was accepted")
	}
	fmt.Fprintln(stdout, "demo complete: discovered, registered, offered, requested, executed, observed, refused")
	return nil
}
