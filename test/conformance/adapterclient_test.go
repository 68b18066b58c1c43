package conformance_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/adapter"
	"github.com/v0m3/v0m3/test/conformance"
)

// The adapter's side of the client scenarios: this test binary, started by
// the conformance runner with the scenario's server URL as its last
// argument, drives the adapter's real client path through its exported API
// only, as the orchestrator does: Discover (initialize and every list),
// then Execute for each tool call the scenario expects. The registry the
// adapter reads the connection from is in process (it is not what is under
// test); the MCP traffic is real.

// connectionID is the one connection the client registers.
const connectionID = "conn_conformance"

// oneConnection is the registry the adapter reads: one approved streamable
// HTTP connection to the scenario's server.
type oneConnection struct {
	registryv1.UnimplementedRegistryServiceServer
	conn *registryv1.Connection
}

func (r *oneConnection) GetConnection(_ context.Context, req *registryv1.GetConnectionRequest) (*registryv1.Connection, error) {
	if req.GetId() != r.conn.GetId() {
		return nil, status.Error(codes.NotFound, "no such connection")
	}
	return proto.CloneOf(r.conn), nil
}

func (r *oneConnection) RecordSnapshot(_ context.Context, req *registryv1.RecordSnapshotRequest) (*registryv1.DiscoverySnapshot, error) {
	s := proto.CloneOf(req.GetSnapshot())
	s.Id = "snap_1"
	return s, nil
}

