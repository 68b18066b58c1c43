package attack_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/v0m3/v0m3/demo/fixture/renderer"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/suite"
)

// People of the grant and receipt attacks besides main_test.go's: ivan
// proposes, rita reviews, alice requests and bob approves, as separation
// of duties requires.
var (
	bob    = person{"bob@approvals", []string{"approvers"}}
	audrey = person{"audrey@audit", []string{"auditors"}}
	// mallory holds a token in every group: what a token alone cannot buy
	// is a peer service's RPC.
	mallory = person{"mallory", []string{"platform", "reviewers", "approvers", "auditors", "policy-admins", "product-services", "authors", "publishers"}}
)

// startServices runs the services named (all when none) as start does.
func startServices(t *testing.T, services ...string) *suite.Suite {
	t.Helper()
	s, err := suite.Start(context.Background(), suite.Config{
		DataDir: t.TempDir(), Services: services,
		Reach: &suite.Reach{StdioRoots: []string{filepath.Dir(v0m3Bin)}, AllowLoopback: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// rendererEnv is one renderer connection (the real `v0m3
// fixture-renderer` over stdio): its working directory and call log exist
// only once a renderer process has started.
type rendererEnv struct {
	workDir, callLog string
	conn             *registryv1.Connection
	mapping          *registryv1.Mapping
}

// started reports whether any renderer process ever started.
func (r *rendererEnv) started() bool {
	return exists(r.workDir) || exists(r.callLog)
}

// calls counts tool calls the renderer received and renders it performed.
func (r *rendererEnv) calls(t *testing.T) (calls, renders int) {
	t.Helper()
	b, err := os.ReadFile(r.callLog)
	if os.IsNotExist(err) {
		return 0, 0
	}
	if err != nil {
		t.Fatal(err)
	}
	for line := range bytes.Lines(b) {
		var e struct{ Event string }
		if err := json.Unmarshal(line, &e); err != nil {
			t.Fatalf("call log line %q: %v", line, err)
		}
		switch e.Event {
		case "call":
			calls++
		case "rendered":
			renders++
		}
	}
	return calls, renders
}

func (r *rendererEnv) artifacts(t *testing.T) []string {
	t.Helper()
	a, err := renderer.Artifacts(r.workDir)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// newRenderer registers a renderer connection and has it reviewed, so
// that review is not what stops an attack on it. With mapped, it is also
// discovered and render_preview is mapped onto it (proposed by ivan,
// reviewed by rita); without, no process has ever started for it.
func newRenderer(t *testing.T, s *suite.Suite, c suite.Clients, mapped bool, args ...string) *rendererEnv {
	t.Helper()
	dir := testkit.WritableDir(t)
	r := &rendererEnv{workDir: filepath.Join(dir, "work"), callLog: filepath.Join(dir, "calls.jsonl")}
	conn, err := c.Registry.CreateConnection(testkit.As(s, ivan), &registryv1.CreateConnectionRequest{
		DisplayName: "V0M3 Renderer", Owner: "platform-team", CredentialScope: "local renderer; no credential",
		Transport: &registryv1.Transport{Kind: &registryv1.Transport_Stdio{Stdio: &registryv1.StdioTransport{
			Command: v0m3Bin,
			Args:    append([]string{"fixture-renderer", "--transport", "stdio", "--work-dir", r.workDir, "--call-log", r.callLog}, args...),
		}}},
	})
	if err != nil {
		t.Fatalf("create renderer connection: %v", err)
	}
	if r.conn, err = s.ApproveConnection(context.Background(), conn); err != nil {
		t.Fatal(err)
	}
	if !mapped {
		return r
	}
	snap, err := c.Adapter.Discover(testkit.As(s, ivan), &adapterv1.DiscoverRequest{ConnectionId: r.conn.GetId()})
	if err != nil {
		t.Fatalf("discover renderer: %v", err)
	}
	m, err := c.Registry.ProposeMapping(testkit.As(s, ivan), &registryv1.ProposeMappingRequest{
		Capability: "render_preview", ConnectionId: r.conn.GetId(), SnapshotId: snap.GetId(),
		Target: &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: renderer.ToolRender},
		ArgumentMap: []*registryv1.ArgumentBinding{
			{RemoteField: "document_revision", ProductField: "document_revision"},
			{RemoteField: "profile", ProductField: "profile"},
		},
		Limits:              &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 4, AllowedMediaTypes: []string{"text/plain"}},
		IdempotencyKeyField: "request_id",
		StatusTool:          renderer.ToolStatus,
	})
	if err != nil {
		t.Fatalf("propose render mapping: %v", err)
	}
	if r.mapping, err = c.Registry.ReviewMapping(testkit.As(s, rita), &registryv1.ReviewMappingRequest{MappingId: m.GetId(), Revision: m.GetRevision(), Approve: true}); err != nil {
		t.Fatalf("review render mapping: %v", err)
	}
	if r.conn, err = c.Registry.GetConnection(testkit.As(s, ivan), &registryv1.GetConnectionRequest{Id: r.conn.GetId()}); err != nil {
		t.Fatal(err)
	}
	return r
}
