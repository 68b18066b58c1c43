// Command v0m3 is the single V0M3 Boundary binary.
//
//	v0m3 registry|policy|evidence|adapter|orchestrator   serve one service
//	v0m3 dev                                             all five in one process
//	v0m3 demo                                            the first experiment, end to end
//	v0m3 fixture-server                                  the synthetic "V0M3 Sources" MCP server
//	v0m3 operator | bridge | rotation                    Kubernetes operator, stdio bridge, rotation state
//	v0m3 capability | profile apply|list|get|deprecate   declared capabilities and task profiles
//	v0m3 settle                                          list unknown outcomes; settle one by hand, with evidence
//	v0m3 fixture-renderer                                the synthetic "V0M3 Renderer" MCP server
//	v0m3 bench                                           a governed call's cost beside a direct one
//
// Every flag has an environment variable (V0M3_<FLAG>, upper case, dashes
// as underscores), so the same binary runs from a shell or a Deployment.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/KimMachineGun/automemlimit/memlimit"

	"github.com/v0m3/v0m3/services/adapter"
)

const usage = `v0m3 — a governed boundary between AI tasks and MCP servers

Usage:
  v0m3 <command> [flags]

Services (each serves gRPC with grpc.health.v1 and reflection):
  registry        connections, config revisions, discovery snapshots, capabilities, mappings
  policy          Cedar authorization, eligibility, budgets, handles
  evidence        source observations and revisions, claim links, traces, receipts
  adapter         MCP transports (stdio, streamable HTTP), discovery, bounded execution
  orchestrator    the product-facing API: tasks, catalogues, requests, approvals

Together:
  dev             run all five services in one process, over real gRPC on loopback
  token           print a development bearer token a running 'v0m3 dev' accepts
  demo            run the seed's first experiment end to end and print each stage
  bench           measure a governed call beside a direct one (p50, p99, calls/s, CPU per call)

Declared definitions (as you, with --token):
  connect         register a remote streamable HTTP MCP server (static credential or OAuth 2.1 client); it awaits review
  capability      apply, list, get or deprecate capabilities: 'v0m3 capability apply -f FILE'
  profile         apply, list, get or deprecate task profiles: 'v0m3 profile apply -f FILE'
  jwks            print the JWKS an OAuth authorization server trusts for token exchange (from the orchestrator's certificate)
  audit           list the audit log of privileged actions ('--jsonl' exports JSON lines)
  settle          list the requests whose outcome is unknown; settle one by hand, with evidence

Kubernetes:
  operator        reconcile MCPServer, Capability and TaskProfile resources into the registry
  bridge          serve a stdio MCP server over streamable HTTP (runs inside MCPServer pods)
  rotation        show credential rotation state across MCPServers (--wait: until rolled out; --token: approvals invalidated)

Fixtures:
  fixture-server  the synthetic "V0M3 Sources" MCP server (stdio or streamable HTTP)
  fixture-renderer the synthetic "V0M3 Renderer" MCP server: idempotent preview rendering

Run 'v0m3 <command> -h' for a command's flags.
`

// governedPath are the commands that serve governed calls: they run with
// tuneRuntime's collector defaults. The operator, the bridge and the CLI
// verbs keep Go's.
var governedPath = map[string]bool{"registry": true, "policy": true, "evidence": true, "adapter": true, "orchestrator": true, "dev": true}

func main() {
	// First thing: this binary is also the adapter's sandbox launcher,
	// re-executed to start each local server under its limits.
	if adapter.IsSandboxLaunch() {
		adapter.RunSandboxLaunch() // never returns
	}
	if len(os.Args) > 1 && governedPath[os.Args[1]] {
		if err := tuneRuntime(memlimit.FromCgroup); err != nil {
			// Only the defaults are lost: the process runs as Go would run it.
			fmt.Fprintln(os.Stderr, "v0m3: memory limit:", err)
		}
	}
	if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil && !errors.Is(err, errHelp) {
		var ue usageError
		if errors.As(err, &ue) {
			fmt.Fprintln(os.Stderr, "v0m3:", err)
			os.Exit(2)
		}
		fmt.Fprintln(os.Stderr, "v0m3:", err)
		os.Exit(1)
	}
}

// errHelp means -h was given: the usage was printed, exit 0.
var errHelp = errors.New("help requested")

type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return usageError{"a command is required"}
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "registry", "policy", "evidence", "adapter", "orchestrator":
		return runService(ctx, cmd, rest, stderr)
	case "dev":
		return runDev(ctx, rest, stdout, stderr)
	case "token":
		return runToken(ctx, rest, stdout, stderr)
	case "demo":
		return runDemo(ctx, rest, stdout, stderr)
	case "bench":
		return runBench(ctx, rest, stdout, stderr)
	case "fixture-server":
		return runFixture(ctx, rest, stderr)
	case "operator":
		return runOperator(ctx, rest, stderr)
	case "bridge":
		return runBridge(ctx, rest, stderr)
	case "rotation":
		return runRotation(ctx, rest, stdout, stderr)
	case "connect":
		return runConnect(ctx, rest, stdout, stderr)
	case "jwks":
		return runJWKS(ctx, rest, stdout, stderr)
	case "capability":
		return runCapability(ctx, rest, stdout, stderr)
	case "audit":
		return runAudit(ctx, rest, stdout, stderr)
	case "profile":
		return runProfile(ctx, rest, stdout, stderr)
	case "settle":
		return runSettle(ctx, rest, stdout, stderr)
	case "fixture-renderer":
		return runRenderer(ctx, rest, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	default:
		fmt.Fprint(stderr, usage)
		return usageError{fmt.Sprintf("unknown command %q", cmd)}
	}
}

// newFlags returns a flag set whose defaults come from V0M3_* environment
// variables once parse is called.
func newFlags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("v0m3 "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// parse applies environment defaults, then the command line.
func parse(fs *flag.FlagSet, args []string) error {
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		key := "V0M3_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(key); ok {
			if err := f.Value.Set(v); err != nil && envErr == nil {
				envErr = usageError{fmt.Sprintf("%s=%q: %v", key, v, err)}
			}
		}
	})
	if envErr != nil {
		return envErr
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return errHelp
		}
		return usageError{err.Error()}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("unexpected arguments: %v", fs.Args())}
	}
	return nil
}

// newLogger returns a JSON slog logger at the given level.
func newLogger(w io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, usageError{fmt.Sprintf("log level %q: want debug, info, warn or error", level)}
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l})), nil
}
