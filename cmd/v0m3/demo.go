package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/v0m3/v0m3/demo/fixture/fixturedirect"
	"github.com/v0m3/v0m3/demo/scenario"
	"github.com/v0m3/v0m3/suite"
)

// demoLogFile is the file, in the demo's data directory, that receives the
// services' structured logs: the story on stdout stays free of log lines
// (a refused call is part of the story, and its WARN line would interrupt
// it), and the log is still there to read afterwards.
const demoLogFile = "v0m3.log"

// runDemo starts the suite on the embedded store, runs the first
// experiment with this binary as the fixture MCP server over stdio, and
// prints each stage, where its data and log went, and what to try next.
func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("demo", stderr)
	dataDir := fs.String("data-dir", "", "directory for the embedded stores, certificates and the service log (default: a new temporary directory, kept and named at the end)")
	logLevel := fs.String("log-level", "info", "level of the service log written to "+demoLogFile+" in the data directory: debug, info, warn or error")
	if err := parse(fs, args); err != nil {
		return err
	}
	dir := *dataDir
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "v0m3-demo-"); err != nil {
			return fmt.Errorf("demo: %w", err)
		}
	} else if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("demo: data directory: %w", err)
	}
	logPath := filepath.Join(dir, demoLogFile)
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("demo: service log: %w", err)
	}
	defer logFile.Close()
	log, err := newLogger(logFile, *logLevel)
	if err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("demo: locate own binary for the fixture server: %w", err)
	}
	s, err := suite.Start(ctx, suite.Config{DataDir: dir, Log: log, Direct: fixturedirect.Sources()})
	if err != nil {
		return fmt.Errorf("demo: start the services (their log: %s): %w", logPath, err)
	}
	defer s.Close()
	fmt.Fprintf(stdout, "V0M3 Boundary demo: five services over gRPC on loopback, embedded store in %s\n", dir)
	fmt.Fprintf(stdout, "(the services' log goes to %s, not here)\n", logPath)
	r, err := scenario.Run(ctx, s.Clients, scenario.Config{Transport: scenario.StdioFixture(exe), Out: stdout, As: s.As})
	if err != nil {
		return fmt.Errorf("demo: %w (the services' log: %s)", err, logPath)
	}
	if r.ExportRefusal == nil || r.ForeignHandle == nil || r.UnknownField == nil || r.SelfReview == nil || r.Anonymous == nil || r.Unreviewed == nil {
		return fmt.Errorf("demo: a request that must be refused was accepted (the services' log: %s)", logPath)
	}
	fmt.Fprintln(stdout, "demo complete: discovered, registered, offered, requested, executed, observed, refused")
	printDemoNext(stdout, dir, logPath)
	return nil
}

// printDemoNext ends the story: where its data went and what to try next.
func printDemoNext(w io.Writer, dir, logPath string) {
	fmt.Fprintf(w, `
where it went:
  data:         %s (the five services' embedded stores, certificates, assets)
  service log:  %s (JSON lines)
  remove both:  rm -rf %s

next:
  make run                  serve the five services in one process, data in ./.v0m3-data, until Ctrl-C
  scripts/walkthrough.sh    then, in a second terminal: this story one call at a time, as the people who take it
  README.md and docs/       how it works, the API and its errors, running it on Kubernetes
`, dir, logPath, dir)
}
