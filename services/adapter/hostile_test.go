package adapter

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/fixture"
	"github.com/v0m3/v0m3/services/internal/apierror"
)

// rawConn registers a connection to one of the fixture's hand-written,
// protocol-breaking stdio servers.
func (e *env) rawConn(mode string) *registryv1.Connection {
	return e.registry.add(&registryv1.Connection{DisplayName: "raw " + mode, Transport: &registryv1.Transport{
		Kind: &registryv1.Transport_Stdio{Stdio: &registryv1.StdioTransport{Command: fixtureBin, Args: []string{"--raw", mode}}},
	}})
}

// TestHostileServers: each misbehaviour ends in its defined outcome, and
// the adapter keeps serving afterwards.
func TestHostileServers(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		mode    string
		timeout time.Duration
		outcome adapterv1.Outcome
		code    string
		stage   adapterv1.DeliveryStage
	}{
		// A line that is not JSON ends the session: sent, no result.
		{"malformed JSON-RPC", fixture.RawMalformed, 0, adapterv1.Outcome_OUTCOME_UNKNOWN, CodeMalformedMessage, adapterv1.DeliveryStage_DELIVERY_STAGE_SENT},
		// A result of the wrong shape is not a result.
		{"result of the wrong shape", fixture.RawBadResult, 0, adapterv1.Outcome_OUTCOME_UNKNOWN, CodeMalformedResult, adapterv1.DeliveryStage_DELIVERY_STAGE_SENT},
		// A trickle is cut by the caller's deadline.
		{"slow trickle", fixture.RawTrickle, time.Second, adapterv1.Outcome_OUTCOME_UNKNOWN, CodeDeadlineExceeded, adapterv1.DeliveryStage_DELIVERY_STAGE_SENT},
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
	snap, err := e.srv.Discover(asOperator(ctx), &adapterv1.DiscoverRequest{ConnectionId: e.rawConn(fixture.RawListChangedOnce).GetId()})
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.GetTools()) != 1 || snap.GetTools()[0].GetDescription() != fixture.RawToolDescription(2) {
		t.Errorf("snapshot tools = %v, want the settled listing (version 2)", snap.GetTools())
	}
	_, err = e.srv.Discover(asOperator(ctx), &adapterv1.DiscoverRequest{ConnectionId: e.rawConn(fixture.RawListChanged).GetId()})
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
