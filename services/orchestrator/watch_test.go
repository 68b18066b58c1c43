package orchestrator

import (
	"context"
	ostore "github.com/v0m3/v0m3/services/orchestrator/store"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/v0m3/v0m3/internal/redistest"
	"github.com/v0m3/v0m3/internal/testkit"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
)

// eventSink is the server side of a WatchTask stream, delivering what is
// sent to a channel.
type eventSink struct {
	grpc.ServerStream
	ctx context.Context
	got chan *orchestratorv1.TaskEvent
}

func (s *eventSink) Context() context.Context { return s.ctx }

func (s *eventSink) Send(e *orchestratorv1.TaskEvent) error {
	select {
	case s.got <- e:
		return nil
	case <-s.ctx.Done():
		return s.ctx.Err()
	}
}

// A WatchTask stream on replica B is woken by the events replica A stores
// in the shared Redis, with B's poll set far beyond the test: only the
// store's signal can deliver them.
func TestWatchTaskWokenByAnotherReplicasEvents(t *testing.T) {
	t.Parallel()
	addr, _ := redistest.Start(t)
	prefix := redistest.Prefix(t)
	a := ostore.NewRedisStore(redistest.Client(t, addr), prefix)
	b := NewServer(ostore.NewRedisStore(redistest.Client(t, addr), prefix), Deps{}, nil)
	b.watchPoll = time.Hour
	t.Cleanup(b.Close)

	ctx, cancel := context.WithTimeout(testkit.AsUser(t.Context(), "alice"), time.Minute)
	defer cancel()
	task := &orchestratorv1.Task{Id: "task_1", Requester: &policyv1.Principal{Id: "alice"}, State: orchestratorv1.TaskState_TASK_STATE_ACTIVE}
	if err := a.CreateTask(ctx, task); err != nil {
		t.Fatal(err)
	}
	if _, err := a.AppendEvent(ctx, &orchestratorv1.TaskEvent{TaskId: "task_1", Type: "task.started"}); err != nil {
		t.Fatal(err)
	}
	sink := &eventSink{ctx: ctx, got: make(chan *orchestratorv1.TaskEvent, 64)}
	done := make(chan error, 1)
	go func() { done <- b.WatchTask(&orchestratorv1.WatchTaskRequest{TaskId: "task_1"}, sink) }()
	next := func(what string, append func()) *orchestratorv1.TaskEvent {
		t.Helper()
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case e := <-sink.got:
				return e
			case <-tick.C:
				if append != nil {
					append()
				}
			case err := <-done:
				t.Fatalf("%s: the stream ended: %v", what, err)
			case <-ctx.Done():
				t.Fatalf("%s: not delivered within the deadline", what)
			}
		}
	}
	if e := next("the replayed event", nil); e.GetType() != "task.started" || e.GetSequence() != 1 {
		t.Fatalf("replayed %v", e)
	}
	// B follows the shared store from its start, which may still be under
	// way: A keeps storing events until one wakes the stream.
	appended := 0
	add := func() {
		if _, err := a.AppendEvent(ctx, &orchestratorv1.TaskEvent{TaskId: "task_1", Type: "request.received"}); err != nil {
			t.Error(err)
		}
		appended++
	}
	add()
	for seq := int64(2); ; seq++ {
		e := next("an event stored by A", add)
		if e.GetSequence() != seq || e.GetType() != "request.received" {
			t.Fatalf("delivered %v, want sequence %d", e, seq)
		}
		if int(seq-1) == appended {
			break
		}
	}
	// Once following, one more event is delivered without a retry.
	add()
	if e := next("a further event", nil); e.GetSequence() != int64(appended+1) {
		t.Errorf("delivered %v, want sequence %d", e, appended+1)
	}
}
