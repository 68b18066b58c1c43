package adapter

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/v0m3/v0m3/demo/fixture"
	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// rawConn registers a connection to one of the fixture's hand-written,
// protocol-breaking stdio servers.
func (e *env) rawConn(mode string) *registryv1.Connection {
	return e.registry.add(&registryv1.Connection{DisplayName: "raw " + mode, Transport: &registryv1.Transport{
		Kind: &registryv1.Transport_Stdio{Stdio: &registryv1.StdioTransport{Command: fixtureBin, Args: []string{"--raw", mode}}},
	}})
}

// warm opens conn's pooled session, untimed: starting a server process
// and initializing may take seconds on a loaded machine, and a test whose
// deadline is for the call should not spend it there.
func warm(t *testing.T, e *env, conn *registryv1.Connection) {
	t.Helper()
	pe, _, err := e.srv.pool.acquire(context.Background(), conn)
	if err != nil {
		t.Fatalf("open the session: %v", err)
	}
	pe.release(false)
}

// TestHostileServers: each misbehaviour ends in its defined outcome, and
// the adapter keeps serving afterwards.
func TestHostileServers(t *testing.T) {
	t.Parallel()
	// The session is opened before a deadline starts (see warm): the
	// deadline bounds the call alone, which is sent at once.
	const deadline = 5 * time.Second
	cases := []struct {
		name    string
		mode    string
		timeout time.Duration
		outcome adapterv1.Outcome
		code    string
		stage   adapterv1.DeliveryStage
	}{
		// A line that starts as JSON and breaks its syntax ends the
		// session: sent, no result.
		{"malformed JSON-RPC", fixture.RawBrokenJSON, 0, adapterv1.Outcome_OUTCOME_UNKNOWN, CodeMalformedMessage, adapterv1.DeliveryStage_DELIVERY_STAGE_SENT},
		// A line that is not JSON at all is noise some servers print on
		// stdout: dropped, so the call gets no answer and ends at its
		// deadline, sent, no result.
		{"non-JSON answer", fixture.RawMalformed, deadline, adapterv1.Outcome_OUTCOME_UNKNOWN, CodeDeadlineExceeded, adapterv1.DeliveryStage_DELIVERY_STAGE_SENT},
		// A result of the wrong shape is not a result.
		{"result of the wrong shape", fixture.RawBadResult, 0, adapterv1.Outcome_OUTCOME_UNKNOWN, CodeMalformedResult, adapterv1.DeliveryStage_DELIVERY_STAGE_SENT},
		// A trickle (about 15 s for the whole answer) is cut by the
		// caller's deadline.
		{"slow trickle", fixture.RawTrickle, deadline, adapterv1.Outcome_OUTCOME_UNKNOWN, CodeDeadlineExceeded, adapterv1.DeliveryStage_DELIVERY_STAGE_SENT},
		// A list change during the call changes nothing about the call.
		{"tool list changed mid-call", fixture.RawListChanged, 0, adapterv1.Outcome_OUTCOME_OK, "", adapterv1.DeliveryStage_DELIVERY_STAGE_RESULT_OBSERVED},
	}
	e := newEnv(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			conn := e.rawConn(tc.mode)
			ctx := context.Background()
			if tc.timeout > 0 {
				warm(t, e, conn)
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.timeout)
				defer cancel()
			}
			resp, err := e.srv.Execute(ctx, granted(t, call(t, conn, "echo", map[string]any{}, nil)))
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetOutcome() != tc.outcome || resp.GetError().GetSafeCode() != tc.code || resp.GetStage() != tc.stage {
				t.Errorf("outcome %v code %q stage %v, want %v %q %v (detail %q)", resp.GetOutcome(), resp.GetError().GetSafeCode(),
					resp.GetStage(), tc.outcome, tc.code, tc.stage, resp.GetError().GetUntrustedDetail())
			}
			if tc.outcome != adapterv1.Outcome_OUTCOME_OK && len(resp.GetItems()) != 0 {
				t.Errorf("a failed call returned items")
			}
		})
	}
	t.Run("server exits during the call", func(t *testing.T) {
		t.Parallel()
		resp := execute(t, e, call(t, e.stdioConn("--hostile"), "crash", map[string]any{}, nil))
		wantFailure(t, resp, adapterv1.Outcome_OUTCOME_UNKNOWN, CodeTransportClosed)
	})
	t.Run("the adapter still serves", func(t *testing.T) {
		t.Parallel()
		if r := execute(t, e, call(t, e.stdioConn(), "search", map[string]any{"query": "cursor"}, &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 10, AllowedMediaTypes: []string{"text/markdown"}})); r.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
			t.Errorf("resp = %v", r)
		}
	})
}

