package orchestrator

import (
	"context"
	"fmt"
	ostore "github.com/v0m3/v0m3/services/orchestrator/store"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"

	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
)

// A call's trace and task events are written together at its checkpoints:
// what led to the call (the request and the policy decision, the
// request.received event, the PREPARED attempt) is on record before the
// adapter is called, and everything else before SubmitToolRequest
// returns, the trace before the events that tell watchers of it. An
// evidence service without AppendTraces gets the same trace, event by
// event.
func TestCallEventsWrittenAtCheckpoints(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		noBatch     bool
		wantBatches int
	}{
		{"batched", false, 2},
		{"older evidence service", true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			h.evidence.noBatch = tc.noBatch
			cat := h.start(t, "source_review", false).GetCatalogue()
			task := cat.GetTaskId()
			handle := handleFor(t, cat, capRetrieveAuthorizedSource, migrationGuide.GetTitle())

			var (
				tracedBefore []evidencev1.ProductEventKind
				eventsBefore []string
				stageBefore  adapterv1.DeliveryStage
			)
			h.adapter.setRespond(func(in *adapterv1.ExecuteRequest) (*adapterv1.ExecuteResponse, error) {
				for _, p := range h.evidence.product(task) {
					if p.GetRequestId() != "" {
						tracedBefore = append(tracedBefore, p.GetKind())
					}
				}
				evs, err := h.server.st.ListEvents(t.Context(), task, 0)
				if err != nil {
					t.Errorf("list events: %v", err)
				}
				for _, e := range evs {
					if e.GetRequestId() != "" {
						eventsBefore = append(eventsBefore, e.GetType())
					}
				}
				reqs, err := h.server.st.ListRequests(t.Context(), task)
				if err != nil || len(reqs) != 1 || len(reqs[0].GetAttempts()) != 1 {
					t.Errorf("requests at send = %v, %v", reqs, err)
				} else {
					stageBefore = reqs[0].GetAttempts()[0].GetStage()
				}
				return okRetrieval(in)
			})

			r, err := h.submit(t, task, "call_1", capRetrieveAuthorizedSource, map[string]any{"source": handle})
			if err != nil || r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
				t.Fatalf("submit = %v, %v", r, err)
			}
			wantBefore := []evidencev1.ProductEventKind{
				evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_REQUEST_RECEIVED,
				evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_POLICY_DECISION,
			}
			if !slices.Equal(tracedBefore, wantBefore) {
				t.Errorf("traced when the adapter was called: %v, want %v", tracedBefore, wantBefore)
			}
			if !slices.Equal(eventsBefore, []string{"request.received"}) || stageBefore != adapterv1.DeliveryStage_DELIVERY_STAGE_PREPARED {
				t.Errorf("when the adapter was called: events %v, attempt stage %v; want request.received and PREPARED", eventsBefore, stageBefore)
			}

			var after []evidencev1.ProductEventKind
			for _, p := range h.evidence.product(task) {
				if p.GetRequestId() == r.GetId() {
					after = append(after, p.GetKind())
				}
			}
			if len(after) < 5 || after[len(after)-1] != evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_CONSEQUENCE ||
				!slices.Contains(after, evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_EXECUTED) ||
				!slices.Contains(after, evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_OBSERVATION_RECORDED) {
				t.Errorf("trace when SubmitToolRequest returned: %v", after)
			}
			evs, err := h.server.st.ListEvents(t.Context(), task, 0)
			if err != nil || len(evs) == 0 || evs[len(evs)-1].GetType() != "request.executed" {
				t.Errorf("events when SubmitToolRequest returned: %v, %v", evs, err)
			}
			got, err := h.server.st.GetTask(t.Context(), task)
			if err != nil || !strings.Contains(got.GetCheckpoint(), r.GetId()) {
				t.Errorf("task checkpoint %q, %v; want it to name request %s", got.GetCheckpoint(), err, r.GetId())
			}
			h.evidence.mu.Lock()
			batches := h.evidence.batches
			h.evidence.mu.Unlock()
			if batches != tc.wantBatches {
				t.Errorf("%d AppendTraces calls, want %d", batches, tc.wantBatches)
			}
		})
	}
}

// writeCounter counts a store's write transactions of requests and tasks,
// and notes whether the request's commit carried the task's change.
type writeCounter struct {
	ostore.Store
	mu                  sync.Mutex
	writes              []string
	commitCarriedChange bool
}

func (w *writeCounter) note(what string) {
	w.mu.Lock()
	w.writes = append(w.writes, what)
	w.mu.Unlock()
}

func (w *writeCounter) CreateRequestEmit(ctx context.Context, r *orchestratorv1.ToolRequest, held ostore.Held, lease ostore.LeaseTake) (ostore.Creation, error) {
	w.note("create request")
	return w.Store.CreateRequestEmit(ctx, r, held, lease)
}

func (w *writeCounter) UpdateRequestEmit(ctx context.Context, id string, fn func(*orchestratorv1.ToolRequest) error, held ostore.Held) (*orchestratorv1.ToolRequest, ostore.Written, error) {
	w.note("update request")
	out, written, err := w.Store.UpdateRequestEmit(ctx, id, fn, held)
	if err == nil && out.GetState() == orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
		w.mu.Lock()
		w.commitCarriedChange = held.Task != nil && held.Task.ID == out.GetTaskId()
		w.mu.Unlock()
	}
	return out, written, err
}

