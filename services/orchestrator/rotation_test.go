package orchestrator

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
)

// TestRetrievalFollowsRotation: the adapter refuses a call granted at a
// config revision the connection has just left. The orchestrator attempts
// again at the new revision only when the mapping is still the active one
// there (a rotation within the declared scope), and only a bounded number
// of times; otherwise the request fails and nothing more is sent.
func TestRetrievalFollowsRotation(t *testing.T) {
	t.Parallel()
	refuse := func(in *adapterv1.ExecuteRequest) error {
		return apierror.New(codes.FailedPrecondition, reasonConfigRevisionChanged,
			fmt.Sprintf("connection %s moved on from revision %d", in.GetConnectionId(), in.GetConfigRevision()), nil)
	}
	tests := []struct {
		name string
		// change runs when the adapter receives a call at revision rev and
		// says whether the adapter refuses it.
		change    func(h *harness, rev int64) bool
		wantState orchestratorv1.RequestState
		wantCalls int64
		wantLast  int64 // config revision of the last call
	}{
		{"rotation within scope", func(h *harness, rev int64) bool {
			if rev == 3 {
				h.registry.rotate()
				return true
			}
			return false
		}, orchestratorv1.RequestState_REQUEST_STATE_EXECUTED, 2, 4},
		{"new revision sent the mapping to review", func(h *harness, _ int64) bool {
			h.registry.rotate()
			h.registry.setReviewRequired("map_retrieve")
			return true
		}, orchestratorv1.RequestState_REQUEST_STATE_FAILED, 1, 3},
		{"registry still at the granted revision", func(*harness, int64) bool { return true },
			orchestratorv1.RequestState_REQUEST_STATE_FAILED, 1, 3},
		{"connection never settles", func(h *harness, _ int64) bool {
			h.registry.rotate()
			return true
		}, orchestratorv1.RequestState_REQUEST_STATE_FAILED, 1 + maxRevisionFollows, 3 + maxRevisionFollows},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			h.adapter.setRespond(func(in *adapterv1.ExecuteRequest) (*adapterv1.ExecuteResponse, error) {
				if tc.change(h, in.GetConfigRevision()) {
					return nil, refuse(in)
				}
				return okRetrieval(in)
			})
			cat := h.start(t, "source_review", false).GetCatalogue()
			handle := handleFor(t, cat, capRetrieveAuthorizedSource, migrationGuide.GetTitle())
			r, err := h.submit(t, cat.GetTaskId(), "call_1", capRetrieveAuthorizedSource, map[string]any{"source": handle, "max_passages": 3})
			if err != nil {
				t.Fatalf("submit: %v", err)
			}
			if r.GetState() != tc.wantState {
				t.Errorf("state = %v, want %v (%s)", r.GetState(), tc.wantState, r.GetRefusalDetail())
			}
			if n := h.adapter.calls.Load(); n != tc.wantCalls {
				t.Errorf("adapter calls = %d, want %d", n, tc.wantCalls)
			}
			if got := h.adapter.lastRequest().GetConfigRevision(); got != tc.wantLast {
				t.Errorf("last call at config revision %d, want %d", got, tc.wantLast)
			}
			if int64(len(r.GetAttempts())) != tc.wantCalls {
				t.Fatalf("%d attempts, want one per call (%d)", len(r.GetAttempts()), tc.wantCalls)
			}
			if tc.wantState == orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
				if first := r.GetAttempts()[0]; !strings.Contains(first.GetResolution(), "from config revision 3 to 4") || first.GetEndTime() == nil {
					t.Errorf("first attempt = %v; want it ended, saying the connection moved from revision 3 to 4", first)
				}
			}
		})
	}
}

// TestApprovedCallDoesNotFollowRotation: a person approved the call at one
// config revision; when the connection moves on between approval and the
// call, the orchestrator does not carry the approval over to the new
// revision: the request fails and the render is never sent again.
func TestApprovedCallDoesNotFollowRotation(t *testing.T) {
	t.Parallel()
	h := newPreviewHarness(t)
	rendered := h.adapter.respond
	h.adapter.setRespond(func(in *adapterv1.ExecuteRequest) (*adapterv1.ExecuteResponse, error) {
		if in.GetTarget().GetName() == "render" {
			h.registry.rotate()
			return nil, apierror.New(codes.FailedPrecondition, reasonConfigRevisionChanged, "connection moved on", nil)
		}
		return rendered(in)
	})
	task := h.start(t, "preview", false).GetTask()
	r := h.submitPreview(t, task.GetId(), "call_1")
	got, err := h.approve(t, r.GetId())
	if err == nil && got.GetState() == orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
		t.Fatalf("approved call executed at a revision it was not approved at: %v", got)
	}
	if n := h.adapter.calls.Load(); n != 1 {
		t.Errorf("adapter calls = %d, want 1: the approved call is not sent again at the new revision", n)
	}
	if h.renders.Load() != 0 {
		t.Errorf("rendered %d times", h.renders.Load())
	}
}