// TestDiscoveryWithChangingLists: a snapshot is one consistent listing; a
// server whose lists never settle gets no snapshot.
func TestDiscoveryWithChangingLists(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	snap, err := e.srv.Discover(testkit.AsService(ctx, identity.Operator), &adapterv1.DiscoverRequest{ConnectionId: e.rawConn(fixture.RawListChangedOnce).GetId()})
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.GetTools()) != 1 || snap.GetTools()[0].GetDescription() != fixture.RawToolDescription(2) {
		t.Errorf("snapshot tools = %v, want the settled listing (version 2)", snap.GetTools())
	}
	_, err = e.srv.Discover(testkit.AsService(ctx, identity.Operator), &adapterv1.DiscoverRequest{ConnectionId: e.rawConn(fixture.RawListChanged).GetId()})
	if !apierror.Is(err, codes.Unavailable, "DISCOVERY_UNSTABLE") {
		t.Errorf("Discover of a server that never settles: %v", err)
	}
	e.registry.mu.Lock()
	n := len(e.registry.snapshots)
	e.registry.mu.Unlock()
	if n != 1 {
		t.Errorf("%d snapshots recorded, want 1", n)
	}
}

// TestNotificationFlood: a server that floods notifications during a call
// cannot hold the attempt open until its deadline: past the bound the
// call is cancelled and ends as NOTIFICATION_LIMIT_EXCEEDED, outcome
// unknown (the request was sent; what the server did is not known), and
// the connection serves the next call. Notifications under the bound
// change nothing.
func TestNotificationFlood(t *testing.T) {
	t.Parallel()
	transports(t, func(t *testing.T, e *env, conn *registryv1.Connection) {
		t.Run("under the bound", func(t *testing.T) {
			// About 300 KB of notifications: more than the call's
			// response limit (64 KiB), which bounds the response alone.
			resp := execute(t, e, call(t, conn, "notify_flood", map[string]any{"count": 2000}, nil))
			if resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK || len(resp.GetItems()) != 1 {
				t.Fatalf("outcome %v code %q, want OK with the answer", resp.GetOutcome(), resp.GetError().GetSafeCode())
			}
		})
		t.Run("flood", func(t *testing.T) {
			const timeout = 2 * time.Minute
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			// Far more than the bound: without it the call would run
			// until the server finished (or the deadline) and answer, so
			// the outcome alone tells the bound ended it.
			resp, err := e.srv.Execute(ctx, granted(t, call(t, conn, "notify_flood", map[string]any{"count": 5_000_000}, nil)))
			if err != nil {
				t.Fatal(err)
			}
			wantFailure(t, resp, adapterv1.Outcome_OUTCOME_UNKNOWN, CodeNotificationLimitExceeded)
			if resp.GetStage() < adapterv1.DeliveryStage_DELIVERY_STAGE_SENT || resp.GetStage() == adapterv1.DeliveryStage_DELIVERY_STAGE_RESULT_OBSERVED {
				t.Errorf("stage %v, want sent or acknowledged", resp.GetStage())
			}
			if !strings.Contains(resp.GetError().GetAdapterDetail(), fmt.Sprint(maxNotificationsPerCall)) {
				t.Errorf("adapter detail %q does not name the bound", resp.GetError().GetAdapterDetail())
			}
		})
		t.Run("the connection still serves", func(t *testing.T) {
			resp := execute(t, e, call(t, conn, "pid", map[string]any{}, nil))
			if resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
				t.Fatalf("outcome %v code %q after the flood", resp.GetOutcome(), resp.GetError().GetSafeCode())
			}
		})
	})
}

