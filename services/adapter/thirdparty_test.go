package adapter_test

import (
	"github.com/v0m3/v0m3/internal/identity"

	"context"
	"encoding/json"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/digest"
	"github.com/v0m3/v0m3/internal/grant"
	"github.com/v0m3/v0m3/internal/ids"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/adapter"
	"github.com/v0m3/v0m3/suite"
)

// thirdPartyDir returns the installed third-party servers (see
// testkit.ThirdPartyMCP, which holds the pins).
func thirdPartyDir(t *testing.T) string { return testkit.ThirdPartyMCP(t) }

type thirdParty struct {
	s  *suite.Suite
	ad *adapter.Server
	// orchestrator signs the execution grants these tests send.
	orchestrator *identity.Credentials
}

func startThirdParty(t *testing.T) *thirdParty {
	t.Helper()
	s, err := suite.Start(context.Background(), suite.Config{DataDir: t.TempDir(), Services: []string{suite.Registry, suite.Policy, suite.Evidence}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	peers, err := s.PeerClients(suite.Adapter)
	if err != nil {
		t.Fatal(err)
	}
	// node is the one executable these servers need.
	node, _ := exec.LookPath("node")
	creds, err := s.Credentials(suite.Adapter)
	if err != nil {
		t.Fatal(err)
	}
	ad := adapter.NewServer(adapter.Deps{Registry: peers.Registry, Policy: peers.Policy, Evidence: peers.Evidence, WorkDir: t.TempDir(),
		StdioRoots: []string{node}, Credentials: creds}, slog.New(slog.DiscardHandler))
	t.Cleanup(func() { _ = ad.Close() })
	orch, err := s.Credentials(suite.Orchestrator)
	if err != nil {
		t.Fatal(err)
	}
	return &thirdParty{s: s, ad: ad, orchestrator: orch}
}

// connect registers a node server and discovers it.
func (tp *thirdParty) connect(t *testing.T, name string, args ...string) (*registryv1.Connection, *registryv1.DiscoverySnapshot) {
	t.Helper()
	return tp.connectEnv(t, name, nil, args...)
}

// connectEnv is connect with a (non-secret) environment for the server.
func (tp *thirdParty) connectEnv(t *testing.T, name string, env map[string]string, args ...string) (*registryv1.Connection, *registryv1.DiscoverySnapshot) {
	t.Helper()
	node, _ := exec.LookPath("node")
	ctx := tp.s.As(context.Background(), "integrator@adapter-tests", "platform")
	conn, err := tp.s.Connect(ctx, &registryv1.CreateConnectionRequest{
		DisplayName: name, Owner: "adapter-tests",
		Transport: &registryv1.Transport{Kind: &registryv1.Transport_Stdio{Stdio: &registryv1.StdioTransport{Command: node, Args: args, Env: env}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := tp.ad.Discover(testkit.AsService(ctx, identity.Orchestrator), &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()})
	if err != nil {
		t.Fatalf("discover %s: %v", name, err)
	}
	if snap.GetProtocolVersion() == "" || snap.GetServerInfo().GetName() == "" {
		t.Errorf("snapshot of %s: protocol %q server %v", name, snap.GetProtocolVersion(), snap.GetServerInfo())
	}
	// The sandbox is recorded on the connection without a new revision.
	got, err := tp.s.Registry.GetConnection(ctx, &registryv1.GetConnectionRequest{Id: conn.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	revs, err := tp.s.Registry.ListConfigRevisions(ctx, &registryv1.ListConfigRevisionsRequest{ConnectionId: conn.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	if sb := got.GetSandbox(); !sb.GetMinimalEnvironment() || sb.GetNetwork() == registryv1.NetworkIsolation_NETWORK_ISOLATION_UNSPECIFIED ||
		len(sb.GetResourceLimits()) == 0 || got.GetConfigRevision() != 1 || len(revs.GetRevisions()) != 1 {
		t.Errorf("connection after discovery: sandbox %v, config revision %d, %d revisions", sb, got.GetConfigRevision(), len(revs.GetRevisions()))
	}
	return got, snap
}

// activate proposes and approves a retrieve_authorized_source mapping.
func (tp *thirdParty) activate(t *testing.T, conn *registryv1.Connection, snap *registryv1.DiscoverySnapshot, target *registryv1.RemoteTarget,
	bindings []*registryv1.ArgumentBinding, limits *registryv1.Limits) *registryv1.Mapping {
	t.Helper()
	return tp.activateTool(t, conn, snap, target, bindings, limits)
}

// findTool returns the snapshot's tool of that name.
func findTool(t *testing.T, snap *registryv1.DiscoverySnapshot, name string) *registryv1.ToolIdentity {
	t.Helper()
	for _, ti := range snap.GetTools() {
		if ti.GetName() == name {
			return ti
		}
	}
	t.Fatalf("snapshot lists no tool %s", name)
	return nil
}

// activateTool proposes and approves a retrieve_authorized_source mapping
// onto target.
func (tp *thirdParty) activateTool(t *testing.T, conn *registryv1.Connection, snap *registryv1.DiscoverySnapshot, target *registryv1.RemoteTarget,
	bindings []*registryv1.ArgumentBinding, limits *registryv1.Limits) *registryv1.Mapping {
	t.Helper()
	ctx := tp.s.As(context.Background(), "integrator@adapter-tests", "platform")
	m, err := tp.s.Registry.ProposeMapping(ctx, &registryv1.ProposeMappingRequest{
		Capability: "retrieve_authorized_source", ConnectionId: conn.GetId(), SnapshotId: snap.GetId(),
		Target: target, ArgumentMap: bindings, Limits: limits,
	})
	if err != nil {
		t.Fatalf("propose: %v", err)
	}
	m, err = tp.s.Registry.ReviewMapping(tp.s.As(context.Background(), "reviewer@adapter-tests", "reviewers"), &registryv1.ReviewMappingRequest{MappingId: m.GetId(), Revision: m.GetRevision(), Approve: true})
	if err != nil || m.GetState() != registryv1.MappingState_MAPPING_STATE_ACTIVE {
		t.Fatalf("review: %v %v", m.GetState(), err)
	}
	return m
}

func (tp *thirdParty) execute(t *testing.T, conn *registryv1.Connection, m *registryv1.Mapping, target *registryv1.RemoteTarget,
	args map[string]any, limits *registryv1.Limits) *adapterv1.ExecuteResponse {
	t.Helper()
	req := &adapterv1.ExecuteRequest{
		ConnectionId: conn.GetId(), ConfigRevision: conn.GetConfigRevision(),
		MappingId: m.GetId(), MappingRevision: m.GetRevision(),
		Target: target, Limits: limits, AttemptId: "att_" + strings.ReplaceAll(t.Name(), "/", "_"), TaskId: "task_thirdparty",
	}
	// The mapping's reviewed output schema judges its own tool's results,
	// as the orchestrator sends it.
	if target.GetKind() == registryv1.RemoteKind_REMOTE_KIND_TOOL && target.GetName() == m.GetTarget().GetName() {
		req.OutputSchema = m.GetOutputSchema()
	}
	if args != nil {
		s, err := structpb.NewStruct(args)
		if err != nil {
			t.Fatal(err)
		}
		req.Arguments = s
	}
	g, err := grant.For(req, ids.New("grant"), "int_thirdparty", m.GetCapability(), time.Now(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if req.Grant, err = grant.Sign(tp.orchestrator, g); err != nil {
		t.Fatal(err)
	}
	resp, err := tp.ad.Execute(testkit.AsService(context.Background(), identity.Orchestrator), req)
	if err != nil {
		t.Fatalf("execute: %v", err)
	}
	return resp
}

func wantCode(t *testing.T, resp *adapterv1.ExecuteResponse, code string) {
	t.Helper()
	if resp.GetOutcome() == adapterv1.Outcome_OUTCOME_OK || resp.GetError().GetSafeCode() != code || len(resp.GetItems()) != 0 {
		t.Errorf("outcome %v code %q items %d, want code %q", resp.GetOutcome(), resp.GetError().GetSafeCode(), len(resp.GetItems()), code)
	}
}

func TestThirdPartyFilesystem(t *testing.T) {
	t.Parallel()
	dir := thirdPartyDir(t)
	tp := startThirdParty(t)
	// The server runs under a uid of its own: it must be able to read the
	// directory it serves.
	root := testkit.ReachableDir(t)
	content := "# Migration guide\n\nRetry after the interval the server names.\n"
	path := filepath.Join(root, "guide.md")
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	conn, snap := tp.connect(t, "server-filesystem", filepath.Join(dir, "server-filesystem", "dist", "index.js"), root)
	tool := "read_text_file"
	if !slices.ContainsFunc(snap.GetTools(), func(ti *registryv1.ToolIdentity) bool { return ti.GetName() == tool }) {
		t.Fatalf("server-filesystem %s lists no %s tool", testkit.FilesystemVersion, tool)
	}
	target := &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: tool}
	limits := &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 1, AllowedMediaTypes: []string{"text/plain"}}
	m := tp.activate(t, conn, snap, target, []*registryv1.ArgumentBinding{{RemoteField: "path", ProductField: "source", FromHandle: true}}, limits)

	// The orchestrator would resolve the source handle to this path.
	resp := tp.execute(t, conn, m, target, map[string]any{"path": path}, m.GetLimits())
	if resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK || len(resp.GetItems()) != 1 {
		t.Fatalf("outcome %v error %v items %v", resp.GetOutcome(), resp.GetError(), resp.GetItems())
	}
	it := resp.GetItems()[0]
	want := digest.Bytes([]byte(content))
	if it.GetText() != content || it.GetMediaType() != "text/plain" || it.GetContentDigest() != want ||
		!strings.HasPrefix(resp.GetResponseDigest(), "sha256:") || resp.GetStage() != adapterv1.DeliveryStage_DELIVERY_STAGE_RESULT_OBSERVED {
		t.Errorf("item %v (want digest %s), response digest %q, stage %v", it, want, resp.GetResponseDigest(), resp.GetStage())
	}
	// The tool declares an output schema; the mapping copied it at review
	// and the result's structured content was validated against it.
	if m.GetOutputSchema() == nil || m.GetOutputSchemaDigest() == "" ||
		resp.GetStructuredContent().GetFields()["content"].GetStringValue() != content {
		t.Errorf("output schema %v (%q), structured content %v", m.GetOutputSchema(), m.GetOutputSchemaDigest(), resp.GetStructuredContent())
	}
	// Outside its allowed directory the server refuses: a tool error.
	wantCode(t, tp.execute(t, conn, m, target, map[string]any{"path": "/etc/hostname"}, m.GetLimits()), adapter.CodeToolError)
	// Over the mapping's byte limit.
	wantCode(t, tp.execute(t, conn, m, target, map[string]any{"path": path}, &registryv1.Limits{MaxResponseBytes: 16, MaxItems: 1, AllowedMediaTypes: []string{"text/plain"}}),
		adapter.CodeResponseLimitExceeded)
}

func TestThirdPartyEverything(t *testing.T) {
	t.Parallel()
	dir := thirdPartyDir(t)
	tp := startThirdParty(t)
	conn, snap := tp.connect(t, "server-everything", filepath.Join(dir, "server-everything", "dist", "index.js"), "stdio")
	const doc = "demo://resource/static/document/architecture.md"
	if !slices.ContainsFunc(snap.GetResources(), func(r *registryv1.ResourceIdentity) bool { return r.GetUri() == doc }) {
		t.Fatalf("server-everything %s lists no %s", testkit.EverythingVersion, doc)
	}
	target := &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_RESOURCE, Name: doc}
	limits := &registryv1.Limits{MaxResponseBytes: 256 << 10, MaxItems: 1, AllowedMediaTypes: []string{"text/markdown"}}
	m := tp.activate(t, conn, snap, target, nil, limits)

	resp := tp.execute(t, conn, m, target, nil, m.GetLimits())
	if resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK || len(resp.GetItems()) != 1 {
		t.Fatalf("outcome %v error %v items %v", resp.GetOutcome(), resp.GetError(), resp.GetItems())
	}
	it := resp.GetItems()[0]
	if it.GetUri() != doc || it.GetMediaType() != "text/markdown" || it.GetText() == "" || it.GetContentDigest() != digest.Bytes([]byte(it.GetText())) ||
		resp.GetMethod() != "resources/read" || resp.GetServerInfo().GetName() == "" {
		t.Errorf("item uri %q media %q digest %q (%d bytes), method %q", it.GetUri(), it.GetMediaType(), it.GetContentDigest(), len(it.GetText()), resp.GetMethod())
	}

	// server-everything's binary content and sizes exercise the limits.
	t.Run("document over a small byte limit", func(t *testing.T) {
		wantCode(t, tp.execute(t, conn, m, target, nil, &registryv1.Limits{MaxResponseBytes: 512, MaxItems: 1, AllowedMediaTypes: []string{"text/markdown"}}),
			adapter.CodeResponseLimitExceeded)
	})
	t.Run("binary resource where text is allowed", func(t *testing.T) {
		blob := &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_RESOURCE, Name: "demo://resource/dynamic/blob/1"}
		wantCode(t, tp.execute(t, conn, m, blob, nil, m.GetLimits()), adapter.CodeMediaTypeNotAllowed)
	})
	t.Run("image tool where text is allowed", func(t *testing.T) {
		img := &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: "get-tiny-image"}
		wantCode(t, tp.execute(t, conn, m, img, map[string]any{}, &registryv1.Limits{MaxResponseBytes: 256 << 10, MaxItems: 10, AllowedMediaTypes: []string{"text/plain"}}),
			adapter.CodeMediaTypeNotAllowed)
	})
	t.Run("image among texts: fail, or drop it with a diagnostic", func(t *testing.T) {
		img := &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: "get-tiny-image"}
		limits := &registryv1.Limits{MaxResponseBytes: 256 << 10, MaxItems: 10, AllowedMediaTypes: []string{"text/plain"}}
		wantCode(t, tp.execute(t, conn, m, img, map[string]any{}, limits), adapter.CodeMediaTypeNotAllowed)
		limits.DropDisallowedItems = true
		resp := tp.execute(t, conn, m, img, map[string]any{}, limits)
		if resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK || len(resp.GetItems()) != 2 || len(resp.GetDiagnostics()) != 1 ||
			resp.GetDiagnostics()[0].GetMediaType() != "image/png" || resp.GetDiagnostics()[0].GetIndex() != 1 {
			t.Fatalf("outcome %v error %v items %v diagnostics %v", resp.GetOutcome(), resp.GetError(), resp.GetItems(), resp.GetDiagnostics())
		}
		for _, it := range resp.GetItems() {
			if it.GetMediaType() != "text/plain" || it.GetText() == "" {
				t.Errorf("kept item %v", it)
			}
		}
	})
	t.Run("structured content against the tool's output schema", func(t *testing.T) {
		tool := findTool(t, snap, "get-structured-content")
		if tool.GetOutputSchema() == nil {
			t.Fatalf("server-everything %s declares no output schema for %s", testkit.EverythingVersion, tool.GetName())
		}
		weather := &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: tool.GetName()}
		limits := &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 2, AllowedMediaTypes: []string{"text/plain"}}
		mapped := tp.activateTool(t, conn, snap, weather, []*registryv1.ArgumentBinding{{RemoteField: "location", Constant: structpb.NewStringValue("Chicago")}}, limits)
		if mapped.GetOutputSchemaDigest() != tool.GetOutputSchemaDigest() {
			t.Fatalf("mapping output schema digest %q, tool's %q", mapped.GetOutputSchemaDigest(), tool.GetOutputSchemaDigest())
		}
		resp := tp.execute(t, conn, mapped, weather, map[string]any{"location": "Chicago"}, limits)
		if resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK || resp.GetStructuredContent().GetFields()["conditions"].GetStringValue() == "" {
			t.Fatalf("outcome %v error %v structured %v", resp.GetOutcome(), resp.GetError(), resp.GetStructuredContent())
		}
		// The same answer judged by another contract (a forecast, not the
		// current weather) is malformed, and nothing of it is returned.
		judged := proto.CloneOf(mapped)
		judged.OutputSchema = must(structpb.NewStruct(map[string]any{
			"type": "object", "required": []any{"forecast"},
			"properties": map[string]any{"forecast": map[string]any{"type": "array"}},
		}))
		wantCode(t, tp.execute(t, conn, judged, weather, map[string]any{"location": "Chicago"}, limits), adapter.CodeMalformedResult)
	})
	t.Run("echo of 1 MiB over a 64 KiB limit is refused while reading", func(t *testing.T) {
		echo := &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: "echo"}
		resp := tp.execute(t, conn, m, echo, map[string]any{"message": strings.Repeat("x", 1<<20)}, &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 1})
		wantCode(t, resp, adapter.CodeResponseLimitExceeded)
		if resp.GetResponseBytes() > 1<<20 {
			t.Errorf("read %d bytes of a response limited to 64 KiB", resp.GetResponseBytes())
		}
	})
}

// TestThirdPartyEverythingSurface: server-everything's resource templates,
// prompts and its task-only research tool (execution.taskSupport
// "required", which the client library drops) are in the snapshot, with
// the registry's digests.
func TestThirdPartyEverythingSurface(t *testing.T) {
	t.Parallel()
	dir := thirdPartyDir(t)
	tp := startThirdParty(t)
	_, snap := tp.connect(t, "server-everything", filepath.Join(dir, "server-everything", "dist", "index.js"), "stdio")

	templates := map[string]*registryv1.ResourceTemplateIdentity{}
	for _, rt := range snap.GetResourceTemplates() {
		templates[rt.GetUriTemplate()] = rt
	}
	for uri, mime := range map[string]string{
		"demo://resource/dynamic/text/{resourceId}": "text/plain",
		"demo://resource/dynamic/blob/{resourceId}": "application/octet-stream",
	} {
		rt := templates[uri]
		if rt == nil || rt.GetMimeType() != mime || rt.GetName() == "" || rt.GetDescription() == "" ||
			rt.GetDescriptionDigest() != digest.String(rt.GetDescription()) || rt.GetTitleDigest() == "" {
			t.Errorf("template %s = %v, want it with media type %s and digests (templates: %v)", uri, rt, mime, snap.GetResourceTemplates())
		}
	}
	prompts := map[string]*registryv1.PromptIdentity{}
	for _, p := range snap.GetPrompts() {
		prompts[p.GetName()] = p
	}
	for _, name := range []string{"simple-prompt", "args-prompt", "completable-prompt", "resource-prompt"} {
		if p := prompts[name]; p == nil || p.GetDescriptionDigest() == "" {
			t.Errorf("prompt %s = %v (prompts: %v)", name, p, snap.GetPrompts())
		}
	}
	args := prompts["args-prompt"]
	if a := args.GetArguments(); len(a) != 2 || a[0].GetName() != "city" || !a[0].GetRequired() || a[1].GetName() != "state" || a[1].GetRequired() ||
		!strings.HasPrefix(args.GetArgumentsDigest(), "sha256:") || args.GetTitle() != "Arguments Prompt" {
		t.Errorf("args-prompt = %v", args)
	}
	var research *registryv1.ToolIdentity
	for _, tool := range snap.GetTools() {
		if tool.GetName() == "simulate-research-query" {
			research = tool
		}
	}
	want, _ := digest.JSON(map[string]any{"taskSupport": "required"})
	if research.GetExecution().GetFields()["taskSupport"].GetStringValue() != "required" || research.GetExecutionDigest() != want ||
		research.GetTitleDigest() != digest.String("Simulate Research Query") || research.GetAnnotationsDigest() == "" {
		t.Errorf("simulate-research-query = %v", research)
	}
	// The adapter calls tools without task augmentation, which this
	// server refuses for a task-only tool: no mapping onto it is taken.
	_, err := tp.s.Registry.ProposeMapping(tp.s.As(context.Background(), "integrator@adapter-tests", "platform"), &registryv1.ProposeMappingRequest{
		Capability: "retrieve_authorized_source", ConnectionId: snap.GetConnectionId(), SnapshotId: snap.GetId(),
		Target:      &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: "simulate-research-query"},
		ArgumentMap: []*registryv1.ArgumentBinding{{RemoteField: "topic", ProductField: "query"}},
		Limits:      &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 10},
	})
	if !apierror.Is(err, codes.InvalidArgument, "INVALID_MAPPING") || !slices.Contains(apierror.Fields(err), "target.name") ||
		!strings.Contains(err.Error(), "runs only as an MCP task") {
		t.Errorf("a mapping onto the task-only tool: %v; want INVALID_MAPPING on target.name saying it runs only as a task", err)
	}
}

