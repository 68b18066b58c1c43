// Package storetest is the evidence Store's conformance suite: the same
// tests run against every implementation (embedded file and Redis).
package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/v0m3/v0m3/internal/store"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	"github.com/v0m3/v0m3/services/evidence"
)

// Run runs every conformance test; newStore returns an empty store that
// lives until the (sub)test ends.
func Run(t *testing.T, newStore func(t *testing.T) evidence.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, st evidence.Store)
	}{
		{"ObservationRevisions", testObservationRevisions},
		{"ConcurrentObservationsShareRevisions", testConcurrentObservations},
		{"ClaimLinks", testClaimLinks},
		{"TraceSequences", testTraceSequences},
		{"AppendTracesTogether", testAppendTraces},
		{"TraceDeliveredOnce", testTraceDeliveredOnce},
		{"RewriteTrace", testRewriteTrace},
		{"ReceiptCreatedOnce", testReceipts},
		{"AuditAppendOnlyInOrder", testAudit},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, newStore(t))
		})
	}
}

func obs(id, task, uri, content string) *evidencev1.SourceObservation {
	return &evidencev1.SourceObservation{
		Id: id, ConnectionId: "conn_1", TaskId: task, ResourceUri: uri,
		ContentDigest: "sha256:" + content, RetrieveTime: timestamppb.New(time.Unix(1700000000, 0)),
	}
}

