package adapter

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/demo/fixture"
	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/grant"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/identity/identitytest"
	"github.com/v0m3/v0m3/internal/receipt"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// loggedConn registers a stdio fixture connection whose server logs every
// request it receives to the returned file; the file exists only once a
// server process has started.
func (e *env) loggedConn(t *testing.T) (*registryv1.Connection, string) {
	t.Helper()
	// A root adapter runs the server under a uid of its own.
	log := filepath.Join(testkit.WritableDir(t), "calls.jsonl")
	return e.stdioConn("--hostile", "--call-log", log), log
}

// wantNothingStarted fails unless no fixture process ever started for the
// call log (the server creates it as it starts) and no protocol trace
// event was appended.
func wantNothingStarted(t *testing.T, e *env, log string) {
	t.Helper()
	if _, err := os.Stat(log); !os.IsNotExist(err) {
		b, _ := os.ReadFile(log)
		t.Errorf("a server process started (call log: %q)", b)
	}
	e.evidence.mu.Lock()
	defer e.evidence.mu.Unlock()
	if n := len(e.evidence.events); n != 0 {
		t.Errorf("%d protocol trace events appended for a refused call", n)
	}
}

// TestExecuteWithoutValidGrantChangesNothing plays a caller that reached
// Execute (e.g. with the orchestrator's network position) and brings no
// grant, a forged one, someone else's, an expired one, or a real grant for
// a different call: each is refused with PERMISSION_DENIED and its reason
// before any process starts or any request is sent.
func TestExecuteWithoutValidGrantChangesNothing(t *testing.T) {
	t.Parallel()
	p := testPKI(t)
	impostor := identitytest.Credentials(t, identity.Orchestrator)[0]
	registryCreds, err := p.ca.Issue(identity.Registry)
	if err != nil {
		t.Fatal(err)
	}
	// mismatch changes a granted request after signing.
	mismatch := func(field string, change func(*adapterv1.ExecuteRequest)) func(*testing.T, *adapterv1.ExecuteRequest) (*adapterv1.ExecuteRequest, string, string) {
		return func(t *testing.T, req *adapterv1.ExecuteRequest) (*adapterv1.ExecuteRequest, string, string) {
			req = granted(t, req)
			change(req)
			return req, grant.ReasonMismatch, field
		}
	}
	tests := []struct {
		name string
		// attack returns the request sent, the reason and field expected.
		attack func(*testing.T, *adapterv1.ExecuteRequest) (*adapterv1.ExecuteRequest, string, string)
	}{
		{"no grant", func(_ *testing.T, req *adapterv1.ExecuteRequest) (*adapterv1.ExecuteRequest, string, string) {
			return req, grant.ReasonMissing, ""
		}},
		{"not a signed token", func(_ *testing.T, req *adapterv1.ExecuteRequest) (*adapterv1.ExecuteRequest, string, string) {
			req.Grant = "eyJhbGciOiJub25lIn0.eyJncmFudF9pZCI6IngifQ."
			return req, grant.ReasonInvalid, ""
		}},
		{"signed by an orchestrator certificate of another CA", func(t *testing.T, req *adapterv1.ExecuteRequest) (*adapterv1.ExecuteRequest, string, string) {
			return grantedBy(t, impostor, req, time.Minute), grant.ReasonInvalid, ""
		}},
		{"signed by the adapter itself", func(t *testing.T, req *adapterv1.ExecuteRequest) (*adapterv1.ExecuteRequest, string, string) {
			return grantedBy(t, p.adapter, req, time.Minute), grant.ReasonInvalid, ""
		}},
		{"signed by another peer service", func(t *testing.T, req *adapterv1.ExecuteRequest) (*adapterv1.ExecuteRequest, string, string) {
			return grantedBy(t, registryCreds, req, time.Minute), grant.ReasonInvalid, ""
		}},
		{"a receipt attestation passed off as a grant", func(t *testing.T, req *adapterv1.ExecuteRequest) (*adapterv1.ExecuteRequest, string, string) {
			tok, err := receipt.Attest(p.orchestrator, receipt.Attestation{AttemptID: req.GetAttemptId()}, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			req.Grant = tok
			return req, grant.ReasonInvalid, ""
		}},
		{"expired", func(t *testing.T, req *adapterv1.ExecuteRequest) (*adapterv1.ExecuteRequest, string, string) {
			return grantedBy(t, p.orchestrator, req, -time.Minute), grant.ReasonExpired, ""
		}},
		{"another attempt", mismatch("attempt_id", func(r *adapterv1.ExecuteRequest) { r.AttemptId = "att_other" })},
		{"another task", mismatch("task_id", func(r *adapterv1.ExecuteRequest) { r.TaskId = "task_other" })},
		{"another connection", mismatch("connection_id", func(r *adapterv1.ExecuteRequest) { r.ConnectionId = "conn_other" })},
		{"another config revision", mismatch("config_revision", func(r *adapterv1.ExecuteRequest) { r.ConfigRevision++ })},
		{"a made-up mapping", mismatch("mapping_id", func(r *adapterv1.ExecuteRequest) { r.MappingId = "map_made_up" })},
		{"another mapping revision", mismatch("mapping_revision", func(r *adapterv1.ExecuteRequest) { r.MappingRevision++ })},
		{"another tool", mismatch("target", func(r *adapterv1.ExecuteRequest) { r.Target.Name = "crash" })},
		{"a resource instead of the tool", mismatch("target_kind", func(r *adapterv1.ExecuteRequest) {
			r.Target.Kind = registryv1.RemoteKind_REMOTE_KIND_RESOURCE
		})},
		{"other arguments", mismatch("arguments", func(r *adapterv1.ExecuteRequest) { r.Arguments = args(t, map[string]any{"query": "private"}) })},
		{"looser limits", mismatch("limits", func(r *adapterv1.ExecuteRequest) { r.Limits.MaxResponseBytes = maxResponseBytesCap })},
		{"disallowed items dropped instead of failing", mismatch("limits", func(r *adapterv1.ExecuteRequest) { r.Limits.DropDisallowedItems = true })},
		{"elicitation answered with defaults instead of declined", mismatch("limits", func(r *adapterv1.ExecuteRequest) {
			r.Limits.Elicitation = registryv1.ElicitationPolicy_ELICITATION_POLICY_ACCEPT_DEFAULTS
		})},
		{"no output schema to judge the result", mismatch("output_schema", func(r *adapterv1.ExecuteRequest) { r.OutputSchema = nil })},
		{"another output schema", mismatch("output_schema", func(r *adapterv1.ExecuteRequest) { r.OutputSchema = args(t, map[string]any{"type": "object"}) })},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			conn, log := e.loggedConn(t)
			req := call(t, conn, "search", map[string]any{"query": "migration"}, nil)
			req.TaskId = "task_1"
			req.OutputSchema = args(t, map[string]any{"type": "object", "properties": map[string]any{"hits": map[string]any{"type": "array"}}})
			sent, reason, field := tc.attack(t, req)
			_, err := e.srv.Execute(context.Background(), sent)
			if !apierror.Is(err, codes.PermissionDenied, reason) || apierror.Info(err).GetMetadata()["field"] != field {
				t.Fatalf("Execute = %v (metadata %v), want PERMISSION_DENIED %s field %q", err, apierror.Info(err).GetMetadata(), reason, field)
			}
			wantNothingStarted(t, e, log)
		})
	}
}

