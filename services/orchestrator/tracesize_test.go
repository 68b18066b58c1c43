package orchestrator

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/testkit"
	"github.com/v0m3/v0m3/internal/tracesend"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
)

func TestBoundTraceEvent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		detail string
		cut    bool
	}{
		{"short", "attempt 1 failed: unknown", false},
		{"at the bound", strings.Repeat("a", maxTraceDetail), false},
		{"over the bound", strings.Repeat("a", 3*maxTraceDetail), true},
		{"multi-byte over the bound", strings.Repeat("é", maxTraceDetail), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			te := &evidencev1.TraceEvent{Layer: &evidencev1.TraceEvent_Product{Product: &evidencev1.ProductEvent{Detail: tc.detail}}}
			boundTraceEvent(te)
			got := te.GetProduct().GetDetail()
			if !tc.cut {
				if got != tc.detail {
					t.Fatalf("a detail within the bound was changed")
				}
				return
			}
			if len(got) > maxTraceDetail || !strings.Contains(got, "[truncated: ") || !utf8.ValidString(got) {
				t.Fatalf("cut detail: %d bytes, valid UTF-8 %v, ends %q", len(got), utf8.ValidString(got), got[max(0, len(got)-40):])
			}
		})
	}
}

// TestTraceBatchesFitOneAppend: a flush is split, in order, into batches
// evidence takes in one AppendTraces (at most tracesend.MaxEvents events
// and maxTraceBatchBytes bytes each), losing no event.
func TestTraceBatchesFitOneAppend(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		events int
		detail int
	}{
		{"many small events", 2*tracesend.MaxEvents + 3, 10},
		{"few large events", 40, maxTraceDetail},
		{"one event", 1, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			evs := make([]*evidencev1.TraceEvent, tc.events)
			for i := range evs {
				evs[i] = &evidencev1.TraceEvent{Layer: &evidencev1.TraceEvent_Product{Product: &evidencev1.ProductEvent{
					Detail: fmt.Sprintf("%04d ", i) + strings.Repeat("x", tc.detail)}}}
			}
			next := 0
			for _, batch := range traceBatches(evs) {
				size := 0
				for _, ev := range batch {
					size += proto.Size(ev)
					if want := fmt.Sprintf("%04d ", next); !strings.HasPrefix(ev.GetProduct().GetDetail(), want) {
						t.Fatalf("event %d out of order: starts %q", next, ev.GetProduct().GetDetail()[:5])
					}
					next++
				}
				if len(batch) == 0 || len(batch) > tracesend.MaxEvents || (len(batch) > 1 && size > maxTraceBatchBytes) {
					t.Errorf("a batch of %d events, %d bytes; want 1 to %d events within %d bytes", len(batch), size, tracesend.MaxEvents, maxTraceBatchBytes)
				}
			}
			if next != tc.events {
				t.Errorf("batches carry %d events, want %d", next, tc.events)
			}
		})
	}
}

// A call whose trace is larger than one gRPC message accepts delivers
// every event, in order, each oversized detail cut with a marker.
func TestLargeTraceIsDeliveredWhole(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := withCheckpoint(t.Context())
	const n = 80 // 80 × 64 KiB is over the 4 MiB a message may carry
	for i := range n {
		h.server.trace(ctx, "task_big", &evidencev1.ProductEvent{Detail: fmt.Sprintf("%03d ", i) + strings.Repeat("x", 100<<10)})
	}
	h.server.flush(ctx)
	got := h.evidence.product("task_big")
	if len(got) != n {
		t.Fatalf("delivered %d trace events, want %d", len(got), n)
	}
	for i, ev := range got {
		if !strings.HasPrefix(ev.GetDetail(), fmt.Sprintf("%03d ", i)) || !strings.Contains(ev.GetDetail(), "[truncated: ") {
			t.Fatalf("event %d out of order or not cut: starts %q", i, ev.GetDetail()[:8])
		}
	}
}