// must returns v, panicking on err: for literals that cannot fail.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestThirdPartyMemory: server-memory's search_nodes answers with
// structured content valid against its declared output schema, which the
// mapping reviewed; the graph comes from a memory file the test writes.
func TestThirdPartyMemory(t *testing.T) {
	t.Parallel()
	dir := thirdPartyDir(t)
	tp := startThirdParty(t)
	// The server runs under a uid of its own and writes its memory file
	// next to where it reads it.
	memDir := testkit.WritableDir(t)
	memFile := filepath.Join(memDir, "memory.jsonl")
	graph := `{"type":"entity","name":"rate-limits","entityType":"note","observations":["600 requests per minute per key"]}` + "\n" +
		`{"type":"entity","name":"migration","entityType":"note","observations":["v2 since March"]}`
	if err := os.WriteFile(memFile, []byte(graph), 0o666); err != nil {
		t.Fatal(err)
	}
	conn, snap := tp.connectEnv(t, "server-memory", map[string]string{"MEMORY_FILE_PATH": memFile}, filepath.Join(dir, "server-memory", "dist", "index.js"))
	tool := findTool(t, snap, "search_nodes")
	if tool.GetOutputSchema() == nil {
		t.Fatalf("server-memory %s declares no output schema for search_nodes", testkit.MemoryVersion)
	}
	target := &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: "search_nodes"}
	limits := &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 2, AllowedMediaTypes: []string{"text/plain"}}
	m := tp.activateTool(t, conn, snap, target, []*registryv1.ArgumentBinding{{RemoteField: "query", ProductField: "query"}}, limits)
	resp := tp.execute(t, conn, m, target, map[string]any{"query": "rate"}, limits)
	if resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
		t.Fatalf("outcome %v error %v", resp.GetOutcome(), resp.GetError())
	}
	entities := resp.GetStructuredContent().GetFields()["entities"].GetListValue().GetValues()
	if len(entities) != 1 || entities[0].GetStructValue().GetFields()["name"].GetStringValue() != "rate-limits" {
		t.Errorf("structured content = %v", resp.GetStructuredContent())
	}
}

