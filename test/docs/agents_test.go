package docs_test

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/v0m3/v0m3/internal/identity"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	"github.com/v0m3/v0m3/test/conformance"
)

// startAgentTask starts, as alice, a source-review task with MCP access
// over the Migration FAQ, once the walkthrough has connected and mapped
// the Sources server; it returns the response and an orchestrator client
// acting as alice.
func startAgentTask(t *testing.T) (*orchestratorv1.StartTaskResponse, orchestratorv1.OrchestratorServiceClient, context.Context) {
	t.Helper()
	requireTool(t, "jq", "the walkthrough, which maps the Sources server, reads answers with jq")
	if _, err := walkthrough(); err != nil {
		t.Fatalf("the walkthrough (which maps the Sources server the agents read through): %v", err)
	}
	pem, err := os.ReadFile(dev.ca)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	conn, err := grpc.NewClient(dev.addr["orchestrator"], identity.CallerDialOptions(roots)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	iss, err := identity.LoadDevIssuer(filepath.Join(dev.dataDir, "pki"))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := iss.Mint("alice", []string{"authors"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(identity.WithBearer(context.Background(), tok), 2*time.Minute)
	t.Cleanup(cancel)
	orch := orchestratorv1.NewOrchestratorServiceClient(conn)
	resp, err := orch.StartTask(ctx, &orchestratorv1.StartTaskRequest{
		Profile: "source_review", McpAccess: true,
		SourceScope: []*orchestratorv1.SourceRef{{Uri: "v0m3-sources://notes/migration-faq", Title: "Migration FAQ"}},
	})
	if err != nil {
		t.Fatalf("start task: %v", err)
	}
	return resp, orch, ctx
}

// checkAgent asserts what an agent printed, and that its call was a
// governed request of the task: executed, with the observation the agent
// was linked to.
func checkAgent(t *testing.T, out string, resp *orchestratorv1.StartTaskResponse, orch orchestratorv1.OrchestratorServiceClient, ctx context.Context) {
	t.Helper()
	for _, want := range []string{
		"tool: retrieve_authorized_source: Retrieve passages from one source",
		"called retrieve_authorized_source (error: false)",
		"migration window",                    // quoted from the fixture's Migration FAQ
		"resource link: v0m3://observations/", // the source observation in evidence
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the agent's output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "v0m3-sources://") {
		t.Errorf("the agent saw a source URI; it must see handles only:\n%s", out)
	}
	list, err := orch.ListRequests(ctx, &orchestratorv1.ListRequestsRequest{TaskId: resp.GetTask().GetId()})
	if err != nil {
		t.Fatal(err)
	}
	if rs := list.GetRequests(); len(rs) != 1 || rs[0].GetCapability() != "retrieve_authorized_source" ||
		rs[0].GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED || len(rs[0].GetExcerpts()) == 0 {
		t.Fatalf("task %s's requests = %v; want one executed retrieve_authorized_source with excerpts", resp.GetTask().GetId(), rs)
	}
	obs := list.GetRequests()[0].GetExcerpts()[0].GetObservationId()
	if !strings.Contains(out, "v0m3://observations/"+obs) {
		t.Errorf("the agent was not linked to observation %s:\n%s", obs, out)
	}
}

// agentEnv is the environment an agent runs with: the task's endpoint,
// its token and the dev CA.
func agentEnv(resp *orchestratorv1.StartTaskResponse) []string {
	return append(dev.env(),
		"V0M3_MCP_URL="+resp.GetMcpEndpoint().GetUrl(),
		"V0M3_MCP_TOKEN="+resp.GetMcpEndpoint().GetToken(),
	)
}

// examples/agent-go, a go-sdk client, lists a task's tools through its MCP
// endpoint and calls one: the result is the Migration FAQ quoted, linked
// to its observation.
func TestAgentGo(t *testing.T) {
	resp, orch, ctx := startAgentTask(t)
	cmd := exec.CommandContext(ctx, filepath.Join(dev.binDir, "agent-go"))
	cmd.Dir = dev.scratch
	cmd.Env = agentEnv(resp)
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("agent-go: %v\n%s", err, out)
	}
	t.Logf("agent-go printed:\n%s", out)
	checkAgent(t, string(out), resp, orch, ctx)
}

// examples/agent-ts, the TypeScript SDK pinned by its lock file, does the
// same.
func TestAgentTS(t *testing.T) {
	node, npm := nodeAndNPM(t)
	modules := installAgentTS(t, npm)
	// The agent as a reader runs it: beside its node_modules.
	dir := t.TempDir()
	src, err := os.ReadFile(filepath.Join(dev.repo, "examples", "agent-ts", "agent.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "agent.mjs"), src, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(modules, filepath.Join(dir, "node_modules")); err != nil {
		t.Fatal(err)
	}
	resp, orch, ctx := startAgentTask(t)
	cmd := exec.CommandContext(ctx, node, "agent.mjs")
	cmd.Dir = dir
	cmd.Env = agentEnv(resp)
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("agent.mjs: %v\n%s", err, out)
	}
	t.Logf("agent.mjs printed:\n%s", out)
	checkAgent(t, string(out), resp, orch, ctx)
}

// nodeAndNPM returns the Node the agent runs on (the Node 22 `make
// conformance` installs, else node on PATH) and npm, which installs its
// SDK.
func nodeAndNPM(t *testing.T) (node, npm string) {
	t.Helper()
	if r, err := conformance.Installed(); err == nil {
		node = r.Node
	} else {
		node = requireTool(t, "node", "examples/agent-ts runs on Node >= 18; `make conformance` installs Node 22")
	}
	return node, requireTool(t, "npm", "npm installs the SDK examples/agent-ts/package-lock.json pins")
}

// installAgentTS installs examples/agent-ts's locked dependencies once,
// into a cache directory named for the lock file's digest, and returns its
// node_modules.
func installAgentTS(t *testing.T, npm string) string {
	t.Helper()
	src := filepath.Join(dev.repo, "examples", "agent-ts")
	lock, err := os.ReadFile(filepath.Join(src, "package-lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(lock)
	root := os.Getenv("V0M3_EXAMPLES_CACHE")
	if root == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			t.Fatal(err)
		}
		root = filepath.Join(home, ".cache", "v0m3", "examples")
	}
	dir := filepath.Join(root, "agent-ts-"+hex.EncodeToString(sum[:8]))
	modules := filepath.Join(dir, "node_modules")
	if _, err := os.Stat(filepath.Join(dir, ".installed")); err == nil {
		return modules
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	tmp, err := os.MkdirTemp(root, ".install-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	for _, f := range []string{"package.json", "package-lock.json"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err == nil {
			err = os.WriteFile(filepath.Join(tmp, f), b, 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// npm ci installs exactly the lock file, each package checked against
	// its integrity hash; --ignore-scripts: installing runs no package code.
	cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts", "--loglevel=error")
	cmd.Dir = tmp
	if out, err := cmd.CombinedOutput(); err != nil {
		needed(t, fmt.Sprintf("npm ci of examples/agent-ts (from the npm registry, or npm's cache offline): %v\n%s", err, out))
	}
	if err := os.WriteFile(filepath.Join(tmp, ".installed"), []byte(hex.EncodeToString(sum[:])+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Another test process may have installed it meanwhile: either copy
	// is the same lock file's.
	if err := os.Rename(tmp, dir); err != nil && !errors.Is(err, os.ErrExist) {
		if _, statErr := os.Stat(filepath.Join(dir, ".installed")); statErr != nil {
			t.Fatalf("install %s: %v", dir, err)
		}
	}
	return modules
}
