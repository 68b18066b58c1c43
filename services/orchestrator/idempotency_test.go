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
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
)

// TestSamePayload: a retry is the same StartTask only when everything
// that shapes the task is the same.
func TestSamePayload(t *testing.T) {
	t.Parallel()
	scope := []*orchestratorv1.SourceRef{{Uri: "s://a", Title: "A"}, {Uri: "s://b", Title: "B"}}
	task := &orchestratorv1.Task{
		Requester: &policyv1.Principal{Id: "alice", Groups: []string{"authors"}}, Purpose: "review",
		SourceScope: scope, Profile: "source_review",
	}
	base := func() *orchestratorv1.StartTaskRequest {
		return &orchestratorv1.StartTaskRequest{Profile: "source_review", Purpose: "review", SourceScope: scope, RequestId: "k"}
	}
	alice := &policyv1.Principal{Id: "alice"}
	for _, tc := range []struct {
		name      string
		change    func(*orchestratorv1.StartTaskRequest)
		requester *policyv1.Principal
		actor     string
		same      bool
	}{
		{"identical", func(*orchestratorv1.StartTaskRequest) {}, alice, "", true},
		{"groups renewed", func(*orchestratorv1.StartTaskRequest) {}, &policyv1.Principal{Id: "alice", Groups: []string{"authors", "x"}}, "", true},
		{"kind naming the same profile", func(r *orchestratorv1.StartTaskRequest) {
			r.Profile = ""
			//lint:ignore SA1019 a retry may still name the deprecated kind.
			r.Kind = orchestratorv1.TaskKind_TASK_KIND_SOURCE_REVIEW
		}, alice, "", false}, // the task recorded no kind
		{"purpose", func(r *orchestratorv1.StartTaskRequest) { r.Purpose = "other" }, alice, "", false},
		{"profile", func(r *orchestratorv1.StartTaskRequest) { r.Profile = "rewrite" }, alice, "", false},
		{"evidence", func(r *orchestratorv1.StartTaskRequest) { r.EvidencePresent = true }, alice, "", false},
		{"sources reordered", func(r *orchestratorv1.StartTaskRequest) {
			r.SourceScope = []*orchestratorv1.SourceRef{scope[1], scope[0]}
		}, alice, "", false},
		{"source retitled", func(r *orchestratorv1.StartTaskRequest) {
			r.SourceScope = []*orchestratorv1.SourceRef{scope[0], {Uri: "s://b", Title: "other"}}
		}, alice, "", false},
		{"fewer sources", func(r *orchestratorv1.StartTaskRequest) { r.SourceScope = scope[:1] }, alice, "", false},
		{"another requester", func(*orchestratorv1.StartTaskRequest) {}, &policyv1.Principal{Id: "bob"}, "", false},
		{"an actor", func(*orchestratorv1.StartTaskRequest) {}, alice, "svc", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := base()
			tc.change(r)
			if got := samePayload(r, task, tc.requester, tc.actor); got != tc.same {
				t.Errorf("samePayload = %v, want %v", got, tc.same)
			}
		})
	}
}

// TestIdempotentTaskID: the id depends on every part of the key, and the
// parts cannot run into each other.
func TestIdempotentTaskID(t *testing.T) {
	t.Parallel()
	ids := map[string]string{}
	for name, parts := range map[string][3]string{
		"base": {"alice", "", "k"}, "requester": {"bob", "", "k"}, "actor": {"alice", "svc", "k"},
		"key": {"alice", "", "k2"}, "shifted": {"alic", "e", "k"}, "shifted key": {"alice", "k", ""},
	} {
		id := idempotentTaskID(parts[0], parts[1], parts[2])
		if other, dup := ids[id]; dup {
			t.Errorf("%s and %s share task id %s", name, other, id)
		}
		ids[id] = name
	}
	first, again := idempotentTaskID("alice", "", "k"), idempotentTaskID("alice", "", "k")
	if first != again {
		t.Error("the id is not deterministic")
	}
}

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
	id := idempotentTaskID("alice", "", "start-1")
	if task, err := h.server.st.GetTask(t.Context(), id); err != nil || task.GetState() != orchestratorv1.TaskState_TASK_STATE_ACTIVE {
		t.Fatalf("the interrupted start left %v, %v; want an active task without a catalogue", task, err)
	}

	h.clock.Advance(startAbandoned)
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
	task, err := h.server.st.GetTask(t.Context(), idempotentTaskID("alice", "", "start-1"))
	if err != nil || task.GetState() != orchestratorv1.TaskState_TASK_STATE_CANCELLED {
		t.Errorf("the task is %v, %v; want it cancelled", task, err)
	}
	_, err = h.client.StartTask(t.Context(), req)
	wantErr(t, err, codes.FailedPrecondition, "TASK_START_FAILED")
}
