package orchestrator

import (
	"context"
	"fmt"
	ostore "github.com/v0m3/v0m3/services/orchestrator/store"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/redistest"
	"github.com/v0m3/v0m3/internal/testkit"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
)

// TestStoreOutageIsUnavailable: with the orchestrator's Redis down, a
// call that needs the store is UNAVAILABLE STORE_UNAVAILABLE with a
// RetryInfo (try again later), not INTERNAL; once Redis is back the same
// call succeeds and the task it reads is intact.
func TestStoreOutageIsUnavailable(t *testing.T) {
	t.Parallel()
	redis := redistest.StartServer(t)
	h := newHarnessOn(t, ostore.NewRedisStore(redistest.Client(t, redis.Addr), redistest.Prefix(t)))
	started := h.start(t, "source_review", false)
	task, cat := started.GetTask(), started.GetCatalogue()
	// A first submission, so the orchestrator keeps the task for its
	// access check and the next one's first store call is the lease.
	args := map[string]any{"source": handleFor(t, cat, capRetrieveAuthorizedSource, migrationGuide.GetTitle())}
	if _, err := h.submit(t, task.GetId(), "call_1", capRetrieveAuthorizedSource, args); err != nil {
		t.Fatal(err)
	}

	redis.Sync(t) // what was written before the crash must survive it
	if err := redis.Kill(); err != nil {
		t.Fatal(err)
	}
	for name, call := range map[string]func() error{
		"GetTask": func() error {
			_, err := h.client.GetTask(t.Context(), &orchestratorv1.GetTaskRequest{Id: task.GetId()})
			return err
		},
		"SubmitToolRequest": func() error {
			_, err := h.submit(t, task.GetId(), "call_2", capRetrieveAuthorizedSource, args)
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
	testkit.Eventually(t, "the task readable once Redis is back", func() bool {
		got, err := h.client.GetTask(t.Context(), &orchestratorv1.GetTaskRequest{Id: task.GetId()})
		return err == nil && got.GetId() == task.GetId()
	})
}

// blinkAfterCreate fails the first request update after a request is
// created as an unreachable store would: a store blink between recording
// a request and recording what was decided about it.
type blinkAfterCreate struct {
	ostore.Store
	blink atomic.Bool
}

func (s *blinkAfterCreate) CreateRequestEmit(ctx context.Context, r *orchestratorv1.ToolRequest, held ostore.Held, lease ostore.LeaseTake) (ostore.Creation, error) {
	c, err := s.Store.CreateRequestEmit(ctx, r, held, lease)
	if c.Created {
		s.blink.Store(true)
	}
	return c, err
}

func (s *blinkAfterCreate) UpdateRequestEmit(ctx context.Context, id string, fn func(*orchestratorv1.ToolRequest) error, held ostore.Held) (*orchestratorv1.ToolRequest, ostore.Written, error) {
	if s.blink.CompareAndSwap(true, false) {
		return nil, ostore.Written{}, fmt.Errorf("update request %s: %w", id, syscall.ECONNREFUSED)
	}
	return s.Store.UpdateRequestEmit(ctx, id, fn, held)
}

// A store blink right after a request was recorded is no refusal: the
// caller gets UNAVAILABLE STORE_UNAVAILABLE, and the request, left
// REQUESTED, is decided and executed by recovery.
func TestStoreBlinkAfterARequestIsRecordedLeavesItForRecovery(t *testing.T) {
	t.Parallel()
	h := newHarnessOn(t, &blinkAfterCreate{Store: newBoltStore(t)}, func(d *Deps) { d.RecoveryInterval = 20 * time.Millisecond })
	cat := h.start(t, "source_review", false).GetCatalogue()
	_, err := h.submit(t, cat.GetTaskId(), "call_1", capRetrieveAuthorizedSource,
		map[string]any{"source": handleFor(t, cat, capRetrieveAuthorizedSource, migrationGuide.GetTitle())})
	wantErr(t, err, codes.Unavailable, apierror.ReasonStoreUnavailable)
	id := requestOfCall(t, h, cat.GetTaskId(), "call_1").GetId()
	var r *orchestratorv1.ToolRequest
	testkit.Eventually(t, "the request settled", func() bool {
		if r, err = h.client.GetRequest(t.Context(), &orchestratorv1.GetRequestRequest{Id: id}); err != nil {
			t.Fatal(err)
		}
		return settled(r)
	})
	if r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
		t.Errorf("request after the blink = %v (%s); want EXECUTED by recovery", r.GetState(), r.GetRefusalReason())
	}
}
