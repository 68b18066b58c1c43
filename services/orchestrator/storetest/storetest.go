// Package storetest is the orchestrator Store's conformance suite: the
// same tests run against every implementation (embedded file and Redis).
package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/v0m3/v0m3/internal/store"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	ostore "github.com/v0m3/v0m3/services/orchestrator/store"
)

// Run runs every conformance test; newStore returns an empty store that
// lives until the (sub)test ends.
func Run(t *testing.T, newStore func(t *testing.T) ostore.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, st ostore.Store)
	}{
		{"Tasks", testTasks},
		{"ConcurrentTaskUpdatesLoseNothing", testConcurrentTaskUpdates},
		{"Catalogue", testCatalogue},
		{"CreationReadsTaskOffer", testCreationReadsTaskOffer},
		{"AccessTokens", testAccessTokens},
		{"RequestCreatedOnce", testRequestCreatedOnce},
		{"ConcurrentDuplicateSubmission", testConcurrentDuplicateSubmission},
		{"AttemptStageNeverMovesBack", testAttemptStages},
		{"ApprovalUsedOnce", testApprovalUsedOnce},
		{"EventSequences", testEvents},
		{"UpdatesEmitEventsInOneStep", testEmit},
		{"UnsettledRequests", testUnsettled},
		{"TraceOutbox", testTraceOutbox},
		{"LeaseHasOneOwner", func(t *testing.T, st ostore.Store) { CheckLease(t, []ostore.Store{st, st}) }},
		{"StaleLeaseWritesFenced", func(t *testing.T, st ostore.Store) { CheckFence(t, []ostore.Store{st, st}) }},
		{"LeaseTakenWithCreation", func(t *testing.T, st ostore.Store) { CheckLeaseWithCreation(t, []ostore.Store{st, st}) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, newStore(t))
		})
	}
}

// RunShared checks what must hold across replicas: stores a and b are two
// clients (two processes) on the same backing state. Only a store shared
// between processes (Redis) can pass it.
func RunShared(t *testing.T, a, b ostore.Store) {
	t.Run("DuplicateSubmissionAcrossReplicas", func(t *testing.T) {
		CheckDuplicateSubmission(t, []ostore.Store{a, b}, "task_shared")
	})
	t.Run("ApprovalUsedOnceAcrossReplicas", func(t *testing.T) {
		CheckApprovalUsedOnce(t, []ostore.Store{a, b}, "req_shared_approval")
	})
	t.Run("LeaseHasOneOwnerAcrossReplicas", func(t *testing.T) {
		CheckLease(t, []ostore.Store{a, b})
	})
	t.Run("StaleLeaseWritesFencedAcrossReplicas", func(t *testing.T) {
		CheckFence(t, []ostore.Store{a, b})
	})
	t.Run("LeaseTakenWithCreationAcrossReplicas", func(t *testing.T) {
		CheckLeaseWithCreation(t, []ostore.Store{a, b})
	})
	t.Run("EventsWakeWatchersOnOtherReplicas", func(t *testing.T) {
		CheckEventWake(t, a, b)
	})
	t.Run("OutboxClaimsSeenByOtherReplicas", func(t *testing.T) {
		CheckOutboxClaims(t, a, b)
	})
}

// CheckOutboxClaims checks that trace events written with a claim are
// listed, through another replica's store, with their claimant until
// the claim lapses or they are delivered, and those put in the outbox
// without one with none: what keeps two replicas from sending one event
// twice.
func CheckOutboxClaims(t *testing.T, a, b ostore.Store) {
	ctx := context.Background()
	// Start from an empty outbox (the stores are shared with other checks).
	if old, err := b.ListTraceOutbox(ctx, 1000); err != nil {
		t.Fatal(err)
	} else if err := b.DeleteTraceOutbox(ctx, keysOf(old)); err != nil {
		t.Fatal(err)
	}
	ev := func(detail string) []*evidencev1.TraceEvent {
		return []*evidencev1.TraceEvent{{TaskId: "task_claims", Layer: &evidencev1.TraceEvent_Product{Product: &evidencev1.ProductEvent{Detail: detail}}}}
	}
	w, err := a.EmitHeld(ctx, ostore.Held{Traces: ev("claimed"), Claim: ostore.OutboxClaim{Owner: "replica_a", TTL: time.Hour}})
	if err != nil || len(w.Outbox) != 1 || w.Outbox[0].Claimant != "replica_a" {
		t.Fatalf("claimed write = %+v, %v", w, err)
	}
	if err := a.PutTraceOutbox(ctx, ev("unclaimed")); err != nil {
		t.Fatal(err)
	}
	if _, err := a.EmitHeld(ctx, ostore.Held{Traces: ev("lapsing"), Claim: ostore.OutboxClaim{Owner: "replica_a", TTL: 200 * time.Millisecond}}); err != nil {
		t.Fatal(err)
	}
	claimants := func() map[string]string {
		t.Helper()
		box, err := b.ListTraceOutbox(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, e := range box {
			out[e.Event.GetProduct().GetDetail()] = e.Claimant
		}
		return out
	}
	if got := claimants(); got["claimed"] != "replica_a" || got["unclaimed"] != "" || len(got) != 3 {
		t.Errorf("claimants seen by another replica = %v; want claimed by replica_a, unclaimed by none", got)
	}
	deadline := time.Now().Add(30 * time.Second)
	for claimants()["lapsing"] != "" {
		if time.Now().After(deadline) {
			t.Fatal("a lapsed claim still holds its entry")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := claimants()["claimed"]; got != "replica_a" {
		t.Errorf("a live claim = %q after another lapsed; want replica_a", got)
	}
	// Delivered (deleted), an entry leaves the outbox with its claim.
	if err := b.DeleteTraceOutbox(ctx, []string{w.Outbox[0].Key}); err != nil {
		t.Fatal(err)
	}
	if got := claimants(); len(got) != 2 || got["unclaimed"] != "" {
		t.Errorf("after delivery = %v; want the two others", got)
	}
}

func keysOf(es []ostore.OutboxEntry) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.Key
	}
	return out
}

func task(id string, state orchestratorv1.TaskState) *orchestratorv1.Task {
	return &orchestratorv1.Task{Id: id, Purpose: "source_review", State: state}
}

func request(id, taskID, callID string) *orchestratorv1.ToolRequest {
	return &orchestratorv1.ToolRequest{Id: id, TaskId: taskID, ProviderCallId: callID, Capability: "notes.get", State: orchestratorv1.RequestState_REQUEST_STATE_REQUESTED}
}

func testTasks(t *testing.T, st ostore.Store) {
	ctx := context.Background()
	if _, err := st.GetTask(ctx, "task_missing"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("missing task: err = %v", err)
	}
	active, done := orchestratorv1.TaskState_TASK_STATE_ACTIVE, orchestratorv1.TaskState_TASK_STATE_COMPLETED
	for _, tk := range []*orchestratorv1.Task{task("task_1", active), task("task_2", active), task("task_3", done)} {
		if err := st.CreateTask(ctx, tk); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.CreateTask(ctx, task("task_1", done)); !errors.Is(err, store.ErrExists) {
		t.Errorf("create twice: err = %v, want ErrExists", err)
	}
	refused := errors.New("refused")
	if _, err := st.UpdateTask(ctx, "task_1", func(tk *orchestratorv1.Task) error {
		tk.State = done
		return refused
	}); !errors.Is(err, refused) {
		t.Errorf("refused update: err = %v", err)
	}
	got, err := st.UpdateTask(ctx, "task_2", func(tk *orchestratorv1.Task) error {
		tk.State = done
		return nil
	})
	if err != nil || got.GetState() != done {
		t.Errorf("update = %v, %v", got, err)
	}
	if _, err := st.UpdateTask(ctx, "task_missing", func(*orchestratorv1.Task) error { return nil }); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("update missing: err = %v", err)
	}
	for state, want := range map[orchestratorv1.TaskState]int{active: 1, done: 2, orchestratorv1.TaskState_TASK_STATE_UNSPECIFIED: 3} {
		list, err := st.ListTasks(ctx, state)
		if err != nil || len(list) != want {
			t.Errorf("ListTasks(%v) = %d, %v; want %d", state, len(list), err, want)
		}
	}
}

// testConcurrentTaskUpdates appends to a task's checkpoint from 50
// goroutines at once: no update is lost.
func testConcurrentTaskUpdates(t *testing.T, st ostore.Store) {
	ctx := context.Background()
	if err := st.CreateTask(ctx, task("task_1", orchestratorv1.TaskState_TASK_STATE_ACTIVE)); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			if _, err := st.UpdateTask(ctx, "task_1", func(tk *orchestratorv1.Task) error {
				tk.Checkpoint += "x"
				return nil
			}); err != nil {
				t.Errorf("update: %v", err)
			}
		})
	}
	wg.Wait()
	got, err := st.GetTask(ctx, "task_1")
	if err != nil || len(got.GetCheckpoint()) != 50 {
		t.Errorf("after 50 updates checkpoint has %d marks, %v; want 50", len(got.GetCheckpoint()), err)
	}
}