func testObservationRevisions(t *testing.T, st evidence.Store) {
	ctx := context.Background()
	steps := []struct {
		obs     *evidencev1.SourceObservation
		wantNum int32
	}{
		{obs("obs_1", "task_1", "notes://a", "v1"), 1},
		{obs("obs_2", "task_1", "notes://a", "v1"), 1},
		{obs("obs_3", "task_2", "notes://a", "v2"), 2},
		{obs("obs_4", "task_1", "notes://a", "v1"), 1},
		{obs("obs_5", "task_1", "notes://b", "v2"), 1},
		{obs("obs_6", "", "notes://a", "v3"), 3},
	}
	for i, s := range steps {
		before := proto.CloneOf(s.obs)
		got, err := st.RecordObservation(ctx, s.obs, fmt.Sprintf("rev_%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if got.GetRevisionNumber() != s.wantNum {
			t.Errorf("%s joined revision %d, want %d", s.obs.GetId(), got.GetRevisionNumber(), s.wantNum)
		}
		if !proto.Equal(before, s.obs) {
			t.Errorf("RecordObservation modified its argument")
		}
		stored, err := st.GetObservation(ctx, s.obs.GetId())
		if err != nil || !proto.Equal(stored, got) {
			t.Errorf("get %s = %v, %v; want %v", s.obs.GetId(), stored, err, got)
		}
	}
	if _, err := st.RecordObservation(ctx, obs("obs_1", "task_1", "notes://a", "v9"), "rev_x"); !errors.Is(err, store.ErrExists) {
		t.Errorf("observation id reused: err = %v, want ErrExists", err)
	}
	revs, err := st.ListRevisions(ctx, "conn_1", "notes://a")
	if err != nil || len(revs) != 3 {
		t.Fatalf("revisions of notes://a = %d, %v; want 3 (a refused observation adds none)", len(revs), err)
	}
	for i, r := range revs {
		if r.GetNumber() != int32(i+1) {
			t.Errorf("revision %d at position %d", r.GetNumber(), i)
		}
	}
	if revs[0].GetId() != "rev_0" || revs[0].GetFirstObservationId() != "obs_1" || revs[1].GetId() != "rev_2" {
		t.Errorf("revision identities = %v", revs)
	}
	list, err := st.ListObservations(ctx, "task_1")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, o := range list {
		ids = append(ids, o.GetId())
	}
	if fmt.Sprint(ids) != "[obs_1 obs_2 obs_4 obs_5]" {
		t.Errorf("task_1 observations = %v, want recording order [obs_1 obs_2 obs_4 obs_5]", ids)
	}
	if _, err := st.GetObservation(ctx, "obs_missing"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("missing observation: err = %v", err)
	}
	if none, err := st.ListObservations(ctx, "task_none"); err != nil || len(none) != 0 {
		t.Errorf("task without observations = %v, %v", none, err)
	}
}

// testConcurrentObservations records 50 observations of five contents of
// one source at once: exactly five revisions exist, numbered 1..5, and
// every observation joined the one for its content.
func testConcurrentObservations(t *testing.T, st evidence.Store) {
	ctx := context.Background()
	var wg sync.WaitGroup
	results := make([]*evidencev1.SourceObservation, 50)
	for i := range 50 {
		wg.Go(func() {
			got, err := st.RecordObservation(ctx, obs(fmt.Sprintf("obs_%d", i), "task_1", "notes://a", fmt.Sprintf("v%d", i%5)), fmt.Sprintf("rev_%d", i))
			if err != nil {
				t.Errorf("record %d: %v", i, err)
			}
			results[i] = got
		})
	}
	wg.Wait()
	revs, err := st.ListRevisions(ctx, "conn_1", "notes://a")
	if err != nil || len(revs) != 5 {
		t.Fatalf("%d revisions, %v; want 5", len(revs), err)
	}
	byDigest := map[string]*evidencev1.SourceRevision{}
	for i, r := range revs {
		if r.GetNumber() != int32(i+1) {
			t.Errorf("revision numbers not 1..5: %d at %d", r.GetNumber(), i)
		}
		byDigest[r.GetContentDigest()] = r
	}
	for _, o := range results {
		if r := byDigest[o.GetContentDigest()]; r == nil || r.GetId() != o.GetRevisionId() || r.GetNumber() != o.GetRevisionNumber() {
			t.Errorf("%s joined %s/%d, but its content's revision is %v", o.GetId(), o.GetRevisionId(), o.GetRevisionNumber(), r)
		}
	}
	if list, _ := st.ListObservations(ctx, "task_1"); len(list) != 50 {
		t.Errorf("task lists %d observations, want 50", len(list))
	}
}

func testClaimLinks(t *testing.T, st evidence.Store) {
	ctx := context.Background()
	link := &evidencev1.ClaimLink{Id: "link_1", ClaimId: "claim_1", ObservationId: "obs_1"}
	if err := st.CreateClaimLink(ctx, link); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateClaimLink(ctx, link); !errors.Is(err, store.ErrExists) {
		t.Errorf("second create: err = %v, want ErrExists", err)
	}
}

func traceEvent(task, detail string, at time.Time) *evidencev1.TraceEvent {
	return &evidencev1.TraceEvent{
		Id: "ev_" + detail, TaskId: task, Time: timestamppb.New(at),
		Layer: &evidencev1.TraceEvent_Product{Product: &evidencev1.ProductEvent{Detail: detail}},
	}
}

// testTraceSequences appends 50 events to one task at once and some to
// another: each task's sequences are 1..n with no gap or repeat.
func testTraceSequences(t *testing.T, st evidence.Store) {
	ctx := context.Background()
	now := time.Now()
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			ev := traceEvent("task_1", fmt.Sprint(i), now)
			got, err := st.AppendTrace(ctx, ev)
			if err != nil {
				t.Errorf("append: %v", err)
				return
			}
			if ev.GetSequence() != 0 || got.GetSequence() < 1 || got.GetSequence() > 50 {
				t.Errorf("sequence %d returned, argument's %d", got.GetSequence(), ev.GetSequence())
			}
		})
	}
	wg.Wait()
	for i := range 3 {
		got, err := st.AppendTrace(ctx, traceEvent("task_2", fmt.Sprint(i), now))
		if err != nil || got.GetSequence() != int64(i+1) {
			t.Errorf("task_2 event %d got sequence %d, %v", i, got.GetSequence(), err)
		}
	}
	events, err := st.ListTrace(ctx, "task_1")
	if err != nil || len(events) != 50 {
		t.Fatalf("task_1 trace = %d, %v; want 50", len(events), err)
	}
	seen := map[string]bool{}
	for i, ev := range events {
		if ev.GetSequence() != int64(i+1) || ev.GetTaskId() != "task_1" {
			t.Errorf("event %d: sequence %d task %s", i, ev.GetSequence(), ev.GetTaskId())
		}
		seen[ev.GetId()] = true
	}
	if len(seen) != 50 {
		t.Errorf("%d distinct events, want 50", len(seen))
	}
}

