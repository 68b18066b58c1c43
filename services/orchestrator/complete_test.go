package orchestrator

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/v0m3/v0m3/internal/apierror"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
)

// TestCompleteTaskWaitsOnlyForLiveRequests: a request being decided or
// executed keeps the task from completing; one whose process died before
// its first attempt stops doing so after two attempt timeouts; one with an
// open attempt (recovery settles it) does not.
func TestCompleteTaskWaitsOnlyForLiveRequests(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		state    orchestratorv1.RequestState
		attempt  bool // an attempt with no end time
		laterOK  bool // completes after two attempt timeouts
		blocking bool // blocks completion now
	}{
		{"requested", orchestratorv1.RequestState_REQUEST_STATE_REQUESTED, false, true, true},
		{"approved", orchestratorv1.RequestState_REQUEST_STATE_APPROVED, false, true, true},
		{"approved, attempt open", orchestratorv1.RequestState_REQUEST_STATE_APPROVED, true, false, true},
		{"executed", orchestratorv1.RequestState_REQUEST_STATE_EXECUTED, false, true, false},
		{"failed", orchestratorv1.RequestState_REQUEST_STATE_FAILED, false, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			task := h.start(t, "source_review", false).GetTask().GetId()
			now := timestamppb.New(h.server.now())
			r := &orchestratorv1.ToolRequest{Id: "req_" + task, TaskId: task, ProviderCallId: "c1", Capability: capRetrieveAuthorizedSource,
				State: tc.state, CreateTime: now, UpdateTime: now}
			if tc.attempt {
				r.Attempts = []*orchestratorv1.Attempt{{Id: "att_1", Number: 1, StartTime: now}}
			}
			if _, _, err := h.server.st.CreateRequest(t.Context(), r); err != nil {
				t.Fatal(err)
			}
			_, err := h.client.CompleteTask(t.Context(), &orchestratorv1.CompleteTaskRequest{Id: task})
			if tc.blocking != apierror.Is(err, codes.FailedPrecondition, "REQUESTS_IN_FLIGHT") || (!tc.blocking && err != nil) {
				t.Fatalf("complete now = %v, blocking %v", err, tc.blocking)
			}
			if !tc.blocking {
				return
			}
			h.clock.Advance(2*DefaultAttemptTimeout + time.Minute)
			got, err := h.client.CompleteTask(t.Context(), &orchestratorv1.CompleteTaskRequest{Id: task})
			if tc.laterOK != (err == nil) {
				t.Fatalf("complete later = %v, %v; want it to succeed: %v", got.GetState(), err, tc.laterOK)
			}
			if tc.laterOK && got.GetState() != orchestratorv1.TaskState_TASK_STATE_COMPLETED {
				t.Errorf("state %v", got.GetState())
			}
		})
	}
}
