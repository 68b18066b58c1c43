package orchestrator

import (
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	"github.com/v0m3/v0m3/services/internal/apierror"
	"github.com/v0m3/v0m3/services/internal/redistest"
)

// TestStoreOutageIsUnavailable: with the orchestrator's Redis down, a
// call that needs the store is UNAVAILABLE STORE_UNAVAILABLE with a
// RetryInfo (try again later), not INTERNAL; once Redis is back the same
// call succeeds and the task it reads is intact.
func TestStoreOutageIsUnavailable(t *testing.T) {
	t.Parallel()
	redis := redistest.StartServer(t)
	h := newHarnessOn(t, NewRedisStore(redistest.Client(t, redis.Addr), redistest.Prefix(t)))
	task := h.start(t, "source_review", false).GetTask()

	if err := redis.Kill(); err != nil {
		t.Fatal(err)
	}
	for name, call := range map[string]func() error{
		"GetTask": func() error {
			_, err := h.client.GetTask(t.Context(), &orchestratorv1.GetTaskRequest{Id: task.GetId()})
			return err
		},
		"StartTask": func() error {
			_, err := h.client.StartTask(t.Context(), &orchestratorv1.StartTaskRequest{Profile: "source_review", Purpose: "p", SourceScope: []*orchestratorv1.SourceRef{migrationGuide}})
			return err
		},
	} {
		err := call()
		if !apierror.Is(err, codes.Unavailable, apierror.ReasonStoreUnavailable) {
			t.Errorf("%s with Redis down: %v, want UNAVAILABLE %s", name, err, apierror.ReasonStoreUnavailable)
			continue
		}
		var retry *errdetails.RetryInfo
		for _, d := range status.Convert(err).Details() {
			if r, ok := d.(*errdetails.RetryInfo); ok {
				retry = r
			}
		}
		if retry.GetRetryDelay().AsDuration() <= 0 {
			t.Errorf("%s with Redis down carries no retry delay: %v", name, status.Convert(err).Details())
		}
	}

	if err := redis.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the task readable once Redis is back", func() bool {
		got, err := h.client.GetTask(t.Context(), &orchestratorv1.GetTaskRequest{Id: task.GetId()})
		return err == nil && got.GetId() == task.GetId()
	})
}
