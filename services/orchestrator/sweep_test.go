package orchestrator

import (
	"context"
	"fmt"
	ostore "github.com/v0m3/v0m3/services/orchestrator/store"
	"sync"
	"testing"
	"time"

	"github.com/v0m3/v0m3/internal/testkit"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
)

// heldDeletes is a Store whose first DeleteTraceOutbox waits for release,
// and which records the keys of every DeleteTraceOutbox.
type heldDeletes struct {
	ostore.Store
	release chan struct{}
	first   sync.Once
	held    chan struct{}

	mu      sync.Mutex
	deletes [][]string
}

func (d *heldDeletes) DeleteTraceOutbox(ctx context.Context, keys []string) error {
	d.first.Do(func() {
		close(d.held)
		<-d.release
	})
	d.mu.Lock()
	d.deletes = append(d.deletes, keys)
	d.mu.Unlock()
	return d.Store.DeleteTraceOutbox(ctx, keys)
}

// A call does not wait for the outbox entries it delivered to be deleted:
// while a sweep's delete is held up, further calls complete. No entry is
// sent twice meanwhile (the outbox loop leaves them), and the outbox ends
// empty.
func TestDeliveredEntriesAreSweptOffTheCallsPath(t *testing.T) {
	t.Parallel()
	st := &heldDeletes{Store: newBoltStore(t), release: make(chan struct{}), held: make(chan struct{})}
	h := newHarnessOn(t, st, func(d *Deps) { d.RecoveryInterval = time.Hour })
	h.server.sweep.Pause = 0 // what no write takes at once is swept
	cat := h.start(t, "source_review", false).GetCatalogue()
	task := cat.GetTaskId()
	handle := handleFor(t, cat, capRetrieveAuthorizedSource, migrationGuide.GetTitle())
	call := func(i int) error {
		r, err := h.submit(t, task, fmt.Sprintf("call_%d", i), capRetrieveAuthorizedSource, map[string]any{"source": handle})
		if err == nil && r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
			err = fmt.Errorf("call %d ended %v", i, r.GetState())
		}
		return err
	}
	if err := call(0); err != nil {
		t.Fatal(err)
	}
	// Nothing follows the first call's last delivery: a sweep deletes it,
	// and is held up.
	<-st.held

	const calls = 3
	done := make(chan error, 1)
	go func() {
		for i := 1; i < calls; i++ {
			if err := call(i); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		close(st.release)
		t.Fatal("the calls waited for the held-up delete of what they delivered")
	}
	h.server.deliverOutbox(t.Context()) // a recovery pass meanwhile
	traced := len(h.evidence.product(task))
	close(st.release)

	testkit.Eventually(t, "the outbox emptied", func() bool {
		rest, err := h.server.st.ListTraceOutbox(t.Context(), 100)
		return err == nil && len(rest) == 0
	})
	h.server.deliverOutbox(t.Context())
	if got := len(h.evidence.product(task)); got != traced {
		t.Fatalf("evidence holds %d product events after the sweep, %d before: entries were sent again", got, traced)
	}
}

// A decision waits behind outbox entries another replica left, not behind
// those this replica's own calls deliver or are deleting.
func TestDecisionWaitsOnlyBehindOthersEntries(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(d *Deps) { d.RecoveryInterval = time.Hour })
	// Evidence is down: no recovery pass delivers (and deletes) the
	// entries under the test.
	h.evidence.tracesDown.Store(true)
	put := func(detail string) ostore.OutboxEntry {
		t.Helper()
		if err := h.server.st.PutTraceOutbox(t.Context(), []*evidencev1.TraceEvent{{TaskId: "task_q",
			Layer: &evidencev1.TraceEvent_Product{Product: &evidencev1.ProductEvent{Detail: detail}}}}); err != nil {
			t.Fatal(err)
		}
		all, err := h.server.st.ListTraceOutbox(t.Context(), 100)
		if err != nil || len(all) == 0 {
			t.Fatalf("outbox = %v, %v", all, err)
		}
		return all[len(all)-1]
	}
	own := put("a call of this replica")
	h.server.direct.Store(own.Key, struct{}{})
	h.server.outboxPending.Store(false)
	h.server.queueBehindOutbox(t.Context())
	if h.server.outboxPending.Load() {
		t.Fatal("a decision queued behind this replica's own call's entry")
	}
	put("left by a stopped replica")
	h.server.queueBehindOutbox(t.Context())
	if !h.server.outboxPending.Load() {
		t.Fatal("a decision did not queue behind an entry a stopped replica left")
	}
}

