package orchestrator

import (
	"context"
	"fmt"
	ostore "github.com/v0m3/v0m3/services/orchestrator/store"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/v0m3/v0m3/internal/apierror"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	"github.com/v0m3/v0m3/services/orchestrator/tasks"
)

// TestInterruptedStartEndsOnRetry: a StartTask interrupted after its task
// was recorded and before its catalogue was (its replica killed) leaves
// the task active without a catalogue; once startAbandoned has passed, a
// retry with the same request id ends that task and answers
// TASK_START_FAILED, and so does every later retry: one answer, never an
// endless TASK_STARTING. A new request id starts a task.
func TestInterruptedStartEndsOnRetry(t *testing.T) {
	t.Parallel()
	k := &killAt{point: FailPointTaskCreated}
	h := newHarness(t, func(d *Deps) { d.FailPoint = k.hit })
	start := func(key string) (*orchestratorv1.StartTaskResponse, error) {
		return h.client.StartTask(t.Context(), &orchestratorv1.StartTaskRequest{
			RequestId: key, Profile: "source_review", Purpose: "check the migration claims", SourceScope: []*orchestratorv1.SourceRef{migrationGuide},
		})
	}
	_, err := start("start-1")
	wantErr(t, err, codes.Unavailable, reasonReplicaStopped)
	id := tasks.IdempotentID("alice", "", "start-1")
	if task, err := h.server.st.GetTask(t.Context(), id); err != nil || task.GetState() != orchestratorv1.TaskState_TASK_STATE_ACTIVE {
		t.Fatalf("the interrupted start left %v, %v; want an active task without a catalogue", task, err)
	}

	h.clock.Advance(tasks.StartAbandoned)
	for range 2 {
		_, err = start("start-1")
		wantErr(t, err, codes.FailedPrecondition, "TASK_START_FAILED")
	}
	task, err := h.server.st.GetTask(t.Context(), id)
	if err != nil || task.GetState() != orchestratorv1.TaskState_TASK_STATE_CANCELLED || !strings.Contains(task.GetCheckpoint(), "interrupted") {
		t.Errorf("after the retries the task is %v, %v; want it cancelled as interrupted", task, err)
	}
	if got, err := start("start-2"); err != nil || got.GetTask().GetState() != orchestratorv1.TaskState_TASK_STATE_ACTIVE || got.GetCatalogue() == nil {
		t.Errorf("a new request id = %v, %v; want a started task", got, err)
	}
}

// catalogueRefused is a store whose disk fills up just when a catalogue
// is to be written.
type catalogueRefused struct{ ostore.Store }

func (catalogueRefused) PutCatalogue(context.Context, *orchestratorv1.OfferedCatalogue) error {
	return fmt.Errorf("put catalogue: %w", syscall.ENOSPC)
}

// TestStartWhoseCatalogueCannotBeStoredIsStopped: a catalogue the store
// refuses stops the task at once; the caller learns the store is full and
// that the task is stopped, and a retry with the same request id answers
// TASK_START_FAILED without waiting.
func TestStartWhoseCatalogueCannotBeStoredIsStopped(t *testing.T) {
	t.Parallel()
	h := newHarnessOn(t, catalogueRefused{newBoltStore(t)})
	req := &orchestratorv1.StartTaskRequest{
		RequestId: "start-1", Profile: "source_review", Purpose: "check the migration claims", SourceScope: []*orchestratorv1.SourceRef{migrationGuide},
	}
	_, err := h.client.StartTask(t.Context(), req)
	wantErr(t, err, codes.ResourceExhausted, apierror.ReasonStoreFull)
	if msg := status.Convert(err).Message(); !strings.Contains(msg, "TASK_START_FAILED") {
		t.Errorf("the error does not say the task was recorded and stopped: %q", msg)
	}
	task, err := h.server.st.GetTask(t.Context(), tasks.IdempotentID("alice", "", "start-1"))
	if err != nil || task.GetState() != orchestratorv1.TaskState_TASK_STATE_CANCELLED {
		t.Errorf("the task is %v, %v; want it cancelled", task, err)
	}
	_, err = h.client.StartTask(t.Context(), req)
	wantErr(t, err, codes.FailedPrecondition, "TASK_START_FAILED")
}
