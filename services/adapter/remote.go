package adapter

import (
	"context"
	"encoding/json"
	"fmt"
	"iter"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The session's remote calls. They are the only way remote text enters the
// adapter: each scrubs every credential the session resolved from what it
// hands out (values and errors), before anything is converted, truncated,
// digested, logged, traced or recorded. A value that cannot be scrubbed is
// not handed out.

// callTool calls a tool.
func (ss *session) callTool(ctx context.Context, params *mcp.CallToolParams) (*mcp.CallToolResult, error) {
	res, err := ss.cs.CallTool(ctx, params)
	if err != nil {
		return nil, ss.creds.err(err)
	}
	return scrubJSON(ss.creds, res)
}

// readResource reads a resource.
func (ss *session) readResource(ctx context.Context, params *mcp.ReadResourceParams) (*mcp.ReadResourceResult, error) {
	res, err := ss.cs.ReadResource(ctx, params)
	if err != nil {
		return nil, ss.creds.err(err)
	}
	return scrubJSON(ss.creds, res)
}

// ping pings the server.
func (ss *session) ping(ctx context.Context) error {
	return ss.creds.err(ss.cs.Ping(ctx, nil))
}

// initializeResult is what the server said when the session started.
func (ss *session) initializeResult() *mcp.InitializeResult {
	init := ss.cs.InitializeResult()
	if init == nil {
		return nil
	}
	out, err := scrubJSON(ss.creds, init)
	if err != nil {
		return &mcp.InitializeResult{}
	}
	return out
}

// tools lists every tool (all pages).
func (ss *session) tools(ctx context.Context) iter.Seq2[*mcp.Tool, error] {
	return scrubbedSeq(ss.creds, ss.cs.Tools(ctx, nil))
}

// resources lists every resource (all pages).
func (ss *session) resources(ctx context.Context) iter.Seq2[*mcp.Resource, error] {
	return scrubbedSeq(ss.creds, ss.cs.Resources(ctx, nil))
}

// resourceTemplates lists every resource template (all pages).
func (ss *session) resourceTemplates(ctx context.Context) iter.Seq2[*mcp.ResourceTemplate, error] {
	return scrubbedSeq(ss.creds, ss.cs.ResourceTemplates(ctx, nil))
}

// prompts lists every prompt (all pages).
func (ss *session) prompts(ctx context.Context) iter.Seq2[*mcp.Prompt, error] {
	return scrubbedSeq(ss.creds, ss.cs.Prompts(ctx, nil))
}

// toolExecution returns a listed tool's execution properties, read from
// the wire by the discovery tap (the client library drops them), scrubbed;
// nil when the listing gave none or the session has no tap.
func (ss *session) toolExecution(name string) (map[string]any, error) {
	tap := ss.m.tap.Load()
	if tap == nil {
		return nil, nil
	}
	raw := tap.executionOf(name)
	if raw == nil {
		return nil, nil
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("tool execution is not a JSON object")
	}
	return scrubJSON(ss.creds, m)
}

func scrubbedSeq[T any](c *credentials, seq iter.Seq2[T, error]) iter.Seq2[T, error] {
	return func(yield func(T, error) bool) {
		for v, err := range seq {
			if err != nil {
				var zero T
				yield(zero, c.err(err))
				return
			}
			v, err = scrubJSON(c, v)
			if !yield(v, err) || err != nil {
				return
			}
		}
	}
}