// Calls made one at a time delete what they delivered in writes they
// make anyway (each call made two store writes of its own for it): the
// next write of the replica carries the deletes. What no write took is
// swept in one delete. While delivered entries wait, the outbox loop
// neither sends them again nor stops at them: an entry behind them, left
// by a stopped replica, is delivered.
func TestDeliveredEntriesRideTheNextWrite(t *testing.T) {
	t.Parallel()
	st := &heldDeletes{Store: newBoltStore(t), release: make(chan struct{}), held: make(chan struct{})}
	close(st.release) // nothing is held up here
	h := newHarnessOn(t, st, func(d *Deps) { d.RecoveryInterval = time.Hour })
	h.server.sweep.Pause = time.Hour // only a batch or closing sweeps
	cat := h.start(t, "source_review", false).GetCatalogue()
	task := cat.GetTaskId()
	handle := handleFor(t, cat, capRetrieveAuthorizedSource, migrationGuide.GetTitle())

	const calls = 3
	var last string
	for i := range calls {
		r, err := h.submit(t, task, fmt.Sprintf("call_%d", i), capRetrieveAuthorizedSource, map[string]any{"source": handle})
		if err != nil || r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
			t.Fatalf("call %d: %v, %v", i, r.GetState(), err)
		}
		last = r.GetId()
	}
	// Only the last delivery's entries are left: every other one rode a
	// later write.
	left, err := h.server.st.ListTraceOutbox(t.Context(), 100)
	if err != nil || len(left) == 0 {
		t.Fatalf("outbox after the calls = %v, %v; want the last delivery's entries", left, err)
	}
	for _, e := range left {
		id := e.Event.GetProduct().GetRequestId() + e.Event.GetProtocol().GetRequestId()
		if id != last || !h.server.sweep.Holds(e.Key) {
			t.Errorf("outbox entry of request %q (held for deletion: %t) left after the calls; want only the last call's, held", id, h.server.sweep.Holds(e.Key))
		}
	}

	traced := len(h.evidence.product(task))
	if err := h.server.st.PutTraceOutbox(t.Context(), []*evidencev1.TraceEvent{{TaskId: task,
		Layer: &evidencev1.TraceEvent_Product{Product: &evidencev1.ProductEvent{Detail: "left by a stopped replica"}}}}); err != nil {
		t.Fatal(err)
	}
	h.server.deliverOutbox(t.Context())
	got := h.evidence.product(task)
	if len(got) != traced+1 || got[len(got)-1].GetDetail() != "left by a stopped replica" {
		t.Fatalf("after an outbox pass evidence holds %d product events, %d before; want only the stopped replica's added", len(got), traced)
	}
	st.mu.Lock()
	early := len(st.deletes)
	st.mu.Unlock()

	h.server.sweep.Close()
	rest, err := h.server.st.ListTraceOutbox(t.Context(), 100)
	if err != nil || len(rest) != 0 {
		t.Fatalf("outbox after the sweep = %d entries, %v; want empty", len(rest), err)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	// The outbox pass deleted the one entry it sent; the last call's
	// entries went in one sweep.
	if early != 1 || len(st.deletes) != 2 {
		t.Errorf("%d deletes of their own before the sweep and %d in all for %d calls; want 1 (the outbox pass's) and 2", early, len(st.deletes), calls)
	}
}