// Trace events evidence does not take wait in the orchestrator's outbox
// (later ones queue behind them) and are delivered, in order, once
// evidence is back: none is lost.
func TestTraceEventsWaitInTheOutboxWhileEvidenceIsDown(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(d *Deps) { d.RecoveryInterval = 20 * time.Millisecond })
	h.evidence.tracesDown.Store(true)
	for i := range 10 {
		ctx := t.Context()
		if i%2 == 0 {
			ctx = withCheckpoint(ctx) // some as one call's batch
		}
		h.server.trace(ctx, "task_o", &evidencev1.ProductEvent{Detail: fmt.Sprintf("%02d", i)})
		h.server.flush(ctx)
	}
	if got := h.evidence.product("task_o"); len(got) != 0 {
		t.Fatalf("evidence took %d events while down", len(got))
	}
	waiting, err := h.server.st.ListTraceOutbox(t.Context(), 100)
	if err != nil || len(waiting) != 10 {
		t.Fatalf("outbox holds %d events (%v), want 10", len(waiting), err)
	}

	h.evidence.tracesDown.Store(false)
	testkit.Eventually(t, "the outbox delivered", func() bool { return len(h.evidence.product("task_o")) >= 10 })
	got := h.evidence.product("task_o")
	if len(got) != 10 {
		t.Fatalf("delivered %d events, want 10 exactly once", len(got))
	}
	for i, ev := range got {
		if ev.GetDetail() != fmt.Sprintf("%02d", i) {
			t.Fatalf("event %d is %q: out of order", i, ev.GetDetail())
		}
	}
	testkit.Eventually(t, "the outbox emptied", func() bool {
		rest, err := h.server.st.ListTraceOutbox(t.Context(), 100)
		return err == nil && len(rest) == 0
	})
}

// A trace delivery whose answer is lost (evidence stored the events, the
// orchestrator heard UNAVAILABLE) is delivered again from the outbox
// under the same delivery ids, which evidence stores once
// (evidence/storetest TraceDeliveredOnce): a retry never duplicates the
// trace.
func TestRedeliveredTraceKeepsItsDeliveryIDs(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(d *Deps) { d.RecoveryInterval = 20 * time.Millisecond })
	h.evidence.loseAnswer.Store(true)
	ctx := withCheckpoint(t.Context())
	for i := range 3 {
		h.server.trace(ctx, "task_r", &evidencev1.ProductEvent{Detail: fmt.Sprint(i)})
	}
	h.server.flush(ctx)
	testkit.Eventually(t, "the outbox delivered again", func() bool { return len(h.evidence.product("task_r")) >= 6 })
	h.evidence.mu.Lock()
	got := slices.Clone(h.evidence.traces["task_r"])
	h.evidence.mu.Unlock()
	if len(got) != 6 {
		t.Fatalf("evidence received %d events, want the 3 twice", len(got))
	}
	for i, ev := range got[:3] {
		again := got[3+i]
		if ev.GetDeliveryId() == "" || ev.GetDeliveryId() != again.GetDeliveryId() || ev.GetProduct().GetDetail() != again.GetProduct().GetDetail() {
			t.Errorf("event %d delivered as %q (%s), again as %q (%s); want one non-empty delivery id", i,
				ev.GetDeliveryId(), ev.GetProduct().GetDetail(), again.GetDeliveryId(), again.GetProduct().GetDetail())
		}
	}
	if got[0].GetDeliveryId() == got[1].GetDeliveryId() {
		t.Errorf("two events share delivery id %q", got[0].GetDeliveryId())
	}
}

// An event evidence refuses as invalid would be refused on every retry:
// it is dropped, and neither the events of its batch nor later ones wait
// behind it, whether it was sent at once or from the outbox.
func TestInvalidTraceEventDoesNotHoldTheOthersBack(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(d *Deps) { d.RecoveryInterval = 20 * time.Millisecond })
	h.evidence.mu.Lock()
	h.evidence.invalid = "bad"
	h.evidence.mu.Unlock()
	details := []string{"00", "01", "bad", "03"}
	send := func(task string, ds []string) {
		ctx := withCheckpoint(t.Context()) // one call's batch
		for _, d := range ds {
			h.server.trace(ctx, task, &evidencev1.ProductEvent{Detail: d})
		}
		h.server.flush(ctx)
	}
	send("task_direct", details)

	// From the outbox: evidence is down while the events are written.
	h.evidence.tracesDown.Store(true)
	send("task_outbox", details)
	h.evidence.tracesDown.Store(false)

	want := []string{"00", "01", "03"}
	for _, task := range []string{"task_direct", "task_outbox"} {
		testkit.Eventually(t, task+" delivered", func() bool { return len(h.evidence.product(task)) >= len(want) })
		var got []string
		for _, ev := range h.evidence.product(task) {
			got = append(got, ev.GetDetail())
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: evidence holds %q, want %q in order", task, got, want)
		}
	}
	// The outbox loop, not only the store, knows it is empty (it finds
	// so on its next read, after its last delete).
	testkit.Eventually(t, "the outbox emptied", func() bool {
		rest, err := h.server.st.ListTraceOutbox(t.Context(), 100)
		return err == nil && len(rest) == 0 && !h.server.outboxPending.Load()
	})
	// Later events are not queued behind the refused one.
	send("task_after", []string{"04"})
	if got := h.evidence.product("task_after"); len(got) != 1 {
		t.Fatalf("a later event was not delivered at once: %d events", len(got))
	}
}