// TestUnsupportedProtocolVersion: a server answering initialize with a
// version the adapter does not speak is PROTOCOL_VERSION_UNSUPPORTED,
// naming that version (truncated), from Execute, Discover and Health,
// not SERVER_UNREACHABLE; no snapshot is recorded and no tool is called.
func TestUnsupportedProtocolVersion(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		mode, version string
	}{
		{fixture.RawOldVersion, fixture.RawOldVersionValue},
		{fixture.RawHugeVersion, strings.Repeat("9", maxVersionBytes)},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			t.Parallel()
			var logs testkit.SyncBuffer
			e := newEnvLog(t, slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
			conn := e.rawConn(tc.mode)
			ctx := context.Background()

			resp := execute(t, e, call(t, conn, "echo", map[string]any{}, nil))
			wantFailure(t, resp, adapterv1.Outcome_OUTCOME_UNAVAILABLE, CodeProtocolVersionUnsupported)
			if resp.GetError().GetUntrustedDetail() != tc.version || resp.GetStage() != adapterv1.DeliveryStage_DELIVERY_STAGE_PREPARED {
				t.Errorf("detail %.80q stage %v, want the server's version %.80q and nothing sent", resp.GetError().GetUntrustedDetail(), resp.GetStage(), tc.version)
			}

			_, err := e.srv.Discover(testkit.AsService(ctx, identity.Operator), &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()})
			if !apierror.Is(err, codes.FailedPrecondition, CodeProtocolVersionUnsupported) {
				t.Errorf("Discover: %.300v", err)
			}
			if info := apierror.Info(err); info.GetMetadata()["server_version"] != tc.version {
				t.Errorf("Discover names server_version %.80q, want %.80q", info.GetMetadata()["server_version"], tc.version)
			}
			if n := len(status.Convert(err).Message()); n > 1024 {
				t.Errorf("Discover's error message is %d bytes", n)
			}
			e.registry.mu.Lock()
			snaps := len(e.registry.snapshots)
			e.registry.mu.Unlock()
			if snaps != 0 {
				t.Errorf("%d snapshots recorded", snaps)
			}

			h, err := e.srv.Health(ctx, &adapterv1.HealthRequest{ConnectionId: conn.GetId()})
			if err != nil {
				t.Fatal(err)
			}
			if h.GetHealthy() || !strings.Contains(h.GetDetail(), CodeProtocolVersionUnsupported) || !strings.Contains(h.GetDetail(), tc.version) || len(h.GetDetail()) > 1024 {
				t.Errorf("health %v detail %.200q, want unhealthy naming the reason and version", h.GetHealthy(), h.GetDetail())
			}
			if r := e.policy.last(); r == nil || r.GetState() != policyv1.HealthState_HEALTH_STATE_DEGRADED {
				t.Errorf("policy heard %v, want the connection reported unhealthy", r)
			}

			// Untrusted text reaches the log truncated.
			for line := range strings.Lines(logs.String()) {
				if len(line) > 4<<10 {
					t.Errorf("a log line of %d bytes: %.200s", len(line), line)
				}
			}
		})
	}
}

// TestServerNotReadingStdin: a local server that stops reading its stdin
// cannot hold a call past its deadline: the call's request, larger than
// the pipe holds, blocks in the write, and the deadline ends it all the
// same, with nothing delivered (the request never went out whole); the
// process is reaped.
func TestServerNotReadingStdin(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	conn := e.rawConn(fixture.RawDeaf)
	// The pipe holds 64 KiB; these arguments do not fit.
	req := granted(t, call(t, conn, "echo", map[string]any{"text": strings.Repeat("x", 1<<20)}, nil))
	// The session is open before the deadline starts: the write is what
	// it cuts.
	warm(t, e, conn)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	done := make(chan *adapterv1.ExecuteResponse, 1)
	go func() {
		resp, err := e.srv.Execute(ctx, req)
		if err != nil {
			t.Error(err)
		}
		done <- resp
	}()
	var resp *adapterv1.ExecuteResponse
	select {
	case resp = <-done:
	case <-time.After(2 * time.Minute):
		// Not a timing assertion: without the fix the call never returns.
		t.Fatal("Execute did not return long after its deadline: it is stuck writing to a server that does not read")
	}
	wantFailure(t, resp, adapterv1.Outcome_OUTCOME_UNAVAILABLE, CodeServerUnreachable)
	if resp.GetStage() != adapterv1.DeliveryStage_DELIVERY_STAGE_PREPARED {
		t.Errorf("stage %v, want prepared: the request never went out whole", resp.GetStage())
	}
	// Closing the adapter waits for every session's closing: the server
	// process, which never exits on its own, is killed and reaped.
	_ = e.srv.Close()
	if n := e.srv.ProcessesLive(); n != 0 {
		t.Errorf("%d server processes still live after the adapter closed", n)
	}
}