// runAdapterClient is the client command; it returns the exit code.
func runAdapterClient(url, scenario string, ctxJSON string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithTimeout(context.Background(), conformance.ClientDeadline)
	defer cancel()
	ctx = testkit.AsService(ctx, identity.Orchestrator)

	base, err := os.MkdirTemp("", "v0m3-conformance-client-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer os.RemoveAll(base)
	// The adapter works in base/work and reads the connection's secret
	// from its directory under its default credential root,
	// base/credentials.
	workDir, credDir := filepath.Join(base, "work"), filepath.Join(base, "credentials", connectionID)
	if err := os.MkdirAll(credDir, 0o700); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	oauth, err := oauthFor(scenario, ctxJSON, credDir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	reg := &oneConnection{conn: &registryv1.Connection{
		Id: connectionID, DisplayName: "conformance", ConfigRevision: 1,
		State:       registryv1.ConnectionState_CONNECTION_STATE_ACTIVE,
		ReviewState: registryv1.ReviewState_REVIEW_STATE_APPROVED,
		Transport: &registryv1.Transport{Kind: &registryv1.Transport_StreamableHttp{StreamableHttp: &registryv1.StreamableHTTPTransport{
			Url: url, Oauth: oauth}}},
	}}
	lis := bufconn.Listen(1 << 20)
	g := grpc.NewServer()
	registryv1.RegisterRegistryServiceServer(g, reg)
	go func() { _ = g.Serve(lis) }()
	defer g.Stop()
	cc, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer cc.Close()
	a := adapter.NewServer(adapter.Deps{
		Registry:          registryv1.NewRegistryServiceClient(cc),
		WorkDir:           workDir,
		AllowLoopback:     true, // the runner's servers listen on loopback
		InsecureUngranted: true, // no orchestrator here to sign grants
	}, log)
	defer a.Close()

	snap, err := a.Discover(ctx, &adapterv1.DiscoverRequest{ConnectionId: connectionID})
	if err != nil {
		fmt.Fprintf(os.Stderr, "adapter Discover: %v\n", err)
		return 1
	}
	failed := false
	for i, call := range callsFor(scenario, snap, ctxJSON) {
		args, err := structpb.NewStruct(call.args)
		if err != nil {
			fmt.Fprintf(os.Stderr, "arguments for %s: %v\n", call.name, err)
			return 2
		}
		kind := registryv1.RemoteKind_REMOTE_KIND_TOOL
		if call.resource {
			kind, args = registryv1.RemoteKind_REMOTE_KIND_RESOURCE, nil
		}
		resp, err := a.Execute(ctx, &adapterv1.ExecuteRequest{
			ConnectionId: connectionID, ConfigRevision: 1,
			MappingId: "map_conformance", MappingRevision: 1,
			AttemptId:  fmt.Sprintf("att_%d", i+1),
			SnapshotId: snap.GetId(),
			Target:     &registryv1.RemoteTarget{Kind: kind, Name: call.name},
			Arguments:  args,
			Limits:     &registryv1.Limits{MaxResponseBytes: 1 << 20, MaxItems: 100, Elicitation: call.elicitation},
		})
		if err != nil {
			fmt.Fprintf(os.Stderr, "adapter Execute %s: %v\n", call.name, err)
			failed = failed || call.required
			continue
		}
		fmt.Fprintf(os.Stderr, "adapter Execute %s: outcome %s, stage %s, error %s\n", call.name, resp.GetOutcome(), resp.GetStage(), resp.GetError().GetSafeCode())
		if resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
			failed = failed || call.required
		}
	}
	if failed {
		return 1
	}
	return 0
}

// conformanceClientMetadata is the client ID metadata document URL the
// runner's authorization servers accept (as the go-sdk's client uses it).
const conformanceClientMetadata = "https://conformance-test.local/client-metadata.json"

// oauthFor is the connection's OAuth block in an auth scenario, as an
// operator would configure it: for the authorization code scenarios a
// pre-consented client (the runner's authorization server redirects at
// once) identified by a metadata document, by dynamic registration, or by
// the pre-registered client the scenario's context names; for the client
// credentials scenarios the context's client. A secret is written to a
// file and referenced, as in production. Everything else (discovery,
// issuer checks, grants, step-up) is the adapter's.
func oauthFor(scenario, ctxJSON, dir string) (*registryv1.OAuthClient, error) {
	if !strings.HasPrefix(scenario, "auth/") {
		return nil, nil
	}
	var c struct {
		ClientID     string `json:"client_id"`
		ClientSecret string `json:"client_secret"`
		Issuer       string `json:"issuer"`
	}
	if ctxJSON != "" {
		if err := json.Unmarshal([]byte(ctxJSON), &c); err != nil {
			return nil, fmt.Errorf("scenario context: %w", err)
		}
	}
	o := &registryv1.OAuthClient{ClientId: c.ClientID, Issuer: c.Issuer}
	if c.ClientSecret != "" {
		path := filepath.Join(dir, "client-secret")
		if err := os.WriteFile(path, []byte(c.ClientSecret), 0o600); err != nil {
			return nil, err
		}
		o.ClientSecretRef = "file:" + path
	}
	if strings.HasPrefix(scenario, "auth/client-credentials") {
		o.Grant = registryv1.OauthGrant_OAUTH_GRANT_CLIENT_CREDENTIALS
		return o, nil
	}
	o.Grant = registryv1.OauthGrant_OAUTH_GRANT_AUTHORIZATION_CODE
	o.RedirectUrl = "http://localhost:3000/callback"
	o.ClientIdMetadataUrl = conformanceClientMetadata
	o.DynamicRegistration = true
	return o, nil
}

// call is one tool call (or resource read) a scenario expects.
type call struct {
	name     string
	args     map[string]any
	resource bool
	required bool // the scenario fails without it
	// elicitation is the mapping's elicitation policy (a reviewer's
	// choice, not the adapter's).
	elicitation registryv1.ElicitationPolicy
}

// callsFor lists what the go-sdk's own conformance client does in each
// scenario after connecting, with what the adapter discovered.
func callsFor(scenario string, snap *registryv1.DiscoverySnapshot, ctxJSON string) []call {
	tool := func(name string) *registryv1.ToolIdentity {
		for _, t := range snap.GetTools() {
			if t.GetName() == name {
				return t
			}
		}
		return nil
	}
	switch scenario {
	case "tools_call":
		return []call{{name: "add_numbers", args: map[string]any{"a": 5, "b": 3}, required: true}}
	case "sse-retry":
		return []call{{name: "test_reconnection", args: map[string]any{}, required: true}}
	case "elicitation-sep1034-client-defaults":
		// The scenario wants the client to accept the server's form with
		// its defaults: the adapter does only under a mapping a reviewer
		// approved with ELICITATION_POLICY_ACCEPT_DEFAULTS, as here.
		return []call{{name: "test_client_elicitation_defaults", args: map[string]any{}, required: true,
			elicitation: registryv1.ElicitationPolicy_ELICITATION_POLICY_ACCEPT_DEFAULTS}}
	case "json-schema-2020-12-preservation":
		t := tool("json_schema_2020_12_tool")
		if t == nil {
			return nil
		}
		return []call{{name: "json_schema_echo", args: map[string]any{"schema": t.GetInputSchema().AsMap()}, required: true}}
	case "sep-2322-client-request-state":
		// The input_required rounds are answered "decline" (echoing the
		// request state, as the scenario checks); those calls end with
		// USER_INPUT_REQUIRED, so none is required to succeed.
		var calls []call
		for _, n := range []string{"test_mrtr_echo_state", "test_mrtr_no_state", "test_mrtr_unrelated", "test_mrtr_no_result_type"} {
			calls = append(calls, call{name: n, args: map[string]any{}})
		}
		return calls
	case "http-standard-headers":
		var calls []call
		if len(snap.GetTools()) > 0 {
			calls = append(calls, call{name: snap.GetTools()[0].GetName(), args: map[string]any{}})
		}
		if len(snap.GetResources()) > 0 {
			calls = append(calls, call{name: snap.GetResources()[0].GetUri(), resource: true})
		}
		return calls
	case "http-custom-headers":
		var c struct {
			ToolCalls []struct {
				Name      string         `json:"name"`
				Arguments map[string]any `json:"arguments"`
			} `json:"toolCalls"`
		}
		_ = json.Unmarshal([]byte(ctxJSON), &c)
		var calls []call
		for _, tc := range c.ToolCalls {
			calls = append(calls, call{name: tc.Name, args: tc.Arguments})
		}
		return calls
	case "http-invalid-tool-headers":
		var calls []call
		for _, t := range snap.GetTools() {
			calls = append(calls, call{name: t.GetName(), args: map[string]any{"region": "us-west1"}})
		}
		return calls
	}
	if strings.HasPrefix(scenario, "auth/") {
		// As the go-sdk's client: list, then call the scenario's tool.
		return []call{{name: "test-tool", args: map[string]any{}, required: true}}
	}
	return nil // initialize, request-metadata, json-schema-ref-no-deref: connecting is the scenario
}
