package orchestrator

import (
	"context"
	"errors"
	"fmt"
	ostore "github.com/v0m3/v0m3/services/orchestrator/store"
	"path/filepath"
	"sync"
	"testing"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/v0m3/v0m3/internal/ids"
	"github.com/v0m3/v0m3/internal/store"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
)

func openStore(t *testing.T, path string) (ostore.Store, *store.DB) {
	t.Helper()
	db, err := store.Open(path)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	return ostore.NewBoltStore(db), db
}

func newRequest(taskID, callID string) *orchestratorv1.ToolRequest {
	return &orchestratorv1.ToolRequest{
		Id: ids.New("req"), TaskId: taskID, ProviderCallId: callID, Capability: capRetrieveAuthorizedSource,
		IntentId: ids.New("int"), State: orchestratorv1.RequestState_REQUEST_STATE_REQUESTED, CreateTime: timestamppb.Now(),
	}
}

func TestCreateRequestIsIdempotentUnderConcurrency(t *testing.T) {
	t.Parallel()
	st, db := openStore(t, filepath.Join(t.TempDir(), "o.db"))
	defer db.Close()
	ctx := context.Background()

	const n = 20
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		created int
		seen    = map[string]string{} // request id -> intent id
	)
	for range n {
		wg.Go(func() {
			got, ok, err := st.CreateRequest(ctx, newRequest("task_1", "call_same"))
			if err != nil {
				t.Errorf("create: %v", err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if ok {
				created++
			}
			seen[got.GetId()] = got.GetIntentId()
		})
	}
	wg.Wait()
	if created != 1 || len(seen) != 1 {
		t.Fatalf("created %d, distinct requests %v; want exactly one", created, seen)
	}
	rs, err := st.ListRequests(ctx, "task_1")
	if err != nil || len(rs) != 1 {
		t.Fatalf("list = %v, %v", rs, err)
	}
	// Same provider call id in another task is another request.
	if _, ok, _ := st.CreateRequest(ctx, newRequest("task_2", "call_same")); !ok {
		t.Error("a different task's call was treated as a duplicate")
	}
}

func TestStorePersistsAcrossReopen(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "o.db")
	ctx := context.Background()

	st, db := openStore(t, path)
	task := &orchestratorv1.Task{Id: "task_1", State: orchestratorv1.TaskState_TASK_STATE_ACTIVE, NeededCapabilities: []string{capRetrieveAuthorizedSource}}
	if err := st.CreateTask(ctx, task); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateTask(ctx, task); !errors.Is(err, store.ErrExists) {
		t.Errorf("second create = %v, want ErrExists", err)
	}
	if err := st.PutCatalogue(ctx, &orchestratorv1.OfferedCatalogue{TaskId: "task_1", PolicyRevision: "sha256:p",
		Offered: []*orchestratorv1.OfferedCapability{{Name: capRetrieveAuthorizedSource}}}); err != nil {
		t.Fatal(err)
	}
	var reqIDs []string
	for i := range 3 {
		r, _, err := st.CreateRequest(ctx, newRequest("task_1", fmt.Sprintf("call_%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		reqIDs = append(reqIDs, r.GetId())
	}
	for range 3 {
		if _, err := st.AppendEvent(ctx, &orchestratorv1.TaskEvent{TaskId: "task_1", Type: "x"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.UpdateTask(ctx, "task_1", func(t *orchestratorv1.Task) error {
		t.State = orchestratorv1.TaskState_TASK_STATE_CANCELLED
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	st, db = openStore(t, path)
	defer db.Close()
	got, err := st.GetTask(ctx, "task_1")
	if err != nil || got.GetState() != orchestratorv1.TaskState_TASK_STATE_CANCELLED {
		t.Errorf("task after reopen = %v, %v", got, err)
	}
	cat, err := st.GetCatalogue(ctx, "task_1")
	if err != nil || cat.GetPolicyRevision() != "sha256:p" {
		t.Errorf("catalogue after reopen = %v, %v", cat, err)
	}
	rs, err := st.ListRequests(ctx, "task_1")
	if err != nil || len(rs) != 3 {
		t.Fatalf("requests after reopen = %v, %v", rs, err)
	}
	for i, r := range rs {
		if r.GetId() != reqIDs[i] {
			t.Errorf("request %d = %s, want %s (oldest first)", i, r.GetId(), reqIDs[i])
		}
	}
	// Resubmission after a restart still finds the original request.
	again, created, err := st.CreateRequest(ctx, newRequest("task_1", "call_1"))
	if err != nil || created || again.GetId() != reqIDs[1] {
		t.Errorf("resubmit after reopen = %v, created %t, %v", again, created, err)
	}
	// Sequences continue where they stopped.
	ev, err := st.AppendEvent(ctx, &orchestratorv1.TaskEvent{TaskId: "task_1", Type: "y"})
	if err != nil || ev.GetSequence() != 4 {
		t.Errorf("event after reopen = %v, %v", ev, err)
	}
	evs, _ := st.ListEvents(ctx, "task_1", 2)
	if len(evs) != 2 || evs[0].GetSequence() != 3 || evs[1].GetType() != "y" {
		t.Errorf("events after 2 = %v", evs)
	}
	if _, err := st.GetTask(ctx, "task_missing"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("missing task = %v, want ErrNotFound", err)
	}
}

func TestEventSequencesArePerTask(t *testing.T) {
	t.Parallel()
	st, db := openStore(t, filepath.Join(t.TempDir(), "o.db"))
	defer db.Close()
	ctx := context.Background()
	var wg sync.WaitGroup
	for _, task := range []string{"task_a", "task_b"} {
		for range 10 {
			wg.Go(func() {
				if _, err := st.AppendEvent(ctx, &orchestratorv1.TaskEvent{TaskId: task, Type: "x"}); err != nil {
					t.Errorf("append: %v", err)
				}
			})
		}
	}
	wg.Wait()
	for _, task := range []string{"task_a", "task_b"} {
		evs, err := st.ListEvents(ctx, task, 0)
		if err != nil || len(evs) != 10 {
			t.Fatalf("%s events = %d, %v", task, len(evs), err)
		}
		for i, e := range evs {
			if e.GetSequence() != int64(i+1) || e.GetTaskId() != task {
				t.Errorf("%s event %d = %v", task, i, e)
			}
		}
	}
}

func TestSaveAttemptNeverMovesStageBackwards(t *testing.T) {
	t.Parallel()
	st, db := openStore(t, filepath.Join(t.TempDir(), "o.db"))
	defer db.Close()
	ctx := context.Background()
	r, _, err := st.CreateRequest(ctx, newRequest("task_1", "call_1"))
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		stage adapterv1.DeliveryStage
		want  adapterv1.DeliveryStage
	}{
		{adapterv1.DeliveryStage_DELIVERY_STAGE_PREPARED, adapterv1.DeliveryStage_DELIVERY_STAGE_PREPARED},
		{adapterv1.DeliveryStage_DELIVERY_STAGE_RESULT_OBSERVED, adapterv1.DeliveryStage_DELIVERY_STAGE_RESULT_OBSERVED},
		{adapterv1.DeliveryStage_DELIVERY_STAGE_SENT, adapterv1.DeliveryStage_DELIVERY_STAGE_RESULT_OBSERVED},
		{adapterv1.DeliveryStage_DELIVERY_STAGE_COMMITTED, adapterv1.DeliveryStage_DELIVERY_STAGE_COMMITTED},
	}
	for _, s := range steps {
		got, err := st.SaveAttempt(ctx, r.GetId(), &orchestratorv1.Attempt{Id: "att_1", Number: 1, Stage: s.stage})
		if err != nil {
			t.Fatal(err)
		}
		if len(got.GetAttempts()) != 1 || got.GetAttempts()[0].GetStage() != s.want {
			t.Errorf("after saving %s: attempts = %v, want stage %s", s.stage, got.GetAttempts(), s.want)
		}
	}
	got, _ := st.SaveAttempt(ctx, r.GetId(), &orchestratorv1.Attempt{Id: "att_2", Number: 2, Stage: adapterv1.DeliveryStage_DELIVERY_STAGE_PREPARED})
	if len(got.GetAttempts()) != 2 {
		t.Errorf("second attempt not appended: %v", got.GetAttempts())
	}
	if _, err := st.SaveAttempt(ctx, "req_missing", &orchestratorv1.Attempt{Id: "att_1"}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("save on a missing request = %v, want ErrNotFound", err)
	}
}
