package orchestrator

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/bounds"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
)

// TestInputBounds: oversized input is INVALID_ARGUMENT with the limit
// named, the error stays small whatever the caller sent, and nothing is
// recorded or sent anywhere.
func TestInputBounds(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cat := h.start(t, "source_review", false).GetCatalogue()
	handle := handleFor(t, cat, capRetrieveAuthorizedSource, migrationGuide.GetTitle())
	ok := map[string]any{"source": handle}
	manyUnknown := map[string]any{"source": handle}
	for i := range 50 {
		manyUnknown[fmt.Sprintf("extra_%02d", i)] = "x"
	}
	big := strings.Repeat("x", 900<<10)

	for _, tc := range []struct {
		name       string
		callID     string
		capability string
		args       map[string]any
		reason     string
		field      string
		says       string
	}{
		{"a 32 KB provider call id", strings.Repeat("c", 32<<10), capRetrieveAuthorizedSource, ok, bounds.ReasonFieldTooLong, "provider_call_id", "at most 256 bytes"},
		{"a 3 MB capability name", "call_cap", strings.Repeat("r", 3<<20), ok, bounds.ReasonFieldTooLong, "capability", "at most 256 bytes"},
		{"2 MiB of arguments", "call_args", capRetrieveAuthorizedSource, map[string]any{"source": handle, "query": strings.Repeat("q", 2<<20)}, bounds.ReasonFieldTooLong, "arguments", "at most 1048576 bytes"},
		{"a 900 KB unknown field name", "call_unknown", capRetrieveAuthorizedSource, map[string]any{"source": handle, big: 1}, reasonUnknownField, "arguments." + big[:maxEchoBytes], ""},
		{"50 unknown fields", "call_many", capRetrieveAuthorizedSource, manyUnknown, reasonUnknownField, "arguments.extra_00", "and 40 more"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := h.submit(t, cat.GetTaskId(), tc.callID, tc.capability, tc.args)
			if !apierror.Is(err, codes.InvalidArgument, tc.reason) {
				t.Fatalf("submit = %v, want INVALID_ARGUMENT %s", err, tc.reason)
			}
			if !contains(apierror.Fields(err), tc.field) {
				t.Errorf("field violations %v, want %.40s…", apierror.Fields(err), tc.field)
			}
			msg := status.Convert(err).Message()
			if len(msg) > 2048 || !strings.Contains(msg+violationText(err), tc.says) {
				t.Errorf("message (%d bytes) %.200q…, want at most 2 KiB saying %q", len(msg), msg, tc.says)
			}
		})
	}
	// Input over a bound is refused before anything is recorded; unknown
	// fields are a refusal of a recorded request (one error model), whose
	// recorded detail is as bounded as the error.
	list, err := h.client.ListRequests(t.Context(), &orchestratorv1.ListRequestsRequest{TaskId: cat.GetTaskId()})
	if err != nil {
		t.Fatal(err)
	}
	var recorded []string
	for _, r := range list.GetRequests() {
		recorded = append(recorded, truncate(r.GetProviderCallId(), 40))
		if r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_REFUSED || len(r.GetRefusalDetail()) > 2048 {
			t.Errorf("request %.40s: %v with a %d-byte detail, want REFUSED with at most 2 KiB", r.GetProviderCallId(), r.GetState(), len(r.GetRefusalDetail()))
		}
	}
	if len(recorded) != 2 || !contains(recorded, "call_unknown") || !contains(recorded, "call_many") {
		t.Errorf("recorded requests %v, want only the two with unknown fields", recorded)
	}
	if n := h.adapter.calls.Load(); n != 0 {
		t.Errorf("adapter called %d times, want 0", n)
	}

	// A task's start and the decisions on requests are bounded alike.
	scope := make([]*orchestratorv1.SourceRef, bounds.Entries+1)
	for i := range scope {
		scope[i] = &orchestratorv1.SourceRef{Uri: fmt.Sprintf("file:///docs/%d.md", i)}
	}
	for _, tc := range []struct {
		name   string
		call   func() error
		reason string
	}{
		{"a 5 KB purpose", func() error {
			_, err := h.client.StartTask(t.Context(), &orchestratorv1.StartTaskRequest{Profile: "source_review", Purpose: strings.Repeat("p", 5<<10), SourceScope: []*orchestratorv1.SourceRef{migrationGuide}})
			return err
		}, bounds.ReasonFieldTooLong},
		{"a 5 KB scope uri", func() error {
			_, err := h.client.StartTask(t.Context(), &orchestratorv1.StartTaskRequest{Profile: "source_review", Purpose: "p", SourceScope: []*orchestratorv1.SourceRef{{Uri: "file:///" + strings.Repeat("d", 5<<10)}}})
			return err
		}, bounds.ReasonFieldTooLong},
		{"1001 scope entries", func() error {
			_, err := h.client.StartTask(t.Context(), &orchestratorv1.StartTaskRequest{Profile: "source_review", Purpose: "p", SourceScope: scope})
			return err
		}, bounds.ReasonScopeTooLarge},
		{"a 5 KB denial reason", func() error {
			_, err := h.client.Deny(t.Context(), &orchestratorv1.DenyRequest{RequestId: "req_x", Reason: strings.Repeat("r", 5<<10)})
			return err
		}, bounds.ReasonFieldTooLong},
		{"a 5 KB cancel reason", func() error {
			_, err := h.client.CancelTask(t.Context(), &orchestratorv1.CancelTaskRequest{Id: cat.GetTaskId(), Reason: strings.Repeat("r", 5<<10)})
			return err
		}, bounds.ReasonFieldTooLong},
	} {
		if err := tc.call(); !apierror.Is(err, codes.InvalidArgument, tc.reason) {
			t.Errorf("%s: %v, want INVALID_ARGUMENT %s", tc.name, err, tc.reason)
		}
	}
	tasks, err := h.client.ListTasks(t.Context(), &orchestratorv1.ListTasksRequest{})
	if err != nil || len(tasks.GetTasks()) != 1 || tasks.GetTasks()[0].GetState() != orchestratorv1.TaskState_TASK_STATE_ACTIVE {
		t.Errorf("tasks after refused input = %v, %v; want the one active task", tasks.GetTasks(), err)
	}
}

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// violationText is the descriptions of err's field violations.
func violationText(err error) string {
	var b strings.Builder
	for _, d := range status.Convert(err).Details() {
		b.WriteString(fmt.Sprint(d))
	}
	return b.String()
}