// TestGrantIsUsedOnce replays a granted request: the first runs, the
// replay is refused and reaches nothing.
func TestGrantIsUsedOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	conn, log := e.loggedConn(t)
	req := granted(t, call(t, conn, "search", map[string]any{"query": "migration"}, nil))
	if resp, err := e.srv.Execute(context.Background(), req); err != nil || resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
		t.Fatalf("first use: %v, %v", resp, err)
	}
	_, err := e.srv.Execute(context.Background(), proto.CloneOf(req))
	if !apierror.Is(err, codes.PermissionDenied, grant.ReasonUsed) {
		t.Fatalf("replay: %v, want GRANT_USED", err)
	}
	var calls int
	for _, entry := range readCallLog(t, log) {
		if entry.Method == "tools/call" {
			calls++
		}
	}
	if calls != 1 {
		t.Errorf("the server received %d tool calls, want 1", calls)
	}
}

// TestAdapterWithoutCertificate: an adapter that cannot verify grants
// refuses every call, unless it was explicitly started for plaintext
// development.
func TestAdapterWithoutCertificate(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, slog.New(slog.DiscardHandler), func(d *Deps) { d.Credentials = nil })
	conn, log := e.loggedConn(t)
	req := call(t, conn, "search", map[string]any{"query": "migration"}, nil)
	if _, err := e.srv.Execute(context.Background(), granted(t, req)); !apierror.Is(err, codes.PermissionDenied, grant.ReasonUnverifiable) {
		t.Fatalf("Execute = %v, want GRANT_UNVERIFIABLE", err)
	}
	wantNothingStarted(t, e, log)

	dev := newEnvWith(t, slog.New(slog.DiscardHandler), func(d *Deps) { d.Credentials, d.InsecureUngranted = nil, true })
	conn = dev.stdioConn()
	resp, err := dev.srv.Execute(context.Background(), call(t, conn, "search", map[string]any{"query": "migration"}, nil))
	if err != nil || resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK || resp.GetReceiptAttestation() != "" {
		t.Fatalf("plaintext development Execute = %v, %v; want OK without an attestation", resp, err)
	}
}

