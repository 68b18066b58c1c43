package adapter

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/demo/fixture"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// plantMixedSecret plants (see env.plant) a credential with both cases,
// digits, '-' and '_' (so case and alphabet changes are real changes) and
// returns it and its reference.
func (e *env) plantMixedSecret() (secret, ref string) {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	secret = "Vm3-" + base64.RawURLEncoding.EncodeToString(b) + "_Zq"
	return secret, e.plant(secret)
}

// TestChangedCredentialFormsAreScrubbed: a real server, over each
// transport, echoes its credential changed (case, percent-encoding,
// base32, MIME-wrapped base64, inserted whitespace and zero-width
// characters, half of it) or split between two places of one call (two
// items, an item and structured content, a tool error's items, a JSON-RPC
// error's message and data, a progress notification and the result), and
// over stdio also in its tool descriptions and schema. No form of it
// reaches the response, the trace, the recorded snapshot or the log.
func TestChangedCredentialFormsAreScrubbed(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"stdio", "http"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			var logs testkit.SyncBuffer
			e := newEnvLog(t, slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
			secret, ref := e.plantMixedSecret()
			conn := e.httpConn(httpURL)
			if kind == "stdio" {
				conn = e.stdioConn("--hostile")
			}
			conn = e.registry.add(&registryv1.Connection{Transport: conn.GetTransport(), CredentialRef: ref})
			var seen []string
			see := func(m proto.Message) { seen = append(seen, fixture.ProtoStrings(m)...) }

			for _, form := range fixture.LeakForms {
				req := call(t, conn, "leak", map[string]any{"where": form}, nil)
				req.TaskId = "task_forms"
				resp := execute(t, e, req)
				see(resp)
				switch form {
				case "split_error":
					wantFailure(t, resp, adapterv1.Outcome_OUTCOME_INVALID_REQUEST, CodeToolError)
				case "split_rpc_data":
					wantFailure(t, resp, adapterv1.Outcome_OUTCOME_UNKNOWN, "JSONRPC_-32001")
				default:
					if resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
						t.Fatalf("%s: outcome %v %v", form, resp.GetOutcome(), resp.GetError())
					}
				}
				// The marker shows the credential was there and replaced.
				if got := strings.Join(fixture.ProtoStrings(resp), "\n"); !strings.Contains(got, RedactedCredential) {
					t.Errorf("%s: no %q in the response: %s", form, RedactedCredential, got)
				}
			}

			snap, err := e.srv.Discover(testkit.AsService(context.Background(), identity.Operator), &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()})
			if err != nil {
				t.Fatal(err)
			}
			see(snap)
			if kind == "stdio" {
				found := false
				for _, tool := range snap.GetTools() {
					if tool.GetName() == "leak_forms" {
						found = strings.Count(tool.GetDescription(), RedactedCredential) >= 10
					}
				}
				if !found {
					t.Errorf("no leak_forms tool with its forms scrubbed in %v", snap.GetTools())
				}
			}
			e.registry.mu.Lock()
			for _, s := range e.registry.snapshots {
				see(s)
			}
			e.registry.mu.Unlock()
			e.evidence.mu.Lock()
			if len(e.evidence.events) < len(fixture.LeakForms) {
				t.Errorf("%d trace events, want one per call", len(e.evidence.events))
			}
			for _, ev := range e.evidence.events {
				see(ev)
			}
			e.evidence.mu.Unlock()
			seen = append(seen, logs.String())
			if leaks := fixture.Leaks(secret, seen...); len(leaks) > 0 {
				t.Errorf("the credential got out in %d forms: %q", len(leaks), leaks)
			}
		})
	}
}
