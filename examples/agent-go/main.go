// Command agent-go is an MCP agent pointed at one V0M3 task: it connects
// to the task's MCP endpoint with the task's token, lists the tools the
// task was offered, calls one and prints what came back, text and
// resource links.
//
// It stands in for a model: it fills each handle field with the first
// handle the tool's schema offers (handles are opaque choices titled with
// their labels; the agent never sees a URI) and takes the other arguments
// from -args.
//
//	source "${TMPDIR:-/tmp}/v0m3-walkthrough-$(id -u)/agent.env"   # written by scripts/walkthrough.sh
//	go run ./examples/agent-go -ca .v0m3-data/pki/ca.crt
//
// The URL and token come from StartTask with mcp_access (or MintMcpToken);
// the CA is the one `v0m3 dev` made.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "agent-go:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("agent-go", flag.ContinueOnError)
	url := fs.String("url", os.Getenv("V0M3_MCP_URL"), "the task's MCP endpoint (V0M3_MCP_URL)")
	token := fs.String("token", os.Getenv("V0M3_MCP_TOKEN"), "the task's MCP token, v0m3tt_… (V0M3_MCP_TOKEN)")
	caFile := fs.String("ca", envOr("V0M3_TLS_CA_FILE", ".v0m3-data/pki/ca.crt"), "PEM CA the endpoint's certificate chains to (V0M3_TLS_CA_FILE)")
	tool := fs.String("tool", "", "the tool to call (default: the first one offered)")
	rawArgs := fs.String("args", `{"query":"migration"}`, "JSON arguments besides handle fields")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *url == "" || *token == "" {
		return errors.New("the task's endpoint is needed: -url and -token (or V0M3_MCP_URL and V0M3_MCP_TOKEN), from StartTask with mcp_access")
	}
	var callArgs map[string]any
	if err := json.Unmarshal([]byte(*rawArgs), &callArgs); err != nil {
		return fmt.Errorf("-args: %w", err)
	}
	hc, err := httpClient(*caFile, *token)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()

	client := mcp.NewClient(&mcp.Implementation{Name: "v0m3-example-agent-go", Version: "1"}, nil)
	// MaxRetries -1: a refused request is reported, not retried.
	session, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: *url, HTTPClient: hc, MaxRetries: -1}, nil)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", *url, err)
	}
	defer session.Close()
	fmt.Fprintf(out, "connected to %s (protocol %s)\n", session.InitializeResult().ServerInfo.Name, session.InitializeResult().ProtocolVersion)

	tools, err := session.ListTools(ctx, nil)
	if err != nil {
		return fmt.Errorf("tools/list: %w", err)
	}
	var chosen *mcp.Tool
	for _, t := range tools.Tools {
		fmt.Fprintf(out, "tool: %s: %s\n", t.Name, t.Description)
		if chosen == nil && (*tool == "" || t.Name == *tool) {
			chosen = t
		}
	}
	if chosen == nil {
		return fmt.Errorf("the task offers no tool %q", *tool)
	}
	if err := fillHandles(chosen, callArgs); err != nil {
		return err
	}

	res, err := session.CallTool(ctx, &mcp.CallToolParams{Name: chosen.Name, Arguments: callArgs})
	if err != nil {
		return fmt.Errorf("tools/call %s: %w", chosen.Name, err)
	}
	fmt.Fprintf(out, "called %s (error: %v)\n", chosen.Name, res.IsError)
	for _, c := range res.Content {
		switch c := c.(type) {
		case *mcp.TextContent:
			fmt.Fprintf(out, "text: %s\n", c.Text)
		case *mcp.ResourceLink:
			fmt.Fprintf(out, "resource link: %s (%s)\n", c.URI, c.Name)
		default:
			b, _ := json.Marshal(c)
			fmt.Fprintf(out, "content: %s\n", b)
		}
	}
	if res.IsError {
		return errors.New("the call was refused (the text says why and what to do)")
	}
	return nil
}

// fillHandles sets each handle field the tool's schema offers (a property
// whose oneOf lists the task's handles) to its first handle, unless args
// already has it: what a model would pick from its catalogue.
func fillHandles(t *mcp.Tool, args map[string]any) error {
	raw, err := json.Marshal(t.InputSchema)
	if err != nil {
		return err
	}
	var schema struct {
		Properties map[string]struct {
			OneOf []struct {
				Const string `json:"const"`
				Title string `json:"title"`
			} `json:"oneOf"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(raw, &schema); err != nil {
		return fmt.Errorf("%s's input schema: %w", t.Name, err)
	}
	for field, p := range schema.Properties {
		if _, set := args[field]; !set && len(p.OneOf) > 0 {
			args[field] = p.OneOf[0].Const
		}
	}
	return nil
}

// httpClient trusts the CA in caFile and presents the task token on every
// request: the endpoint is stateless, each request is authenticated alone.
func httpClient(caFile, token string) (*http.Client, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("read the CA: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate", caFile)
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}
	return &http.Client{Transport: bearer{token: token, next: tr}}, nil
}

// bearer adds the task token to each request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
