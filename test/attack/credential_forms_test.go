package attack_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/v0m3/v0m3/demo/fixture"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/adapter"
	"github.com/v0m3/v0m3/suite"
)

// TestChangedCredentialIsScrubbed replays the finding "a credential echoed
// upper-cased, lower-cased, percent-encoded with lower-case hex,
// base32-encoded, MIME-wrapped or split across two content items reaches
// the agent, the trace, evidence and the discovery snapshot". A reviewed
// local server (the real fixture, in the real sandbox, started by the
// real suite) echoes the credential it was given in each changed form,
// split between two places of one call, and in its tool description and
// input schema. No form of it reaches the answer the orchestrator gets,
// the task's trace, the discovery snapshot (returned and recorded), or the
// suite's log.
func TestChangedCredentialIsScrubbed(t *testing.T) {
	t.Parallel()
	var logs testkit.SyncBuffer
	s, err := suite.Start(context.Background(), suite.Config{
		DataDir: t.TempDir(),
		Reach:   &suite.Reach{StdioRoots: []string{filepath.Dir(fixtureBin)}, AllowLoopback: true},
		Log:     slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)

	b := make([]byte, 24)
	_, _ = rand.Read(b)
	secret := "Vm3-" + base64.RawURLEncoding.EncodeToString(b) + "_Zq" // both cases, '-' and '_'
	conn, err := s.Registry.CreateConnection(testkit.As(s, ivan), &registryv1.CreateConnectionRequest{
		DisplayName: "echoing server", Owner: "platform-team", CredentialRef: "file:token",
		Transport: &registryv1.Transport{Kind: &registryv1.Transport_Stdio{Stdio: &registryv1.StdioTransport{
			Command: fixtureBin, Args: []string{"--transport", "stdio", "--hostile"},
		}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	// The credential lives in the connection's own directory under the
	// adapter's credential roots, as a mounted Secret would.
	if err := os.MkdirAll(s.CredentialDir(conn.GetId()), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.CredentialDir(conn.GetId()), "token"), []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if conn, err = s.ApproveConnection(context.Background(), conn); err != nil {
		t.Fatal(err)
	}
	var seen []string
	see := func(m proto.Message) { seen = append(seen, fixture.ProtoStrings(m)...) }

	// Discovery: the returned snapshot and the recorded one.
	snap, err := s.Adapter.Discover(testkit.As(s, ivan), &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	see(snap)
	described := false
	for _, tool := range snap.GetTools() {
		if tool.GetName() == "leak_forms" {
			described = strings.Count(tool.GetDescription(), adapter.RedactedCredential) >= 10
		}
	}
	if !described {
		t.Errorf("no leak_forms tool with its credential forms replaced in %v", snap.GetTools())
	}
	snaps, err := s.Registry.ListSnapshots(testkit.As(s, ivan), &registryv1.ListSnapshotsRequest{ConnectionId: conn.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	if len(snaps.GetSnapshots()) == 0 {
		t.Fatal("no snapshot recorded")
	}
	see(snaps)

	// Each form, through Execute as the orchestrator calls it, with a
	// grant for exactly that call.
	peers := peers(t, s, suite.Orchestrator)
	orch := creds(t, s, identity.Orchestrator)
	const task = "task_echoed_forms"
	for i, form := range fixture.LeakForms {
		a, err := structpb.NewStruct(map[string]any{"where": form})
		if err != nil {
			t.Fatal(err)
		}
		req := sign(t, orch, &adapterv1.ExecuteRequest{
			ConnectionId: conn.GetId(), ConfigRevision: conn.GetConfigRevision(), MappingId: "map_echo", MappingRevision: 1,
			Target:    &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: "leak"},
			Arguments: a, Limits: &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 4},
			TaskId: task, AttemptId: "att_form_" + string(rune('a'+i)),
		}, nil, time.Minute)
		resp, err := peers.Adapter.Execute(context.Background(), req)
		if err != nil {
			t.Fatalf("%s: Execute: %v (code %v)", form, err, status.Code(err))
		}
		see(resp)
		want := map[string]string{"split_error": adapter.CodeToolError, "split_rpc_data": "JSONRPC_-32001"}[form]
		if got := resp.GetError().GetSafeCode(); got != want {
			t.Errorf("%s: outcome %v safe code %q, want %q", form, resp.GetOutcome(), got, want)
		}
		if !strings.Contains(strings.Join(fixture.ProtoStrings(resp), "\n"), adapter.RedactedCredential) {
			t.Errorf("%s: no %q in the answer %v", form, adapter.RedactedCredential, resp)
		}
	}

	// The task's trace: one protocol event per call, written once the
	// calls returned.
	var trace *evidencev1.Trace
	testkit.Eventually(t, "a protocol event for every call", func() bool {
		trace, err = s.Evidence.GetTrace(testkit.As(s, audrey), &evidencev1.GetTraceRequest{TaskId: task})
		return err == nil && len(trace.GetEvents()) >= len(fixture.LeakForms)
	})
	see(trace)
	seen = append(seen, logs.String())
	if leaks := fixture.Leaks(secret, seen...); len(leaks) > 0 {
		t.Errorf("the credential got out in %d forms: %q", len(leaks), leaks)
	}
}