// TestReceiptAttestation: an OK result carries the adapter's signed
// attestation of what it observed for the granted attempt; a failed one
// attests nothing.
func TestReceiptAttestation(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	conn := e.stdioConn("--hostile")
	req := call(t, conn, "search", map[string]any{"query": "migration"}, nil)
	req.TaskId = "task_1"
	req = granted(t, req)
	g, err := grant.Verify(testPKI(t).adapter, req.GetGrant(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	resp, err := e.srv.Execute(context.Background(), req)
	if err != nil || resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
		t.Fatalf("Execute = %v, %v", resp, err)
	}
	a, err := receipt.Verify(testPKI(t).orchestrator, resp.GetReceiptAttestation())
	if err != nil {
		t.Fatalf("attestation: %v", err)
	}
	want := receipt.Attestation{Type: receipt.Type, GrantID: g.ID, AttemptID: req.GetAttemptId(), IntentID: "int_test", TaskID: "task_1",
		ResponseDigest: resp.GetResponseDigest(), ObservedAt: resp.GetObserveTime().AsTime().Unix()}
	if a != want || a.ResponseDigest == "" {
		t.Errorf("attestation = %+v, want %+v", a, want)
	}
	failed := execute(t, e, call(t, conn, "crash", map[string]any{}, nil))
	if failed.GetOutcome() == adapterv1.Outcome_OUTCOME_OK || failed.GetReceiptAttestation() != "" {
		t.Errorf("failed call: outcome %v, attestation %q", failed.GetOutcome(), failed.GetReceiptAttestation())
	}
	// A caller with no use for an attestation (a read) gets none.
	read := call(t, conn, "search", map[string]any{"query": "migration"}, nil)
	read.OmitReceiptAttestation = true
	if unattested := execute(t, e, read); unattested.GetOutcome() != adapterv1.Outcome_OUTCOME_OK || unattested.GetReceiptAttestation() != "" {
		t.Errorf("call asking for no attestation: outcome %v, attestation %q; want OK and none", unattested.GetOutcome(), unattested.GetReceiptAttestation())
	}
}

// TestResourceReadReadsTheGrantedURI: a resource read reads exactly the
// URI the grant names; a request naming another one is refused before the
// server is reached.
func TestResourceReadReadsTheGrantedURI(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	conn, log := e.loggedConn(t)
	features := fixture.URIPrefix + "changelog"
	req := &adapterv1.ExecuteRequest{
		ConnectionId: conn.GetId(), ConfigRevision: conn.GetConfigRevision(), MappingId: "map_1", MappingRevision: 1,
		Target:    &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_RESOURCE, Name: features},
		Limits:    &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 4},
		AttemptId: "att_1",
	}
	tampered := granted(t, req)
	tampered.Target.Name = fixture.URIPrefix + "migration-faq"
	if _, err := e.srv.Execute(context.Background(), tampered); !apierror.Is(err, codes.PermissionDenied, grant.ReasonMismatch) ||
		apierror.Info(err).GetMetadata()["field"] != "target" {
		t.Fatalf("tampered target: %v, want GRANT_MISMATCH on target", err)
	}
	wantNothingStarted(t, e, log)

	resp := execute(t, e, req)
	if resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK || len(resp.GetItems()) != 1 || resp.GetItems()[0].GetUri() != features {
		t.Fatalf("read = %v", resp)
	}
	for _, entry := range readCallLog(t, log) {
		if entry.Method == "resources/read" && entry.URI != features {
			t.Errorf("the server was asked for %s", entry.URI)
		}
	}
}

func readCallLog(t *testing.T, path string) []fixture.CallLogEntry {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []fixture.CallLogEntry
	for line := range bytes.Lines(b) {
		var entry fixture.CallLogEntry
		if err := json.Unmarshal(line, &entry); err != nil {
			t.Fatalf("call log line %q: %v", line, err)
		}
		out = append(out, entry)
	}
	return out
}