func (w *writeCounter) UpdateTaskEmit(ctx context.Context, id string, fn func(*orchestratorv1.Task) error, held ostore.Held) (*orchestratorv1.Task, ostore.Written, error) {
	w.note("update task")
	return w.Store.UpdateTaskEmit(ctx, id, fn, held)
}

func (w *writeCounter) UpdateTask(ctx context.Context, id string, fn func(*orchestratorv1.Task) error) (*orchestratorv1.Task, error) {
	w.note("update task")
	return w.Store.UpdateTask(ctx, id, fn)
}

func (w *writeCounter) EmitHeld(ctx context.Context, held ostore.Held) (ostore.Written, error) {
	w.note("emit held")
	return w.Store.EmitHeld(ctx, held)
}

// A committed call's checkpoint text on its task is written in the
// commit's own transaction: four writes for a read (created, prepared,
// executed, committed), none of them for the task alone.
func TestTaskCheckpointRidesTheCommit(t *testing.T) {
	t.Parallel()
	st := &writeCounter{Store: newBoltStore(t)}
	h := newHarnessOn(t, st)
	cat := h.start(t, "source_review", false).GetCatalogue()
	handle := handleFor(t, cat, capRetrieveAuthorizedSource, migrationGuide.GetTitle())
	st.mu.Lock()
	st.writes = nil
	st.mu.Unlock()

	r, err := h.submit(t, cat.GetTaskId(), "call_1", capRetrieveAuthorizedSource, map[string]any{"source": handle})
	if err != nil || r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
		t.Fatalf("submit = %v, %v", r, err)
	}
	st.mu.Lock()
	writes, carried := slices.Clone(st.writes), st.commitCarriedChange
	st.mu.Unlock()
	want := []string{"create request", "update request", "update request", "update request"}
	if !slices.Equal(writes, want) || !carried {
		t.Errorf("writes of one call: %v, the commit carried the task change: %t; want %v, true", writes, carried, want)
	}
	got, err := h.server.st.GetTask(t.Context(), cat.GetTaskId())
	if err != nil || !strings.Contains(got.GetCheckpoint(), r.GetId()) {
		t.Errorf("task checkpoint %q, %v; want it to name request %s", got.GetCheckpoint(), err, r.GetId())
	}
}

// taskReads counts a store's reads of tasks and catalogues.
type taskReads struct {
	ostore.Store
	tasks, catalogues atomic.Int64
}

func (r *taskReads) GetTask(ctx context.Context, id string) (*orchestratorv1.Task, error) {
	r.tasks.Add(1)
	return r.Store.GetTask(ctx, id)
}

func (r *taskReads) GetCatalogue(ctx context.Context, taskID string) (*orchestratorv1.OfferedCatalogue, error) {
	r.catalogues.Add(1)
	return r.Store.GetCatalogue(ctx, taskID)
}

// A submission reads its task once, the first time, to know who may
// submit; after that the task and the offered catalogue the request is
// checked against come with the request's creation, not from reads of
// their own.
func TestSubmissionReadsTaskWithTheCreation(t *testing.T) {
	t.Parallel()
	st := &taskReads{Store: newBoltStore(t)}
	h := newHarnessOn(t, st)
	cat := h.start(t, "source_review", false).GetCatalogue()
	handle := handleFor(t, cat, capRetrieveAuthorizedSource, migrationGuide.GetTitle())
	for i, want := range [][2]int64{{1, 0}, {0, 0}} {
		tasks, catalogues := st.tasks.Load(), st.catalogues.Load()
		r, err := h.submit(t, cat.GetTaskId(), fmt.Sprintf("call_%d", i), capRetrieveAuthorizedSource, map[string]any{"source": handle})
		if err != nil || r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
			t.Fatalf("submit %d = %v, %v", i, r, err)
		}
		if got := [2]int64{st.tasks.Load() - tasks, st.catalogues.Load() - catalogues}; got != want {
			t.Errorf("submission %d read %d tasks and %d catalogues of their own; want %d, %d", i, got[0], got[1], want[0], want[1])
		}
	}
}

// Keeping a task for the access check does not keep the access: once the
// requester has submitted, a stranger's submission to the same task is
// still refused and records nothing.
func TestKeptTaskStillRefusesStrangers(t *testing.T) {
	t.Parallel()
	st := &taskReads{Store: newBoltStore(t)}
	h := newHarnessOn(t, st)
	cat := h.start(t, "source_review", false).GetCatalogue()
	args := map[string]any{"source": handleFor(t, cat, capRetrieveAuthorizedSource, migrationGuide.GetTitle())}
	if _, err := h.submit(t, cat.GetTaskId(), "call_1", capRetrieveAuthorizedSource, args); err != nil {
		t.Fatal(err)
	}
	tasks := st.tasks.Load()
	_, err := h.client.SubmitToolRequest(as(t.Context(), "mallory"), &orchestratorv1.SubmitToolRequestRequest{
		TaskId: cat.GetTaskId(), ProviderCallId: "call_2", Capability: capRetrieveAuthorizedSource, Arguments: mustStruct(t, args),
	})
	wantErr(t, err, codes.PermissionDenied, "ROLE_NOT_GRANTED")
	if st.tasks.Load() != tasks {
		t.Errorf("the refused submission read the task again; want it checked against the task kept")
	}
	list, err := h.client.ListRequests(t.Context(), &orchestratorv1.ListRequestsRequest{TaskId: cat.GetTaskId()})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(list.GetRequests()); n != 1 {
		t.Errorf("task has %d requests after the refused submission, want 1", n)
	}
}