// TestServerFloodsBetweenCalls: a local server that sends messages
// without end while no call is in flight (which no call's notification
// bound covers) has its session ended once they pass the same bounds,
// instead of having the client library queue them without limit until
// the idle timeout; its process is reaped.
func TestServerFloodsBetweenCalls(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	conn := e.rawConn(fixture.RawIdleFlood)
	ss, err := e.srv.openSession(context.Background(), conn, idleMessageLimit, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.close()
	endsForTheFlood(t, ss)
	ss.close()
	if n := e.srv.ProcessesLive(); n != 0 {
		t.Errorf("%d server processes live after the session closed", n)
	}
}

// TestHTTPServerFloodsBetweenCalls: a server that floods the standalone
// stream of its HTTP session with messages while no call is in flight has
// the session ended once they pass the same bounds as over stdio. Cutting
// the stream alone would not do: the client library opens it again, and
// queues what comes on it without limit.
func TestHTTPServerFloodsBetweenCalls(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var streams atomic.Int32
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet:
			streams.Add(1)
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			for i := 0; r.Context().Err() == nil; i++ {
				if _, err := fmt.Fprintf(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":\"nobody\",\"progress\":%d}}\n\n", i); err != nil {
					return
				}
				if i%64 == 0 {
					w.(http.Flusher).Flush()
				}
			}
			return
		case http.MethodDelete:
			return
		}
		var req struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.ID) == 0 {
			w.WriteHeader(http.StatusAccepted)
			return
		}
		resp := map[string]any{"jsonrpc": "2.0", "id": req.ID}
		if req.Method == "initialize" {
			resp["result"] = map[string]any{"protocolVersion": "2025-11-25", "capabilities": map[string]any{"tools": map[string]any{}},
				"serverInfo": map[string]any{"name": "flood", "version": "1"}}
		} else {
			resp["error"] = map[string]any{"code": -32601, "message": "method not found"}
		}
		w.Header().Set("Mcp-Session-Id", "flood-session")
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(resp)
	}))
	t.Cleanup(func() {
		ts.CloseClientConnections()
		ts.Close()
	})
	// A pooled session listens for list changes: it opens the standalone
	// stream.
	ss, err := e.srv.openSession(context.Background(), e.httpConn(ts.URL), idleMessageLimit, func() {})
	if err != nil {
		t.Fatal(err)
	}
	defer ss.close()
	endsForTheFlood(t, ss)
	if n := streams.Load(); n == 0 {
		t.Error("the session never opened its standalone stream: the flood was not what ended it")
	}
}

// endsForTheFlood waits for ss to end and checks that it ended because its
// server flooded it between calls.
func endsForTheFlood(t *testing.T, ss *session) {
	t.Helper()
	ended := make(chan struct{})
	go func() {
		_ = ss.cs.Wait()
		close(ended)
	}()
	select {
	case <-ended:
	case <-time.After(2 * time.Minute):
		// Not a timing assertion: without the bound the session lives on.
		t.Fatal("the session is still open while its server floods it")
	}
	if !ss.m.idleFlooded.Load() {
		t.Error("the session ended, but not for the flood")
	}
}

// TestListsThatNeverSettle: a pooled session whose server answers every
// rediscovery with another list change is not described again without
// end (thousands of rounds, each reporting the connection's health to
// policy, within seconds): after a few rounds it stops taking calls and
// closes, its process reaped; the next call gets a new session.
func TestListsThatNeverSettle(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	conn := e.rawConn(fixture.RawListChanged)
	if r := execute(t, e, call(t, conn, "echo", map[string]any{}, nil)); r.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
		t.Fatalf("outcome %v %v", r.GetOutcome(), r.GetError())
	}
	testkit.Eventually(t, "the session of a server whose lists never settle is closed", func() bool {
		return e.srv.pool.stats().Sessions == 0 && e.srv.ProcessesLive() == 0
	})
	e.policy.mu.Lock()
	reports := len(e.policy.reports)
	e.policy.mu.Unlock()
	if reports > maxRediscoveryRounds {
		t.Errorf("%d health reports, want at most one per rediscovery round (%d)", reports, maxRediscoveryRounds)
	}
	if r := execute(t, e, call(t, conn, "echo", map[string]any{}, nil)); r.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
		t.Errorf("the next call: %v %v", r.GetOutcome(), r.GetError())
	}
}