// testAccessTokens checks the MCP token records of a task: kept per task,
// oldest first, expired ones dropped when a new one is added, and bounded.
func testAccessTokens(t *testing.T, st ostore.Store) {
	ctx := context.Background()
	if got, err := st.ListAccessTokens(ctx, "task_1"); err != nil || len(got) != 0 {
		t.Fatalf("no tokens yet: %v, %v; want an empty list", got, err)
	}
	base := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	tok := func(task, d string, minted time.Duration) *orchestratorv1.TaskAccessToken {
		return &orchestratorv1.TaskAccessToken{TaskId: task, TokenDigest: d, Requester: "alice",
			CreateTime: timestamppb.New(base.Add(minted)), ExpireTime: timestamppb.New(base.Add(minted + time.Hour))}
	}
	for _, tk := range []*orchestratorv1.TaskAccessToken{tok("task_1", "sha256:a", 0), tok("task_1", "sha256:b", 30*time.Minute), tok("task_2", "sha256:x", 0)} {
		if err := st.AddAccessToken(ctx, tk); err != nil {
			t.Fatal(err)
		}
	}
	digests := func(task string) []string {
		t.Helper()
		got, err := st.ListAccessTokens(ctx, task)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, tk := range got {
			out = append(out, tk.GetTokenDigest())
		}
		return out
	}
	if got := digests("task_1"); !slices.Equal(got, []string{"sha256:a", "sha256:b"}) {
		t.Errorf("task_1 tokens = %v; want a, b in order", got)
	}
	if got := digests("task_2"); !slices.Equal(got, []string{"sha256:x"}) {
		t.Errorf("task_2 tokens = %v; want only its own", got)
	}
	// Minted after a expired: a goes, b stays.
	if err := st.AddAccessToken(ctx, tok("task_1", "sha256:c", 61*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if got := digests("task_1"); !slices.Equal(got, []string{"sha256:b", "sha256:c"}) {
		t.Errorf("after a expired: tokens = %v; want b, c", got)
	}
	for i := range 40 {
		if err := st.AddAccessToken(ctx, tok("task_3", fmt.Sprintf("sha256:%02d", i), time.Duration(i)*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	got := digests("task_3")
	if len(got) == 0 || len(got) > 16 || got[len(got)-1] != "sha256:39" {
		t.Errorf("after 40 mints: %d tokens, last %v; want at most 16, the newest kept", len(got), got)
	}
}

func testCatalogue(t *testing.T, st ostore.Store) {
	ctx := context.Background()
	if _, err := st.GetCatalogue(ctx, "task_1"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("missing catalogue: err = %v", err)
	}
	for _, rev := range []string{"p1", "p2"} {
		if err := st.PutCatalogue(ctx, &orchestratorv1.OfferedCatalogue{TaskId: "task_1", PolicyRevision: rev}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := st.GetCatalogue(ctx, "task_1")
	if err != nil || got.GetPolicyRevision() != "p2" {
		t.Errorf("catalogue = %v, %v; want the latest", got, err)
	}
}

// CreateRequestEmit reads the new request's task and offered catalogue
// in its transaction, as they are when it commits: none for a missing
// task, the task without a catalogue, then both after they changed. A
// resubmission creates nothing and reads neither.
func testCreationReadsTaskOffer(t *testing.T, st ostore.Store) {
	ctx := context.Background()
	create := func(id, call string) ostore.Creation {
		t.Helper()
		c, err := st.CreateRequestEmit(ctx, request(id, "task_1", call), ostore.Held{}, ostore.LeaseTake{})
		if err != nil {
			t.Fatalf("create %s: %v", id, err)
		}
		return c
	}
	if c := create("req_1", "call_1"); !c.Created || c.Task != nil || c.Catalogue != nil {
		t.Errorf("creation for a missing task: created %t, task %v, catalogue %v; want created, neither", c.Created, c.Task, c.Catalogue)
	}
	task := &orchestratorv1.Task{Id: "task_1", Profile: "source_review", State: orchestratorv1.TaskState_TASK_STATE_ACTIVE}
	if err := st.CreateTask(ctx, task); err != nil {
		t.Fatal(err)
	}
	if c := create("req_2", "call_2"); !proto.Equal(c.Task, task) || c.Catalogue != nil {
		t.Errorf("creation for a task without a catalogue: task %v, catalogue %v; want the task and none", c.Task, c.Catalogue)
	}
	offer := &orchestratorv1.OfferedCatalogue{TaskId: "task_1", PolicyRevision: "p1"}
	if err := st.PutCatalogue(ctx, offer); err != nil {
		t.Fatal(err)
	}
	if _, err := st.UpdateTask(ctx, "task_1", func(t *orchestratorv1.Task) error {
		t.State = orchestratorv1.TaskState_TASK_STATE_COMPLETED
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if c := create("req_3", "call_3"); c.Task.GetState() != orchestratorv1.TaskState_TASK_STATE_COMPLETED || !proto.Equal(c.Catalogue, offer) {
		t.Errorf("creation after the task changed: task %v, catalogue %v; want the completed task and its catalogue", c.Task, c.Catalogue)
	}
	if c := create("req_4", "call_3"); c.Created || c.Request.GetId() != "req_3" || c.Task != nil || c.Catalogue != nil {
		t.Errorf("resubmission: created %t, request %s, task %v, catalogue %v; want req_3 again and nothing read", c.Created, c.Request.GetId(), c.Task, c.Catalogue)
	}
}

func testRequestCreatedOnce(t *testing.T, st ostore.Store) {
	ctx := context.Background()
	first := request("req_1", "task_1", "call_1")
	got, created, err := st.CreateRequest(ctx, first)
	if err != nil || !created || !proto.Equal(got, first) {
		t.Fatalf("create = %v, %v, %v", got, created, err)
	}
	// The same provider call again, under a new request id: the first
	// request comes back and nothing new is stored.
	got, created, err = st.CreateRequest(ctx, request("req_2", "task_1", "call_1"))
	if err != nil || created || got.GetId() != "req_1" {
		t.Errorf("resubmission = %v, created %v, %v; want req_1, not created", got.GetId(), created, err)
	}
	// The same call id in another task is another call.
	if _, created, err := st.CreateRequest(ctx, request("req_3", "task_2", "call_1")); err != nil || !created {
		t.Errorf("same call id in another task: created %v, %v", created, err)
	}
	if _, _, err := st.CreateRequest(ctx, request("req_1", "task_1", "call_other")); !errors.Is(err, store.ErrExists) {
		t.Errorf("request id reused for another call: err = %v, want ErrExists", err)
	}
	for i := 4; i <= 12; i++ {
		if _, _, err := st.CreateRequest(ctx, request(fmt.Sprintf("req_%02d", i), "task_1", fmt.Sprintf("call_%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	list, err := st.ListRequests(ctx, "task_1")
	if err != nil || len(list) != 10 {
		t.Fatalf("task_1 requests = %d, %v; want 10", len(list), err)
	}
	if list[0].GetId() != "req_1" || list[1].GetId() != "req_04" || list[9].GetId() != "req_12" {
		t.Errorf("requests not oldest first: %s %s ... %s", list[0].GetId(), list[1].GetId(), list[9].GetId())
	}
	if _, err := st.GetRequest(ctx, "req_2"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the duplicate's id was stored: err = %v", err)
	}
}

func testConcurrentDuplicateSubmission(t *testing.T, st ostore.Store) {
	CheckDuplicateSubmission(t, []ostore.Store{st}, "task_1")
}

// CheckDuplicateSubmission submits one provider call 50 times at once,
// spread over stores (replicas): exactly one request is created and every
// submission gets it back.
func CheckDuplicateSubmission(t *testing.T, stores []ostore.Store, taskID string) {
	ctx := context.Background()
	var wg sync.WaitGroup
	var mu sync.Mutex
	created := 0
	ids := map[string]bool{}
	for i := range 50 {
		st := stores[i%len(stores)]
		wg.Go(func() {
			got, ok, err := st.CreateRequest(ctx, request(fmt.Sprintf("req_%d", i), taskID, "call_dup"))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("create: %v", err)
				return
			}
			if ok {
				created++
			}
			ids[got.GetId()] = true
		})
	}
	wg.Wait()
	if created != 1 || len(ids) != 1 {
		t.Errorf("%d requests created, submissions saw %d ids; want 1 and 1", created, len(ids))
	}
	for _, st := range stores {
		list, err := st.ListRequests(ctx, taskID)
		if err != nil || len(list) != 1 {
			t.Errorf("task lists %d requests, %v; want 1", len(list), err)
		}
	}
}

func attempt(id string, stage adapterv1.DeliveryStage, ended bool) *orchestratorv1.Attempt {
	a := &orchestratorv1.Attempt{Id: id, Stage: stage, StartTime: timestamppb.New(time.Unix(1700000000, 0))}
	if ended {
		a.EndTime = timestamppb.New(time.Unix(1700000001, 0))
	}
	return a
}

func testAttemptStages(t *testing.T, st ostore.Store) {
	ctx := context.Background()
	if _, _, err := st.CreateRequest(ctx, request("req_1", "task_1", "call_1")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.CreateRequest(ctx, request("req_2", "task_1", "call_2")); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		a         *orchestratorv1.Attempt
		wantStage adapterv1.DeliveryStage
		wantOpen  int
	}{
		{attempt("att_1", adapterv1.DeliveryStage_DELIVERY_STAGE_PREPARED, false), adapterv1.DeliveryStage_DELIVERY_STAGE_PREPARED, 1},
		{attempt("att_1", adapterv1.DeliveryStage_DELIVERY_STAGE_SENT, false), adapterv1.DeliveryStage_DELIVERY_STAGE_SENT, 1},
		// A late, older stage report never moves the stage back.
		{attempt("att_1", adapterv1.DeliveryStage_DELIVERY_STAGE_PREPARED, false), adapterv1.DeliveryStage_DELIVERY_STAGE_SENT, 1},
		{attempt("att_1", adapterv1.DeliveryStage_DELIVERY_STAGE_COMMITTED, true), adapterv1.DeliveryStage_DELIVERY_STAGE_COMMITTED, 0},
	}
	for i, s := range steps {
		got, err := st.SaveAttempt(ctx, "req_1", s.a)
		if err != nil {
			t.Fatal(err)
		}
		if len(got.GetAttempts()) != 1 || got.GetAttempts()[0].GetStage() != s.wantStage {
			t.Errorf("step %d: attempts %v, want one at %v", i, got.GetAttempts(), s.wantStage)
		}
		open, err := st.ListOpenRequests(ctx)
		if err != nil || len(open) != s.wantOpen {
			t.Errorf("step %d: %d open requests, %v; want %d", i, len(open), err, s.wantOpen)
		}
	}
	if _, err := st.SaveAttempt(ctx, "req_1", attempt("att_2", adapterv1.DeliveryStage_DELIVERY_STAGE_PREPARED, false)); err != nil {
		t.Fatal(err)
	}
	stored, err := st.GetRequest(ctx, "req_1")
	if err != nil || len(stored.GetAttempts()) != 2 {
		t.Fatalf("request = %v, %v; want two attempts", stored, err)
	}
	open, err := st.ListOpenRequests(ctx)
	if err != nil || len(open) != 1 || open[0].GetId() != "req_1" {
		t.Errorf("open requests = %v, %v; want req_1", open, err)
	}
	if _, err := st.SaveAttempt(ctx, "req_missing", attempt("att_x", adapterv1.DeliveryStage_DELIVERY_STAGE_PREPARED, false)); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("attempt on a missing request: err = %v", err)
	}
	// Concurrent stage reports of one attempt: the furthest one wins.
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			stage := adapterv1.DeliveryStage(1 + i%int(adapterv1.DeliveryStage_DELIVERY_STAGE_COMMITTED))
			if _, err := st.SaveAttempt(ctx, "req_2", attempt("att_r", stage, false)); err != nil {
				t.Errorf("save: %v", err)
			}
		})
	}
	wg.Wait()
	if got, _ := st.GetRequest(ctx, "req_2"); got.GetAttempts()[0].GetStage() != adapterv1.DeliveryStage_DELIVERY_STAGE_COMMITTED {
		t.Errorf("after concurrent reports stage = %v, want COMMITTED", got.GetAttempts()[0].GetStage())
	}
}

func testApprovalUsedOnce(t *testing.T, st ostore.Store) {
	ctx := context.Background()
	if _, _, err := st.CreateRequest(ctx, request("req_plain", "task_1", "call_plain")); err != nil {
		t.Fatal(err)
	}
	if _, err := st.UseApproval(ctx, "req_plain", "bob", timestamppb.Now()); !errors.Is(err, ostore.ErrNotAwaiting) {
		t.Errorf("request without approval: err = %v, want ErrNotAwaiting", err)
	}
	CheckApprovalUsedOnce(t, []ostore.Store{st}, "req_approval")
}

// CheckApprovalUsedOnce creates a request awaiting approval and uses its
// approval 50 times at once, spread over stores (replicas): exactly one
// use succeeds and the rest fail with ErrApprovalUsed.
func CheckApprovalUsedOnce(t *testing.T, stores []ostore.Store, requestID string) {
	ctx := context.Background()
	r := request(requestID, "task_approval", "call_"+requestID)
	r.State = orchestratorv1.RequestState_REQUEST_STATE_AWAITING_APPROVAL
	r.Approval = &orchestratorv1.Approval{Id: "appr_" + requestID, RequestId: requestID}
	if _, _, err := stores[0].CreateRequest(ctx, r); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	used, refused := 0, 0
	var winner string
	for i := range 50 {
		st := stores[i%len(stores)]
		wg.Go(func() {
			approver := fmt.Sprintf("approver_%d", i)
			got, err := st.UseApproval(ctx, requestID, approver, timestamppb.Now())
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				used++
				winner = approver
				if got.GetState() != orchestratorv1.RequestState_REQUEST_STATE_APPROVED {
					t.Errorf("used approval left state %v", got.GetState())
				}
			case errors.Is(err, ostore.ErrApprovalUsed):
				refused++
			default:
				t.Errorf("use approval: %v", err)
			}
		})
	}
	wg.Wait()
	if used != 1 || refused != 49 {
		t.Fatalf("approval used %d times, refused %d; want 1 and 49", used, refused)
	}
	got, err := stores[len(stores)-1].GetRequest(ctx, requestID)
	if err != nil || got.GetApproval().GetApprover() != winner || got.GetApproval().GetUseTime() == nil {
		t.Errorf("stored approval = %v, %v; want used by %s", got.GetApproval(), err, winner)
	}
}

func testEvents(t *testing.T, st ostore.Store) {
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			e := &orchestratorv1.TaskEvent{TaskId: "task_1", Type: "test", Detail: fmt.Sprint(i)}
			got, err := st.AppendEvent(ctx, e)
			if err != nil {
				t.Errorf("append: %v", err)
				return
			}
			if e.GetSequence() != 0 || got.GetSequence() < 1 || got.GetSequence() > 50 {
				t.Errorf("sequence %d returned, argument's %d", got.GetSequence(), e.GetSequence())
			}
		})
	}
	wg.Wait()
	if got, err := st.AppendEvent(ctx, &orchestratorv1.TaskEvent{TaskId: "task_2", Type: "test"}); err != nil || got.GetSequence() != 1 {
		t.Errorf("another task's first event has sequence %d, %v", got.GetSequence(), err)
	}
	all, err := st.ListEvents(ctx, "task_1", 0)
	if err != nil || len(all) != 50 {
		t.Fatalf("events = %d, %v; want 50", len(all), err)
	}
	details := map[string]bool{}
	for i, e := range all {
		if e.GetSequence() != int64(i+1) || e.GetTaskId() != "task_1" {
			t.Errorf("event %d: sequence %d, task %s", i, e.GetSequence(), e.GetTaskId())
		}
		details[e.GetDetail()] = true
	}
	if len(details) != 50 {
		t.Errorf("%d distinct events, want 50", len(details))
	}
	tail, err := st.ListEvents(ctx, "task_1", 47)
	if err != nil || len(tail) != 3 || tail[0].GetSequence() != 48 {
		t.Errorf("events after 47 = %v, %v", tail, err)
	}
	if none, err := st.ListEvents(ctx, "task_1", 50); err != nil || len(none) != 0 {
		t.Errorf("events after the last = %v, %v", none, err)
	}
}

// testEmit: a request or task update that emits events stores both or
// neither; the events take their tasks' next sequences, in order, among
// events appended alone at the same time.
func testEmit(t *testing.T, st ostore.Store) {
	ctx := context.Background()
	if err := st.CreateTask(ctx, &orchestratorv1.Task{Id: "task_1"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.CreateRequest(ctx, &orchestratorv1.ToolRequest{Id: "req_1", TaskId: "task_1", ProviderCallId: "c1"}); err != nil {
		t.Fatal(err)
	}
	ev := func(detail string) *orchestratorv1.TaskEvent {
		return &orchestratorv1.TaskEvent{TaskId: "task_1", Type: "test", Detail: detail}
	}
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Go(func() {
			if _, err := st.AppendEvent(ctx, ev(fmt.Sprint("alone-", i))); err != nil {
				t.Errorf("append: %v", err)
			}
		})
		wg.Go(func() {
			in := []*orchestratorv1.TaskEvent{ev(fmt.Sprint("req-", i, "-a")), ev(fmt.Sprint("req-", i, "-b"))}
			r, got, err := st.UpdateRequestEmit(ctx, "req_1", func(r *orchestratorv1.ToolRequest) error {
				r.Summary += "r"
				return nil
			}, ostore.Held{Events: in, Traces: []*evidencev1.TraceEvent{{TaskId: "task_1", Time: timestamppb.New(time.Unix(int64(i), 0))}},
				Task: &ostore.TaskChange{ID: "task_1", Fn: func(tk *orchestratorv1.Task) error {
					tk.Checkpoint += "h"
					return nil
				}}})
			if err != nil || len(got.Events) != 2 || len(got.Outbox) != 1 || r.GetId() != "req_1" || got.TaskErr != nil {
				t.Errorf("update request emit = %v, %d events, %d outbox entries, %v", r, len(got.Events), len(got.Outbox), err)
				return
			}
			if got.Events[0].GetDetail() != in[0].GetDetail() || got.Events[1].GetSequence() <= got.Events[0].GetSequence() || in[0].GetSequence() != 0 {
				t.Errorf("events %v for %v: order, details or the caller's events changed", got.Events, in)
			}
		})
		wg.Go(func() {
			tk, got, err := st.UpdateTaskEmit(ctx, "task_1", func(tk *orchestratorv1.Task) error {
				tk.Checkpoint += "t"
				return nil
			}, ostore.Held{Events: []*orchestratorv1.TaskEvent{ev(fmt.Sprint("task-", i))}})
			if err != nil || len(got.Events) != 1 || got.Events[0].GetSequence() < 1 || tk.GetId() != "task_1" {
				t.Errorf("update task emit = %v, %v, %v", tk, got, err)
			}
		})
	}
	wg.Wait()
	all, err := st.ListEvents(ctx, "task_1", 0)
	if err != nil || len(all) != 40 {
		t.Fatalf("events = %d, %v; want 40", len(all), err)
	}
	for i, e := range all {
		if e.GetSequence() != int64(i+1) {
			t.Errorf("event %d has sequence %d", i, e.GetSequence())
		}
	}
	// Each request update put its trace event in the outbox with it.
	if box, err := st.ListTraceOutbox(ctx, 100); err != nil || len(box) != 10 {
		t.Errorf("outbox holds %d entries, %v; want 10", len(box), err)
	}
	r, err := st.GetRequest(ctx, "req_1")
	if err != nil || len(r.GetSummary()) != 10 {
		t.Errorf("request summary %q, %v; want 10 updates", r.GetSummary(), err)
	}
	// Task changes made alone and riding request updates lose nothing.
	tk, err := st.GetTask(ctx, "task_1")
	if err != nil || strings.Count(tk.GetCheckpoint(), "t") != 10 || strings.Count(tk.GetCheckpoint(), "h") != 10 {
		t.Errorf("task checkpoint %q, %v; want 10 updates and 10 changes held with request updates", tk.GetCheckpoint(), err)
	}

	// A refused update emits nothing.
	refused := errors.New("refused")
	if _, _, err := st.UpdateRequestEmit(ctx, "req_1", func(*orchestratorv1.ToolRequest) error { return refused }, ostore.Held{Events: []*orchestratorv1.TaskEvent{ev("never")}, Traces: []*evidencev1.TraceEvent{{TaskId: "task_1"}}}); !errors.Is(err, refused) {
		t.Errorf("refused request update = %v", err)
	}
	if _, _, err := st.UpdateTaskEmit(ctx, "task_1", func(*orchestratorv1.Task) error { return refused }, ostore.Held{Events: []*orchestratorv1.TaskEvent{ev("never")}, Traces: []*evidencev1.TraceEvent{{TaskId: "task_1"}}}); !errors.Is(err, refused) {
		t.Errorf("refused task update = %v", err)
	}
	if _, _, err := st.UpdateTaskEmit(ctx, "task_missing", func(*orchestratorv1.Task) error { return nil }, ostore.Held{Events: []*orchestratorv1.TaskEvent{ev("never")}, Traces: []*evidencev1.TraceEvent{{TaskId: "task_1"}}}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("update of a missing task = %v, want not found", err)
	}
	if _, _, err := st.UpdateTaskEmit(ctx, "task_1", func(*orchestratorv1.Task) error { return nil }, ostore.Held{Events: []*orchestratorv1.TaskEvent{ev("never")},
		Task: &ostore.TaskChange{ID: "task_1", Fn: func(*orchestratorv1.Task) error { return nil }}}); err == nil {
		t.Errorf("UpdateTaskEmit with a held task change succeeded; want it refused")
	}
	if after, err := st.ListEvents(ctx, "task_1", 40); err != nil || len(after) != 0 {
		t.Errorf("refused updates emitted %v, %v", after, err)
	}
	if box, err := st.ListTraceOutbox(ctx, 100); err != nil || len(box) != 10 {
		t.Errorf("refused updates left %d outbox entries, %v; want the 10 of before", len(box), err)
	}
	if tk2, err := st.GetTask(ctx, "task_1"); err != nil || tk2.GetCheckpoint() != tk.GetCheckpoint() {
		t.Errorf("refused updates changed the task: %q, %v", tk2.GetCheckpoint(), err)
	}

	// A held task change is secondary to the write it rides: a missing
	// task or its own error leaves the task as it was, says why, and the
	// write and the rest of held happen.
	for _, tc := range []struct {
		name   string
		change *ostore.TaskChange
		want   error
	}{
		{"missing task", &ostore.TaskChange{ID: "task_missing", Fn: func(tk *orchestratorv1.Task) error {
			tk.Checkpoint = "never"
			return nil
		}}, store.ErrNotFound},
		{"refused change", &ostore.TaskChange{ID: "task_1", Fn: func(tk *orchestratorv1.Task) error {
			tk.Checkpoint = "never"
			return refused
		}}, refused},
	} {
		r, got, err := st.UpdateRequestEmit(ctx, "req_1", func(r *orchestratorv1.ToolRequest) error {
			r.Summary += "s"
			return nil
		}, ostore.Held{Events: []*orchestratorv1.TaskEvent{ev(tc.name)}, Task: tc.change})
		if err != nil || r.GetSummary() != strings.Repeat("r", 10)+"s" || len(got.Events) != 1 || !errors.Is(got.TaskErr, tc.want) {
			t.Errorf("%s: update request emit = %q, %d events, task error %v, %v; want the update written and task error %v",
				tc.name, r.GetSummary(), len(got.Events), got.TaskErr, err, tc.want)
		}
		if _, err := st.UpdateRequest(ctx, "req_1", func(r *orchestratorv1.ToolRequest) error {
			r.Summary = strings.TrimSuffix(r.Summary, "s")
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	if tk2, err := st.GetTask(ctx, "task_1"); err != nil || tk2.GetCheckpoint() != tk.GetCheckpoint() {
		t.Errorf("task after failed task changes: %q, %v; want %q", tk2.GetCheckpoint(), err, tk.GetCheckpoint())
	}
	if _, err := st.GetTask(ctx, "task_missing"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a held change of a missing task created it: %v", err)
	}
	// EmitHeld applies a held task change with the events.
	got, err := st.EmitHeld(ctx, ostore.Held{Events: []*orchestratorv1.TaskEvent{ev("emit")}, Task: &ostore.TaskChange{ID: "task_1", Fn: func(tk *orchestratorv1.Task) error {
		tk.Checkpoint = "emitted"
		return nil
	}}})
	if tk2, gerr := st.GetTask(ctx, "task_1"); err != nil || got.TaskErr != nil || len(got.Events) != 1 || gerr != nil || tk2.GetCheckpoint() != "emitted" {
		t.Errorf("emit held with a task change = %+v, %v; task %q, %v", got, err, tk2.GetCheckpoint(), gerr)
	}
}

// testTraceOutbox: trace events put in the outbox come back oldest first,
// a page at a time, and leave it once deleted.
func testTraceOutbox(t *testing.T, st ostore.Store) {
	ctx := context.Background()
	ev := func(i int) *evidencev1.TraceEvent {
		return &evidencev1.TraceEvent{TaskId: "task_o", Layer: &evidencev1.TraceEvent_Product{Product: &evidencev1.ProductEvent{Detail: fmt.Sprint(i)}}}
	}
	details := func(es []ostore.OutboxEntry) []string {
		var out []string
		for _, e := range es {
			out = append(out, e.Event.GetProduct().GetDetail())
		}
		return out
	}
	if got, err := st.ListTraceOutbox(ctx, 10); err != nil || len(got) != 0 {
		t.Fatalf("empty outbox = %v, %v", got, err)
	}
	if err := st.PutTraceOutbox(ctx, []*evidencev1.TraceEvent{ev(0), ev(1), ev(2)}); err != nil {
		t.Fatal(err)
	}
	if err := st.PutTraceOutbox(ctx, []*evidencev1.TraceEvent{ev(3), ev(4)}); err != nil {
		t.Fatal(err)
	}
	page, err := st.ListTraceOutbox(ctx, 4)
	if err != nil || !slices.Equal(details(page), []string{"0", "1", "2", "3"}) {
		t.Fatalf("first page = %v, %v; want 0..3 in order", details(page), err)
	}
	if err := st.DeleteTraceOutbox(ctx, []string{page[0].Key, page[1].Key}); err != nil {
		t.Fatal(err)
	}
	rest, err := st.ListTraceOutbox(ctx, 10)
	if err != nil || !slices.Equal(details(rest), []string{"2", "3", "4"}) {
		t.Fatalf("after delivering two = %v, %v; want 2..4 in order", details(rest), err)
	}

	// Delivered entries are deleted in the transaction of the write that
	// carries them (Held.Delivered), and only when it commits.
	if _, _, err := st.CreateRequest(ctx, request("req_o", "task_o", "call_o")); err != nil {
		t.Fatal(err)
	}
	stage := func(r *orchestratorv1.ToolRequest) error {
		r.State = orchestratorv1.RequestState_REQUEST_STATE_EXECUTED
		return nil
	}
	refused := errors.New("refused")
	if _, _, err := st.UpdateRequestEmit(ctx, "req_o", func(*orchestratorv1.ToolRequest) error { return refused },
		ostore.Held{Delivered: rest[:1]}); !errors.Is(err, refused) {
		t.Fatalf("a refused write = %v", err)
	}
	if got, err := st.ListTraceOutbox(ctx, 10); err != nil || !slices.Equal(details(got), []string{"2", "3", "4"}) {
		t.Fatalf("after a refused write carrying a delete = %v, %v; want 2..4 left", details(got), err)
	}
	if _, _, err := st.UpdateRequestEmit(ctx, "req_o", stage, ostore.Held{Delivered: rest[:2],
		Traces: []*evidencev1.TraceEvent{ev(5)}}); err != nil {
		t.Fatal(err)
	}
	if got, err := st.ListTraceOutbox(ctx, 10); err != nil || !slices.Equal(details(got), []string{"4", "5"}) {
		t.Fatalf("after a write carrying two deletes and an entry = %v, %v; want 4, 5", details(got), err)
	}
}

func testUnsettled(t *testing.T, st ostore.Store) {
	ctx := context.Background()
	ids := func() []string {
		t.Helper()
		rs, err := st.ListUnsettledRequests(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range rs {
			out = append(out, r.GetId())
		}
		sort.Strings(out)
		return out
	}
	for _, id := range []string{"req_a", "req_b", "req_c"} {
		if _, _, err := st.CreateRequest(ctx, request(id, "task_1", "call_"+id)); err != nil {
			t.Fatal(err)
		}
	}
	if got := ids(); !slices.Equal(got, []string{"req_a", "req_b", "req_c"}) {
		t.Fatalf("after create: unsettled = %v, want all three", got)
	}
	steps := []struct {
		id   string
		fn   func(*orchestratorv1.ToolRequest)
		want []string
	}{
		{"req_a", func(r *orchestratorv1.ToolRequest) {
			r.State = orchestratorv1.RequestState_REQUEST_STATE_AWAITING_APPROVAL
		}, []string{"req_a", "req_b", "req_c"}},
		{"req_a", func(r *orchestratorv1.ToolRequest) { r.State = orchestratorv1.RequestState_REQUEST_STATE_APPROVED }, []string{"req_a", "req_b", "req_c"}},
		{"req_b", func(r *orchestratorv1.ToolRequest) { r.State = orchestratorv1.RequestState_REQUEST_STATE_REFUSED }, []string{"req_a", "req_c"}},
		// A terminal state with an attempt never ended is still unsettled.
		{"req_a", func(r *orchestratorv1.ToolRequest) {
			r.State = orchestratorv1.RequestState_REQUEST_STATE_FAILED
			r.Attempts = []*orchestratorv1.Attempt{attempt("att_a", adapterv1.DeliveryStage_DELIVERY_STAGE_SENT, false)}
		}, []string{"req_a", "req_c"}},
		{"req_a", func(r *orchestratorv1.ToolRequest) { r.Attempts[0].EndTime = timestamppb.Now() }, []string{"req_c"}},
		// A request that failed with an unknown outcome awaits its
		// settlement by evidence; once settled it is not listed.
		{"req_a", func(r *orchestratorv1.ToolRequest) { r.Outcome = adapterv1.Outcome_OUTCOME_UNKNOWN }, []string{"req_a", "req_c"}},
		{"req_a", func(r *orchestratorv1.ToolRequest) { r.Outcome = adapterv1.Outcome_OUTCOME_INTERRUPTED }, []string{"req_c"}},
		{"req_c", func(r *orchestratorv1.ToolRequest) { r.State = orchestratorv1.RequestState_REQUEST_STATE_EXECUTED }, nil},
	}
	for i, s := range steps {
		if _, err := st.UpdateRequest(ctx, s.id, func(r *orchestratorv1.ToolRequest) error { s.fn(r); return nil }); err != nil {
			t.Fatal(err)
		}
		if got := ids(); !slices.Equal(got, s.want) {
			t.Errorf("step %d: unsettled = %v, want %v", i, got, s.want)
		}
	}
}

// CheckLeaseWithCreation checks the lease a request's creation takes
// (ostore.LeaseTake): it is the creator's, as one AcquireLease
// would have made it (another replica is refused it, the creator renews
// it, writes fenced by it are made and a newer lease fences them), and a
// resubmission, which creates nothing, takes none.
func CheckLeaseWithCreation(t *testing.T, stores []ostore.Store) {
	ctx := context.Background()
	a, b := stores[0], stores[1%len(stores)]
	take := ostore.LeaseTake{Owner: "replica_a", TTL: time.Hour}
	c, err := a.CreateRequestEmit(ctx, request("req_c", "task_c", "call_c"), ostore.Held{}, take)
	if err != nil {
		t.Fatal(err)
	}
	gen := c.LeaseGeneration
	if !c.Created || gen == 0 {
		t.Fatalf("creation with a lease: created %t, generation %d; want created with a lease", c.Created, gen)
	}
	if got, err := b.AcquireLease(ctx, "req_c", "replica_b", 0, time.Hour); err != nil || got != 0 {
		t.Errorf("another replica's AcquireLease on the created request = %d, %v; want refused", got, err)
	}
	if got, err := a.AcquireLease(ctx, "req_c", "replica_a", gen, time.Hour); err != nil || got != gen {
		t.Errorf("the creator's renewal = %d, %v; want its generation %d", got, err, gen)
	}
	refuse := func(r *orchestratorv1.ToolRequest) error {
		r.State = orchestratorv1.RequestState_REQUEST_STATE_REFUSED
		return nil
	}
	fence := ostore.Held{Fence: ostore.Fence{RequestID: "req_c", Generation: gen}}
	if _, _, err := a.UpdateRequestEmit(ctx, "req_c", refuse, fence); err != nil {
		t.Errorf("a write fenced by the creation's lease: %v", err)
	}

	again, err := b.CreateRequestEmit(ctx, request("req_c2", "task_c", "call_c"), ostore.Held{}, ostore.LeaseTake{Owner: "replica_b", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if again.Created || again.LeaseGeneration != 0 || again.Request.GetId() != "req_c" {
		t.Errorf("resubmission: created %t, generation %d, request %s; want req_c found and no lease", again.Created, again.LeaseGeneration, again.Request.GetId())
	}
	if got, err := a.AcquireLease(ctx, "req_c2", "replica_a", 0, time.Hour); err != nil || got == 0 {
		t.Errorf("AcquireLease on the id a resubmission did not create = %d, %v; want it free", got, err)
	}

	if err := a.ReleaseLease(ctx, "req_c", "replica_a"); err != nil {
		t.Fatal(err)
	}
	newer, err := b.AcquireLease(ctx, "req_c", "replica_b", 0, time.Hour)
	if err != nil || newer <= gen {
		t.Fatalf("lease after the creator released it = %d, %v; want newer than %d", newer, err, gen)
	}
	if _, _, err := a.UpdateRequestEmit(ctx, "req_c", refuse, fence); !errors.Is(err, ostore.ErrFenced) {
		t.Errorf("a write under the creation's lease after a takeover = %v; want ErrFenced", err)
	}
}

// CheckLease checks that a request's lease has one owner at a time across
// the stores (replicas) given: renewals by the owner, refusal of another
// owner while it is live, release only by its owner, takeover after
// expiry, and one winner among replicas racing for a free lease.
func CheckLease(t *testing.T, stores []ostore.Store) {
	ctx := context.Background()
	a, b := stores[0], stores[1%len(stores)]
	acquire := func(st ostore.Store, id, owner string, gen int64, ttl time.Duration) int64 {
		t.Helper()
		got, err := st.AcquireLease(ctx, id, owner, gen, ttl)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	ga := acquire(a, "req_l", "replica_a", 0, time.Hour)
	if ga == 0 {
		t.Fatal("a free lease was refused")
	}
	if got := acquire(a, "req_l", "replica_a", ga, time.Hour); got != ga {
		t.Errorf("the owner's renewal = generation %d, want its own %d", got, ga)
	}
	if acquire(b, "req_l", "replica_b", 0, time.Hour) != 0 {
		t.Error("another replica took a live lease")
	}
	if err := b.ReleaseLease(ctx, "req_l", "replica_b"); err != nil {
		t.Fatal(err)
	}
	if acquire(b, "req_l", "replica_b", 0, time.Hour) != 0 {
		t.Error("a release by a replica that does not own the lease ended it")
	}
	if err := a.ReleaseLease(ctx, "req_l", "replica_a"); err != nil {
		t.Fatal(err)
	}
	gb := acquire(b, "req_l", "replica_b", 0, time.Hour)
	if gb <= ga {
		t.Errorf("a released lease was taken with generation %d after %d; want a newer one", gb, ga)
	}
	if acquire(a, "req_l", "replica_a", ga, time.Hour) != 0 {
		t.Error("a renewal of a lease taken over since succeeded")
	}
	// Leases are per request; generations are newer than any taken
	// before, of any request, so a lease on a request whose generation
	// the store forgot (see Fence) is newer than every stale writer's.
	if g := acquire(a, "req_other", "replica_a", 0, time.Hour); g == 0 {
		t.Error("a lease on another request was refused")
	} else if g <= gb {
		t.Errorf("a lease on another request = generation %d after %d; want a newer one", g, gb)
	}
	// A lease that expired is renewed by its owner while nobody took it
	// (a replica that was slow, not replaced).
	gi := acquire(a, "req_idle", "replica_a", 0, time.Millisecond)
	time.Sleep(10 * time.Millisecond)
	if got := acquire(a, "req_idle", "replica_a", gi, time.Hour); got != gi {
		t.Errorf("renewal of a lease nobody took = generation %d, want %d", got, gi)
	}

	// A lease that is not renewed expires, and only then can another
	// replica take it over.
	ge := acquire(a, "req_expiring", "replica_a", 0, 300*time.Millisecond)
	if ge == 0 {
		t.Fatal("a free lease was refused")
	}
	if acquire(b, "req_expiring", "replica_b", 0, time.Hour) != 0 {
		t.Error("another replica took a lease before it expired")
	}
	deadline := time.Now().Add(30 * time.Second)
	for acquire(b, "req_expiring", "replica_b", 0, time.Hour) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("an expired lease was never taken over")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if acquire(a, "req_expiring", "replica_a", ge, time.Hour) != 0 {
		t.Error("the old owner renewed a lease taken over by another")
	}
	if acquire(a, "req_expiring", "replica_a", 0, time.Hour) != 0 {
		t.Error("the old owner took a live lease of another anew")
	}

	// Of replicas racing for one free lease, exactly one wins.
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		wins int
	)
	for i := range 20 {
		wg.Go(func() {
			gen, err := stores[i%len(stores)].AcquireLease(ctx, "req_race", fmt.Sprintf("replica_%d", i), 0, time.Hour)
			if err != nil {
				t.Error(err)
			}
			if gen != 0 {
				mu.Lock()
				wins++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if wins != 1 {
		t.Errorf("%d replicas won one lease, want 1", wins)
	}
}

// CheckFence checks that a write made under a lease another replica (a
// store of stores) took over since is refused with ErrFenced and writes
// nothing (no state change, task event or outbox entry), whichever write
// it is, while the new owner's writes and unfenced ones go through.
func CheckFence(t *testing.T, stores []ostore.Store) {
	ctx := context.Background()
	a, b := stores[0], stores[1%len(stores)]
	if err := a.CreateTask(ctx, task("task_f", orchestratorv1.TaskState_TASK_STATE_ACTIVE)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.CreateRequest(ctx, request("req_f", "task_f", "call_f")); err != nil {
		t.Fatal(err)
	}
	old, err := a.AcquireLease(ctx, "req_f", "replica_a", 0, time.Hour)
	if err != nil || old == 0 {
		t.Fatalf("acquire = %d, %v", old, err)
	}
	// The lease ends (as one that expired would) and b takes it.
	if err := a.ReleaseLease(ctx, "req_f", "replica_a"); err != nil {
		t.Fatal(err)
	}
	cur, err := b.AcquireLease(ctx, "req_f", "replica_b", 0, time.Hour)
	if err != nil || cur == 0 {
		t.Fatalf("takeover = %d, %v", cur, err)
	}
	held := func(f ostore.Fence, detail string) ostore.Held {
		return ostore.Held{
			Events: []*orchestratorv1.TaskEvent{{TaskId: "task_f", RequestId: "req_f", Type: "test", Detail: detail}},
			Traces: []*evidencev1.TraceEvent{{TaskId: "task_f", Layer: &evidencev1.TraceEvent_Product{Product: &evidencev1.ProductEvent{Detail: detail}}}},
			Fence:  f,
			Task: &ostore.TaskChange{ID: "task_f", Fn: func(tk *orchestratorv1.Task) error {
				tk.Checkpoint = "stale"
				return nil
			}},
		}
	}
	stale := ostore.Fence{RequestID: "req_f", Generation: old}
	before, err := b.ListTraceOutbox(ctx, 1000)
	if err != nil {
		t.Fatal(err)
	}
	writes := []struct {
		name  string
		write func(ostore.Held) error
	}{
		{"UpdateRequestEmit", func(h ostore.Held) error {
			_, _, err := a.UpdateRequestEmit(ctx, "req_f", func(r *orchestratorv1.ToolRequest) error {
				r.State = orchestratorv1.RequestState_REQUEST_STATE_REFUSED
				return nil
			}, h)
			return err
		}},
		{"CreateRequestEmit", func(h ostore.Held) error {
			_, err := a.CreateRequestEmit(ctx, request("req_f", "task_f", "call_f2"), h, ostore.LeaseTake{})
			return err
		}},
		{"UpdateTaskEmit", func(h ostore.Held) error {
			h.Task = nil // it changes the task itself
			_, _, err := a.UpdateTaskEmit(ctx, "task_f", func(tk *orchestratorv1.Task) error {
				tk.Checkpoint = "stale"
				return nil
			}, h)
			return err
		}},
		{"EmitHeld", func(h ostore.Held) error {
			_, err := a.EmitHeld(ctx, h)
			return err
		}},
	}
	for _, w := range writes {
		if err := w.write(held(stale, w.name)); !errors.Is(err, ostore.ErrFenced) {
			t.Errorf("%s under a lease taken over since = %v; want ErrFenced", w.name, err)
		}
	}
	// A generation the store does not know (one it forgot long after
	// the request's last lease) is stale too.
	if _, err := a.CreateRequestEmit(ctx, request("req_unleased", "task_f", "call_u"), held(ostore.Fence{RequestID: "req_unleased", Generation: old}, "unleased"), ostore.LeaseTake{}); !errors.Is(err, ostore.ErrFenced) {
		t.Errorf("a write under a generation the store does not know = %v; want ErrFenced", err)
	}
	if r, err := b.GetRequest(ctx, "req_f"); err != nil || r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_REQUESTED {
		t.Errorf("request after fenced writes = %v, %v; want it unchanged", r, err)
	}
	if tk, err := b.GetTask(ctx, "task_f"); err != nil || tk.GetCheckpoint() != "" {
		t.Errorf("task after fenced writes = %v, %v; want it unchanged", tk, err)
	}
	if evs, err := b.ListEvents(ctx, "task_f", 0); err != nil || len(evs) != 0 {
		t.Errorf("fenced writes left task events %v, %v", evs, err)
	}
	if box, err := b.ListTraceOutbox(ctx, 1000); err != nil || len(box) != len(before) {
		t.Errorf("fenced writes left %d outbox entries, %v; want the %d of before", len(box)-len(before), err, len(before))
	}
	// The new owner writes, and so does a write under no lease.
	for _, f := range []ostore.Fence{{RequestID: "req_f", Generation: cur}, {}} {
		if _, _, err := b.UpdateRequestEmit(ctx, "req_f", func(r *orchestratorv1.ToolRequest) error {
			r.Summary += "w"
			return nil
		}, held(f, "current")); err != nil {
			t.Errorf("write under %+v = %v", f, err)
		}
	}
	if evs, err := b.ListEvents(ctx, "task_f", 0); err != nil || len(evs) != 2 {
		t.Errorf("events after two allowed writes = %d, %v; want 2", len(evs), err)
	}
}

// CheckEventWake checks that a follower through store b learns of the
// events appended through store a, alone or with a state change, each
// with its task.
func CheckEventWake(t *testing.T, a, b ostore.Store) {
	f, ok := b.(ostore.EventFollower)
	if !ok {
		t.Fatalf("%T does not tell of other replicas' events", b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, _, err := a.CreateRequest(ctx, request("req_wake", "task_wake", "call_wake")); err != nil {
		t.Fatal(err)
	}
	follow, err := f.FollowEvents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	next := func(what string) string {
		t.Helper()
		select {
		case id := <-follow:
			return id
		case <-ctx.Done():
			t.Fatalf("%s: not told within the deadline", what)
			return ""
		}
	}
	if _, err := a.AppendEvent(ctx, &orchestratorv1.TaskEvent{TaskId: "task_other", Type: "x"}); err != nil {
		t.Fatal(err)
	}
	if id := next("an event of another task"); id != "task_other" {
		t.Errorf("told of task %q, want task_other", id)
	}
	if _, err := a.AppendEvent(ctx, &orchestratorv1.TaskEvent{TaskId: "task_wake", Type: "x"}); err != nil {
		t.Fatal(err)
	}
	if id := next("an appended event"); id != "task_wake" {
		t.Errorf("told of task %q, want task_wake", id)
	}
	if _, _, err := a.UpdateRequestEmit(ctx, "req_wake", func(*orchestratorv1.ToolRequest) error { return nil },
		ostore.Held{Events: []*orchestratorv1.TaskEvent{{TaskId: "task_wake", Type: "y"}}}); err != nil {
		t.Fatal(err)
	}
	if id := next("an event emitted with a state change"); id != "task_wake" {
		t.Errorf("told of task %q, want task_wake", id)
	}
	if evs, err := b.ListEvents(ctx, "task_wake", 0); err != nil || len(evs) != 2 {
		t.Errorf("replica b lists %d events, %v; want 2", len(evs), err)
	}
	// Following ends with its context.
	cancel()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case _, ok := <-follow:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatal("the follow channel did not close after its context ended")
		}
	}
}
