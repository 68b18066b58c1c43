package main

import (
	"context"
	"io"

	"github.com/v0m3/v0m3/demo/fixture"
)

// runFixture serves the synthetic "V0M3 Sources" MCP server.
func runFixture(ctx context.Context, args []string, stderr io.Writer) error {
	fs := newFlags("fixture-server", stderr)
	transport := fs.String("transport", "stdio", "stdio or http (streamable HTTP at /mcp)")
	addr := fs.String("addr", "127.0.0.1:0", "listen address for --transport http")
	var opts fixture.Options
	fs.StringVar(&opts.Schema, "schema", "v1", "search tool schema: v1 {query} or v2 {text, filters}")
	fs.StringVar(&opts.Description, "description", "default", "search tool description: default or private")
	fs.IntVar(&opts.NotesRevision, "notes-revision", 1, "revision of the notes library (2 changes one qualification)")
	fs.StringVar(&opts.ToolName, "tool-name", "search", "name of the search tool (renaming it is drift)")
	fs.StringVar(&opts.Library, "library", "a", "a, or b: the same notes under incompatible source URIs")
	fs.StringVar(&opts.CallLog, "call-log", "", "append one JSON line per request received to this file")
	fs.StringVar(&opts.Surface, "surface", "", "resource template and prompts: none, v1, or v2 (redescribed, one more prompt)")
	fs.StringVar(&opts.Annotations, "annotations", "read-only", "search tool annotations: read-only or destructive")
	fs.IntVar(&opts.RedescribeAfterCalls, "redescribe-after-calls", 0, "after this many search calls, change the search tool's description at runtime (sends tools/list_changed); 0 never")
	fs.BoolVar(&opts.Hostile, "hostile", false, "add tools that misbehave (flood, many, binary, slow, crash) for adapter tests")
	fs.StringVar(&opts.UpstreamCredentials, "upstream-credentials", "", "file listing the credentials a simulated upstream accepts, one per line: the server refuses to start with a credential it does not accept, and reads fail while it is not accepted")
	fs.StringVar(&opts.CredentialFile, "credential-file", "", "with --upstream-credentials: the server's credential file (default $V0M3_CREDENTIAL_FILE, as an MCPServer pod has it)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *transport != "stdio" && *transport != "http" {
		return usageError{"--transport must be stdio or http"}
	}
	return fixture.Run(ctx, opts, *transport, *addr)
}