// testTraceDeliveredOnce delivers events under writer-chosen delivery
// ids more than once (a retry; a redelivery from an outbox, alone and in
// a batch with new events; the same id twice in one batch; concurrent
// redeliveries): each id is stored once, the append returns the event
// stored first, and an event without a delivery id is always appended.
// The same id in another task is another event.
func testTraceDeliveredOnce(t *testing.T, st evidence.Store) {
	ctx := context.Background()
	now := time.Now()
	with := func(task, detail, id string) *evidencev1.TraceEvent {
		ev := traceEvent(task, detail, now)
		ev.DeliveryId = id
		return ev
	}
	first, err := st.AppendTrace(ctx, with("task_d", "a", "dl_a"))
	if err != nil || first.GetSequence() != 1 {
		t.Fatalf("first delivery: %v, %v", first, err)
	}
	again, err := st.AppendTrace(ctx, with("task_d", "a, again", "dl_a"))
	if err != nil || again.GetSequence() != 1 || again.GetProduct().GetDetail() != "a" {
		t.Errorf("redelivery = %v, %v; want the first event, sequence 1", again, err)
	}
	batch, err := st.AppendTraces(ctx, []*evidencev1.TraceEvent{
		with("task_d", "a, in a batch", "dl_a"), with("task_d", "b", "dl_b"), with("task_d", "b, twice in the batch", "dl_b"),
		traceEvent("task_d", "no id", now), traceEvent("task_d", "no id", now), with("task_e", "a, another task", "dl_a"),
	})
	if err != nil {
		t.Fatal(err)
	}
	var seqs []int64
	for _, ev := range batch {
		seqs = append(seqs, ev.GetSequence())
	}
	if want := []int64{1, 2, 2, 3, 4, 1}; !slices.Equal(seqs, want) {
		t.Errorf("batch sequences = %v, want %v", seqs, want)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if _, err := st.AppendTraces(ctx, []*evidencev1.TraceEvent{with("task_d", "c", "dl_c"), with("task_d", "b", "dl_b")}); err != nil {
				t.Errorf("concurrent redelivery: %v", err)
			}
		})
	}
	wg.Wait()
	events, err := st.ListTrace(ctx, "task_d")
	if err != nil {
		t.Fatal(err)
	}
	var details []string
	for _, ev := range events {
		details = append(details, ev.GetProduct().GetDetail())
	}
	if want := []string{"a", "b", "no id", "no id", "c"}; !slices.Equal(details, want) {
		t.Errorf("task_d trace = %q, want %q", details, want)
	}
}

