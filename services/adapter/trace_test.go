package adapter

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/v0m3/v0m3/internal/store"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
)

// An evidence outage during calls does not lose their protocol events:
// the calls answer without waiting for evidence beyond the first, and
// once evidence is back every event is appended, in order, once, under
// the delivery id of its attempt (so one sent again after a timeout
// evidence did store is stored once).
func TestProtocolEventsSurviveAnEvidenceOutage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.srv.traces.SetFirstRetry(10 * time.Millisecond)
	conn := e.httpConn(httpURL)
	e.evidence.setDown(true)
	attempts := []string{"att_1", "att_2", "att_3"}
	for _, att := range attempts {
		req := call(t, conn, "slow", map[string]any{"ms": 0}, nil)
		req.TaskId, req.AttemptId = "task_1", att
		if resp := execute(t, e, req); resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
			t.Fatalf("%s: outcome %v while evidence is down, want OK: the call does not depend on its trace", att, resp.GetOutcome())
		}
	}
	if got := e.evidence.appended(); len(got) != 0 {
		t.Fatalf("evidence took %d events while down", len(got))
	}
	e.evidence.setDown(false)
	testkit.Eventually(t, "evidence takes the events queued while it was down", func() bool { return len(e.evidence.appended()) >= len(attempts) })
	got := e.evidence.appended()
	if len(got) != len(attempts) {
		t.Fatalf("after the outage evidence holds %d protocol events, want %d", len(got), len(attempts))
	}
	for i, ev := range got {
		if att := ev.GetProtocol().GetRequestId(); att != attempts[i] || ev.GetDeliveryId() != protocolDeliveryID(att) || ev.GetTaskId() != "task_1" {
			t.Errorf("event %d: attempt %s, delivery id %q, task %s; want attempt %s in order, its delivery id, task_1",
				i, att, ev.GetDeliveryId(), ev.GetTaskId(), attempts[i])
		}
	}
}

// A stopping adapter appends the protocol events still waiting for
// evidence (the suite calls FlushTraces while evidence still serves).
func TestFlushTracesAppendsWhatWaits(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.srv.traces.SetFirstRetry(time.Hour) // only the flush appends it
	e.evidence.setDown(true)
	req := call(t, e.httpConn(httpURL), "slow", map[string]any{"ms": 0}, nil)
	req.TaskId = "task_1"
	execute(t, e, req)
	e.evidence.setDown(false)
	e.srv.FlushTraces(context.Background())
	if got := e.evidence.appended(); len(got) != 1 || got[0].GetProtocol().GetRequestId() != req.GetAttemptId() {
		t.Errorf("after FlushTraces evidence holds %v, want the waiting event", got)
	}
}

// With a TraceSpool (the suite gives the adapter one in its store), the
// protocol events evidence did not take survive the adapter stopping, or
// crashing, during the outage: the next adapter on that store appends
// them, and the store keeps nothing once evidence took them.
func TestProtocolEventsSurviveAnAdapterRestart(t *testing.T) {
	t.Parallel()
	db, err := store.Open(filepath.Join(t.TempDir(), "adapter.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	spool := db.Spool("protocol-trace")
	var deps Deps
	e := newEnvWith(t, slog.New(slog.DiscardHandler), func(d *Deps) { d.TraceSpool = spool; deps = *d })
	e.srv.traces.SetFirstRetry(time.Hour) // evidence stays out for this adapter's life
	e.evidence.setDown(true)
	req := call(t, e.httpConn(httpURL), "slow", map[string]any{"ms": 0}, nil)
	req.TaskId = "task_1"
	execute(t, e, req)
	e.srv.FlushTraces(context.Background()) // evidence is still out
	_ = e.srv.Close()
	if kept, err := spool.List(context.Background()); err != nil || len(kept) != 1 {
		t.Fatalf("after the adapter stopped its store keeps %d events (%v), want the one evidence did not take", len(kept), err)
	}

	e.evidence.setDown(false)
	next := NewServer(deps, slog.New(slog.DiscardHandler))
	defer next.Close()
	next.traces.SetFirstRetry(time.Millisecond)
	if err := next.RecoverTraces(context.Background()); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the restarted adapter sends the kept event", func() bool { return len(e.evidence.appended()) > 0 })
	if got := e.evidence.appended(); len(got) != 1 || got[0].GetProtocol().GetRequestId() != req.GetAttemptId() ||
		got[0].GetDeliveryId() != protocolDeliveryID(req.GetAttemptId()) {
		t.Fatalf("after the restart evidence holds %v, want the call's protocol event with its delivery id", got)
	}
	testkit.Eventually(t, "the adapter's store no longer keeps the event evidence took", func() bool {
		kept, _ := spool.List(context.Background())
		return len(kept) == 0
	})
}
