package adapter

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"

	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/fixture"
	"github.com/v0m3/v0m3/services/internal/apierror"
	"github.com/v0m3/v0m3/services/internal/testkit"
)

// plantSecret writes a fresh secret to a credential file.
func plantSecret(t *testing.T) (secret, ref string) {
	t.Helper()
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	secret = "planted-" + hex.EncodeToString(b)
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return secret, "file:" + path
}

// TestCredentialReachesServerAndNothingElse plants a secret, checks the
// server received exactly it (by digest), and that it appears in no log,
// response, trace, snapshot or error.
func TestCredentialReachesServerAndNothingElse(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"stdio", "http"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			var logs testkit.SyncBuffer
			e := newEnvLog(t, slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
			secret, ref := plantSecret(t)
			conn := e.httpConn(httpURL)
			if kind == "stdio" {
				conn = e.stdioConn("--hostile")
			}
			conn = e.registry.add(&registryv1.Connection{Transport: conn.GetTransport(), CredentialRef: ref})

			var seen []string // every text the test can observe
			seeMsg := func(m proto.Message) { seen = append(seen, prototext.Format(m)) }

			req := call(t, conn, "whoami", map[string]any{}, nil)
			req.TaskId = "task_cred"
			resp := execute(t, e, req)
			if got := textOf(t, resp); got != fixture.CredentialDigest(secret) {
				t.Errorf("the server received a credential with digest %s, want the planted one's %s", got, fixture.CredentialDigest(secret))
			}
			seeMsg(resp)
			if kind == "stdio" {
				names := textOf(t, execute(t, e, call(t, conn, "env", map[string]any{}, nil)))
				if !slices.Contains(strings.Split(names, "\n"), CredentialEnv) {
					t.Errorf("local server environment %q lacks %s", names, CredentialEnv)
				}
			}
			// Failures after the credential was injected.
			for _, tool := range []string{"crash", "export"} {
				r := call(t, conn, tool, map[string]any{}, nil)
				r.TaskId = "task_cred"
				seeMsg(execute(t, e, r))
			}
			snap, err := e.srv.Discover(asOperator(context.Background()), &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()})
			if err != nil {
				t.Fatal(err)
			}
			seeMsg(snap)
			h, err := e.srv.Health(context.Background(), &adapterv1.HealthRequest{ConnectionId: conn.GetId()})
			if err != nil || !h.GetHealthy() {
				t.Fatalf("Health = %v, %v", h, err)
			}
			seeMsg(h)
			got, _ := e.registry.GetConnection(context.Background(), &registryv1.GetConnectionRequest{Id: conn.GetId()})
			seeMsg(got)

			// A credential that cannot be read is a clear, safe failure.
			missing := e.registry.add(&registryv1.Connection{Transport: conn.GetTransport(), CredentialRef: "file:/nonexistent/" + secret[:4]})
			r := execute(t, e, call(t, missing, "whoami", map[string]any{}, nil))
			wantFailure(t, r, adapterv1.Outcome_OUTCOME_UNAVAILABLE, CodeCredentialUnavailable)
			seeMsg(r)
			_, err = e.srv.Discover(asOperator(context.Background()), &adapterv1.DiscoverRequest{ConnectionId: missing.GetId()})
			if !apierror.Is(err, codes.FailedPrecondition, "CREDENTIAL_UNAVAILABLE") {
				t.Errorf("Discover with an unreadable credential: %v", err)
			}
			seen = append(seen, err.Error())

			e.evidence.mu.Lock()
			if len(e.evidence.events) == 0 {
				t.Error("no protocol trace was appended")
			}
			for _, ev := range e.evidence.events {
				seeMsg(ev)
			}
			e.evidence.mu.Unlock()
			seen = append(seen, logs.String())
			if !strings.Contains(logs.String(), "executed") {
				t.Error("the log capture saw nothing; the check would be empty")
			}
			for i, s := range seen {
				if strings.Contains(s, secret) {
					t.Errorf("the planted secret leaked into observation %d: %s", i, s)
				}
			}
		})
	}
}