func testRewriteTrace(t *testing.T, st evidence.Store) {
	ctx := context.Background()
	now := time.Now()
	for _, ev := range []*evidencev1.TraceEvent{
		traceEvent("task_1", "old-1", now.Add(-48*time.Hour)),
		traceEvent("task_1", "new-1", now),
		traceEvent("task_2", "old-2", now.Add(-48*time.Hour)),
		traceEvent("task_2", "keep-2", now.Add(-48*time.Hour)),
	} {
		if _, err := st.AppendTrace(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	n, err := st.RewriteTrace(ctx, now.Add(-24*time.Hour), func(ev *evidencev1.TraceEvent) bool {
		if ev.GetProduct().GetDetail() == "keep-2" {
			return false
		}
		ev.GetProduct().Detail = "[redacted]"
		// Identity fields are restored by the store whatever rewrite does.
		ev.Id, ev.TaskId, ev.Sequence = "moved", "task_9", 99
		return true
	})
	if err != nil || n != 2 {
		t.Fatalf("rewrite = %d, %v; want 2", n, err)
	}
	want := map[string][]string{
		"task_1": {"ev_old-1:1:[redacted]", "ev_new-1:2:new-1"},
		"task_2": {"ev_old-2:1:[redacted]", "ev_keep-2:2:keep-2"},
	}
	for task, w := range want {
		events, err := st.ListTrace(ctx, task)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, ev := range events {
			got = append(got, fmt.Sprintf("%s:%d:%s", ev.GetId(), ev.GetSequence(), ev.GetProduct().GetDetail()))
		}
		if fmt.Sprint(got) != fmt.Sprint(w) {
			t.Errorf("%s after rewrite = %v, want %v", task, got, w)
		}
	}
	if ev, _ := st.ListTrace(ctx, "task_9"); len(ev) != 0 {
		t.Errorf("rewrite moved events to task_9")
	}
}

// testReceipts creates one receipt key from 50 goroutines at once: one
// create wins and every caller gets that receipt back.
func testReceipts(t *testing.T, st evidence.Store) {
	ctx := context.Background()
	if _, err := st.GetReceipt(ctx, "key_missing"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("missing receipt: err = %v", err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	created := 0
	winners := map[string]bool{}
	for i := range 50 {
		wg.Go(func() {
			r := &evidencev1.Receipt{Id: fmt.Sprintf("rcpt_%d", i), IdempotencyKey: "key_1", TaskId: "task_1"}
			got, ok, err := st.CreateReceipt(ctx, r)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("create: %v", err)
				return
			}
			if ok {
				created++
				if got.GetId() != r.GetId() {
					t.Errorf("created receipt returned as %s, stored %s", got.GetId(), r.GetId())
				}
			}
			winners[got.GetId()] = true
		})
	}
	wg.Wait()
	if created != 1 || len(winners) != 1 {
		t.Fatalf("%d creates succeeded, callers saw %d receipts; want 1 and 1", created, len(winners))
	}
	got, err := st.GetReceipt(ctx, "key_1")
	if err != nil || !winners[got.GetId()] {
		t.Errorf("get = %v, %v; want the winning receipt", got, err)
	}
}

// testAppendTraces appends events of two tasks in one step while single
// events go to the same tasks concurrently: each task's sequences stay
// 1..n without gap or repeat, a batch keeps its order within each task,
// and the events passed in are not modified.
func testAppendTraces(t *testing.T, st evidence.Store) {
	ctx := context.Background()
	now := time.Now()
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Go(func() {
			if _, err := st.AppendTrace(ctx, traceEvent("task_a", fmt.Sprint("single-", i), now)); err != nil {
				t.Errorf("append: %v", err)
			}
		})
		wg.Go(func() {
			batch := []*evidencev1.TraceEvent{
				traceEvent("task_a", fmt.Sprint("batch-", i, "-1"), now),
				traceEvent("task_b", fmt.Sprint("batch-", i, "-2"), now),
				traceEvent("task_a", fmt.Sprint("batch-", i, "-3"), now),
			}
			got, err := st.AppendTraces(ctx, batch)
			if err != nil || len(got) != 3 {
				t.Errorf("append traces = %d, %v", len(got), err)
				return
			}
			for j, ev := range got {
				if batch[j].GetSequence() != 0 || ev.GetTaskId() != batch[j].GetTaskId() || ev.GetProduct().GetDetail() != batch[j].GetProduct().GetDetail() {
					t.Errorf("event %d: got %v for %v", j, ev, batch[j])
				}
			}
			if got[2].GetSequence() <= got[0].GetSequence() {
				t.Errorf("a batch's order is lost: sequences %d then %d", got[0].GetSequence(), got[2].GetSequence())
			}
		})
	}
	wg.Wait()
	for task, want := range map[string]int{"task_a": 30, "task_b": 10} {
		events, err := st.ListTrace(ctx, task)
		if err != nil || len(events) != want {
			t.Fatalf("%s trace = %d, %v; want %d", task, len(events), err, want)
		}
		for i, ev := range events {
			if ev.GetSequence() != int64(i+1) {
				t.Errorf("%s event %d has sequence %d", task, i, ev.GetSequence())
			}
		}
	}
}

// testAudit: concurrent appends get distinct, gap-free sequences; listing
// pages after a sequence, in order, with a filter, and the stored record
// is what was appended; an append under a request id stored before
// appends nothing and returns that record.
func testAudit(t *testing.T, st evidence.Store) {
	ctx := context.Background()
	if got, err := st.ListAudit(ctx, 0, 10, func(*evidencev1.AuditRecord) bool { return true }); err != nil || len(got) != 0 {
		t.Fatalf("empty log lists %d records, err %v", len(got), err)
	}
	const n = 24
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			action := "connection.create"
			if i%3 == 0 {
				action = "request.approve"
			}
			rec := &evidencev1.AuditRecord{Id: fmt.Sprintf("aud_%d", i), Principal: "alice", Action: action,
				Resource: fmt.Sprintf("connection:con_%d", i), Revision: "config_revision=1", Outcome: "ok",
				Time: timestamppb.Now(), RecordedBy: "registry"}
			got, err := st.AppendAudit(ctx, rec, auditRequestID(i))
			switch {
			case err != nil:
				errs <- err
			case got.GetSequence() < 1 || got.GetSequence() > n:
				errs <- fmt.Errorf("sequence %d outside 1..%d", got.GetSequence(), n)
			case rec.GetSequence() != 0:
				errs <- errors.New("AppendAudit modified its argument")
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	all, err := st.ListAudit(ctx, 0, 100, func(*evidencev1.AuditRecord) bool { return true })
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != n {
		t.Fatalf("listed %d records, want %d", len(all), n)
	}
	for i, r := range all {
		if r.GetSequence() != int64(i+1) {
			t.Fatalf("record %d has sequence %d: not gap-free and in order", i, r.GetSequence())
		}
		if r.GetPrincipal() != "alice" || r.GetOutcome() != "ok" || r.GetRecordedBy() != "registry" || r.GetTime() == nil {
			t.Fatalf("record %d came back changed: %v", i, r)
		}
	}
	page, err := st.ListAudit(ctx, 10, 5, func(*evidencev1.AuditRecord) bool { return true })
	if err != nil || len(page) != 5 || page[0].GetSequence() != 11 || page[4].GetSequence() != 15 {
		t.Fatalf("page after 10 of 5: %d records (first %d), err %v", len(page), page[0].GetSequence(), err)
	}
	approvals, err := st.ListAudit(ctx, 0, 100, func(r *evidencev1.AuditRecord) bool { return r.GetAction() == "request.approve" })
	if err != nil || len(approvals) != n/3 {
		t.Fatalf("filtered listing: %d records, want %d (err %v)", len(approvals), n/3, err)
	}
	for _, r := range approvals {
		if r.GetAction() != "request.approve" {
			t.Fatalf("filter let through %v", r)
		}
	}
	if rest, err := st.ListAudit(ctx, n, 10, func(*evidencev1.AuditRecord) bool { return true }); err != nil || len(rest) != 0 {
		t.Fatalf("after the last record: %d records, err %v", len(rest), err)
	}

	// Appended again under a request id it was stored with (a retry after
	// a timeout), concurrently: nothing is appended, and each gets the
	// record stored then.
	errs = make(chan error, n)
	for i := range n {
		if auditRequestID(i) == "" {
			continue
		}
		wg.Go(func() {
			again := &evidencev1.AuditRecord{Id: "aud_again", Principal: "alice", Action: "connection.create", Resource: "connection:again", Outcome: "ok"}
			got, err := st.AppendAudit(ctx, again, auditRequestID(i))
			switch {
			case err != nil:
				errs <- err
			case got.GetId() != fmt.Sprintf("aud_%d", i) || got.GetResource() != fmt.Sprintf("connection:con_%d", i) || got.GetSequence() < 1:
				errs <- fmt.Errorf("appending request %s again returned %v, want the record appended then", auditRequestID(i), got)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if all, err := st.ListAudit(ctx, 0, 100, func(*evidencev1.AuditRecord) bool { return true }); err != nil || len(all) != n {
		t.Fatalf("after appending again under stored request ids: %d records, want %d (err %v)", len(all), n, err)
	}
}

// auditRequestID is the request id testAudit appends record i under:
// every other record has one.
func auditRequestID(i int) string {
	if i%2 == 1 {
		return ""
	}
	return fmt.Sprintf("audreq_%d", i)
}