// nodeHomeServer is a minimal MCP server in Node that, at start, asks Node
// for its home and temporary directories (os.homedir() throws for a uid
// with no passwd entry and no HOME, and the server dies at start), writes
// into both, and describes its one tool with what it found.
const nodeHomeServer = `
const os = require('os'), fs = require('fs'), path = require('path');
const home = os.homedir(), tmp = os.tmpdir();
fs.writeFileSync(path.join(home, 'probe'), 'x');
fs.mkdtempSync(path.join(tmp, 'probe-'));
const info = JSON.stringify({home, tmp, xdg: process.env.XDG_CONFIG_HOME || ''});
require('readline').createInterface({input: process.stdin}).on('line', (l) => {
  const m = JSON.parse(l);
  if (m.id === undefined) return;
  const out = {jsonrpc: '2.0', id: m.id};
  if (m.method === 'initialize') out.result = {protocolVersion: m.params.protocolVersion, capabilities: {tools: {}}, serverInfo: {name: 'node-home', version: '1'}};
  else if (m.method === 'tools/list') out.result = {tools: [{name: 'home', description: info, inputSchema: {type: 'object'}}]};
  else out.error = {code: -32601, message: 'method not found'};
  process.stdout.write(JSON.stringify(out) + '\n');
});`

// TestNodeServerHasAHome: a Node server started under its own uid (which
// has no passwd entry) starts, and finds a home, a temporary directory and
// XDG directories of its run's own, which it can write; the connection
// records that home.
func TestNodeServerHasAHome(t *testing.T) {
	t.Parallel()
	testkit.NeedsExternal(t, "Node.js (make third-party-mcp or make conformance install it)")
	if _, err := exec.LookPath("node"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("CI must run the Node server tests: install Node.js (>= 20)")
		}
		t.Skip("!!! node not found: the Node server test is SKIPPED")
	}
	tp := startThirdParty(t)
	conn, snap := tp.connect(t, "node-home", "-e", nodeHomeServer)
	var got struct{ Home, Tmp, Xdg string }
	if err := json.Unmarshal([]byte(findTool(t, snap, "home").GetDescription()), &got); err != nil {
		t.Fatal(err)
	}
	sb := conn.GetSandbox()
	run := filepath.Dir(got.Home)
	if sb.GetOwnHome() != registryv1.Enforcement_ENFORCEMENT_ENFORCED || sb.GetHome() != got.Home || filepath.Base(got.Home) != "home" ||
		!strings.HasPrefix(filepath.Base(run), "run-") || got.Tmp != filepath.Join(run, "tmp") || got.Xdg != filepath.Join(got.Home, ".config") {
		t.Errorf("the server found home %q, tmp %q, XDG config %q; recorded own home %v %q", got.Home, got.Tmp, got.Xdg, sb.GetOwnHome(), sb.GetHome())
	}
}
