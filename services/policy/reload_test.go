package policy

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/v0m3/v0m3/internal/digest"
	"github.com/v0m3/v0m3/internal/store"
	"github.com/v0m3/v0m3/internal/testkit"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

const policyV1 = `@id("retrieve-only")
permit (principal, action == V0M3::Action::"retrieve_authorized_source", resource);
`

const policyV2 = `@id("retrieve-only")
permit (principal, action == V0M3::Action::"retrieve_authorized_source", resource);

@id("authors-preview")
@approval("required")
permit (principal in V0M3::Group::"authors", action == V0M3::Action::"render_preview", resource);
`

// policyBroken has a syntax error on line 3: a comparison
// without its right-hand side. cedar-go reports it at column 28, the ";".
const policyBroken = `@id("retrieve-only")
permit (principal, action, resource)
when { context.purpose == };
`

func writePolicy(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}

func revision(t *testing.T, e *env) *policyv1.PolicyRevision {
	t.Helper()
	r, err := e.client.GetPolicyRevision(context.Background(), &policyv1.GetPolicyRevisionRequest{})
	if err != nil {
		t.Fatalf("GetPolicyRevision: %v", err)
	}
	return r
}

func previewDecision(t *testing.T, e *env) policyv1.Decision {
	t.Helper()
	resp, err := e.client.Authorize(context.Background(), &policyv1.AuthorizeRequest{
		Principal: bob(), Capability: capPreview, Resource: connOK, Purpose: "rewrite",
	})
	if err != nil {
		t.Fatalf("Authorize: %v", err)
	}
	return resp.GetDecision()
}

func TestPolicyFileReload(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "policy.cedar")
	writePolicy(t, path, policyV1)
	e := newEnv(t, options{policyFile: path})

	r := revision(t, e)
	if r.GetRevision() != digest.Bytes([]byte(policyV1)) || !slices.Equal(r.GetPolicyIds(), []string{"retrieve-only"}) {
		t.Fatalf("initial revision = %v", r)
	}
	if !r.GetLoadTime().AsTime().Equal(e.clock.Now()) {
		t.Errorf("load_time = %v, want %v", r.GetLoadTime().AsTime(), e.clock.Now())
	}
	if previewDecision(t, e) != policyv1.Decision_DECISION_DENY {
		t.Fatal("v1 should deny render_preview")
	}

	// A new file is picked up without restart.
	e.clock.Advance(time.Minute)
	writePolicy(t, path, policyV2)
	if err := e.srv.Reload(context.Background()); err != nil {
		t.Fatalf("Reload v2: %v", err)
	}
	r = revision(t, e)
	if r.GetRevision() != digest.Bytes([]byte(policyV2)) {
		t.Fatalf("revision after reload = %q", r.GetRevision())
	}
	if want := []string{"authors-preview", "retrieve-only"}; !slices.Equal(r.GetPolicyIds(), want) {
		t.Errorf("policy ids = %v, want %v", r.GetPolicyIds(), want)
	}
	if !r.GetLoadTime().AsTime().Equal(e.clock.Now()) {
		t.Errorf("load_time not updated: %v", r.GetLoadTime().AsTime())
	}
	resp, err := e.client.Authorize(context.Background(), &policyv1.AuthorizeRequest{
		Principal: bob(), Capability: capPreview, Resource: connOK, Purpose: "rewrite",
	})
	if err != nil || resp.GetDecision() != policyv1.Decision_DECISION_ALLOW || !resp.GetApprovalRequired() ||
		resp.GetPolicyRevision() != r.GetRevision() || !slices.Equal(resp.GetReasons(), []string{"authors-preview"}) {
		t.Fatalf("v2 decision = %v, err = %v", resp, err)
	}

	// A broken file is refused with its position; v2 stays in force.
	writePolicy(t, path, policyBroken)
	err = e.srv.Reload(context.Background())
	pe, ok := asParseError(err)
	if !ok {
		t.Fatalf("Reload broken: err = %v, want a ParseError", err)
	}
	if pe.Line != 3 || pe.Column != 28 {
		t.Errorf("position = %d:%d, want 3:28 (%v)", pe.Line, pe.Column, err)
	}
	if !strings.Contains(err.Error(), "line 3, column 28") {
		t.Errorf("error %q does not name line and column", err)
	}
	if logs := e.logs.String(); !strings.Contains(logs, `"line":3`) || !strings.Contains(logs, `"column":28`) ||
		!strings.Contains(logs, "previous revision stays in force") {
		t.Errorf("refusal not logged with line and column:\n%s", logs)
	}
	if got := revision(t, e).GetRevision(); got != digest.Bytes([]byte(policyV2)) {
		t.Errorf("revision after broken file = %q, want v2 still in force", got)
	}
	if previewDecision(t, e) != policyv1.Decision_DECISION_ALLOW {
		t.Error("v2 should still allow render_preview")
	}
}

func TestPolicyFileWatcher(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "policy.cedar")
	writePolicy(t, path, policyV1)
	e := newEnv(t, options{policyFile: path})

	writePolicy(t, path, policyV2)
	// Make the change visible even on coarse file-time filesystems.
	future := time.Now().Add(time.Hour)
	if err := os.Chtimes(path, future, future); err != nil {
		t.Fatal(err)
	}
	// The watcher waits for a change to hold still for one poll before
	// loading it; drive it by hand instead of waiting on the ticker.
	ctx := context.Background()
	e.srv.pollPolicy(ctx)
	e.srv.pollPolicy(ctx)
	if got := revision(t, e).GetRevision(); got != digest.Bytes([]byte(policyV2)) {
		t.Fatalf("watcher did not load v2: revision %q", got)
	}
}

func TestPolicyFileRefusals(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		text     string
		line     int
		column   int
		contains string
	}{
		{"syntax error", policyBroken, 3, 28, ""},
		{"missing @id", "permit (principal, action, resource);\n", 1, 1, "no @id"},
		{"duplicate @id", "@id(\"a\")\npermit (principal, action, resource);\n\n@id(\"a\")\nforbid (principal, action, resource);\n", 4, 1, "duplicate policy id"},
		{"unterminated string", "@id(\"a)\npermit (principal, action, resource);\n", 1, 5, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "policy.cedar")
			writePolicy(t, path, tc.text)
			db, err := store.Open(filepath.Join(t.TempDir(), "policy.db"))
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			// The registry is never called: construction fails first.
			regConn, err := grpc.NewClient("passthrough:///unused", grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer regConn.Close()
			logs := &testkit.SyncBuffer{}
			srv, err := NewServer(NewBoltStore(db), Deps{Registry: registryv1.NewRegistryServiceClient(regConn), PolicyFile: path},
				slog.New(slog.NewJSONHandler(logs, nil)))
			if err == nil {
				srv.Close()
				t.Fatal("NewServer accepted a bad policy file")
			}
			t.Logf("refused: %v", err)
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("err = %v, want a ParseError", err)
			}
			if pe.Line != tc.line || pe.Column != tc.column {
				t.Errorf("position = %d:%d, want %d:%d (%v)", pe.Line, pe.Column, tc.line, tc.column, err)
			}
			if !strings.Contains(err.Error(), tc.contains) || !strings.Contains(err.Error(), path) {
				t.Errorf("error %q should contain %q and the file name", err, tc.contains)
			}
			if l := logs.String(); !strings.Contains(l, "policy refused") {
				t.Errorf("refusal not logged:\n%s", l)
			}
		})
	}
}
