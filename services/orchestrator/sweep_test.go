package orchestrator

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
)

// heldDeletes is a Store whose first DeleteTraceOutbox waits for release,
// and which records the keys of every DeleteTraceOutbox.
type heldDeletes struct {
	Store
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
// while a delete is held up, further calls complete, and one delete then
// takes every entry they handed over. No entry is sent twice meanwhile
// (the outbox loop leaves them), and the outbox ends empty.
func TestDeliveredEntriesAreSweptOffTheCallsPath(t *testing.T) {
	t.Parallel()
	st := &heldDeletes{Store: newBoltStore(t), release: make(chan struct{}), held: make(chan struct{})}
	h := newHarnessOn(t, st, func(d *Deps) { d.RecoveryInterval = time.Hour })
	cat := h.start(t, "source_review", false).GetCatalogue()
	task := cat.GetTaskId()
	handle := handleFor(t, cat, capRetrieveAuthorizedSource, migrationGuide.GetTitle())

	const calls = 3
	done := make(chan error, 1)
	go func() {
		for i := range calls {
			r, err := h.submit(t, task, fmt.Sprintf("call_%d", i), capRetrieveAuthorizedSource, map[string]any{"source": handle})
			if err == nil && r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
				err = fmt.Errorf("call %d ended %v", i, r.GetState())
			}
			if err != nil {
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
	<-st.held
	h.server.deliverOutbox(t.Context()) // a recovery pass meanwhile
	traced := len(h.evidence.product(task))
	close(st.release)

	waitFor(t, "the outbox emptied", func() bool {
		rest, err := h.server.st.ListTraceOutbox(t.Context(), 100)
		return err == nil && len(rest) == 0
	})
	h.server.deliverOutbox(t.Context())
	if got := len(h.evidence.product(task)); got != traced {
		t.Fatalf("evidence holds %d product events after the sweep, %d before: entries were sent again", got, traced)
	}
	st.mu.Lock()
	deletes := len(st.deletes)
	st.mu.Unlock()
	// Each call delivers twice (before the adapter is called and at the
	// end): one delete per delivery would be 2 × calls.
	if deletes != 2 {
		t.Fatalf("%d deletes for %d calls' deliveries, want 2: the one held up, then one for the rest", deletes, calls)
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
	put := func(detail string) OutboxEntry {
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
