package tasks

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
)

// errReopenRaced aborts taking back a completion the task no longer has.
var errReopenRaced = errors.New("state changed concurrently")

// Cancel cancels active task id (reason may be ""). Requests waiting for
// approval are refused with TASK_CANCELLED. Cancelling a cancelled task
// returns it; any other state is TASK_NOT_ACTIVE.
func (s *Service) Cancel(ctx context.Context, id, reason string) (*orchestratorv1.Task, error) {
	task, detail, already, err := s.end(ctx, id, Cancel, "cancelled", reason)
	if err != nil || already {
		return task, err
	}
	s.announceEnd(ctx, task, "TASK_CANCELLED", "task.cancelled", detail)
	return task, nil
}

// Complete completes task cur, as the caller read it (reason may be "").
// A completed task is returned as it is. It is refused with
// REQUESTS_IN_FLIGHT while a request of the task is being decided or
// executed; requests waiting for a person are refused with
// TASK_COMPLETED.
func (s *Service) Complete(ctx context.Context, cur *orchestratorv1.Task, reason string) (*orchestratorv1.Task, error) {
	if cur.GetState() == Completed {
		return cur, nil
	}
	id := cur.GetId()
	if err := s.requests.NoRequestInFlight(ctx, id); err != nil {
		return nil, err
	}
	task, detail, already, err := s.end(ctx, id, Complete, "completed", reason)
	if err != nil || already {
		return task, err
	}
	// A submission that read the task as active before this update and
	// recorded its request after the check above would act on a completed
	// task. A submission reads the task again after recording its request
	// (SubmitToolRequest), so it either sees the task completed or its
	// request is seen here; then the task is active again and the caller
	// told to wait.
	if err := s.requests.NoRequestInFlight(ctx, id); err != nil {
		if _, rerr := s.st.UpdateTask(ctx, id, func(t *orchestratorv1.Task) error {
			if t.GetState() != Completed {
				return errReopenRaced
			}
			if err := Move(t, Reopen); err != nil {
				return err
			}
			t.Checkpoint = strings.TrimPrefix(t.GetCheckpoint(), detail+"; ")
			t.UpdateTime = s.timestamp()
			return nil
		}); rerr != nil {
			s.log.WarnContext(ctx, "reopen a task completed under a new request", "task", id, "err", rerr)
		}
		return nil, err
	}
	s.log.InfoContext(ctx, "task completed", "task", task.GetId())
	s.announceEnd(ctx, task, "TASK_COMPLETED", "task.completed", detail)
	return task, nil
}

// end moves an active task by event ev to the terminal state it leads
// to, recording "<verb>[: reason]" (detail) in its checkpoint. already
// reports that the task was in that state (nothing changed); any other
// state is TASK_NOT_ACTIVE.
func (s *Service) end(ctx context.Context, id string, ev Event, verb, reason string) (task *orchestratorv1.Task, detail string, already bool, err error) {
	to, _ := Next(Active, ev)
	detail = verb
	if reason != "" {
		detail = verb + ": " + reason
	}
	task, err = s.st.UpdateTask(ctx, id, func(t *orchestratorv1.Task) error {
		switch t.GetState() {
		case to:
			already = true
			return nil
		case Active:
		default:
			return apierror.New(codes.FailedPrecondition, "TASK_NOT_ACTIVE",
				fmt.Sprintf("task %s is %s and cannot be %s", t.GetId(), Name(t.GetState()), verb),
				map[string]string{"task_id": t.GetId(), "state": Name(t.GetState())})
		}
		if err := Move(t, ev); err != nil {
			return err
		}
		t.Checkpoint = detail + "; " + t.GetCheckpoint()
		t.UpdateTime = s.timestamp()
		return nil
	})
	if err != nil {
		return nil, "", false, s.Err(ctx, id, err)
	}
	return task, detail, already, nil
}

// announceEnd refuses the ended task's requests still waiting (reason)
// and records the end in its trace and task events.
func (s *Service) announceEnd(ctx context.Context, task *orchestratorv1.Task, reason, event, detail string) {
	s.requests.RefusePending(ctx, task.GetId(), reason, "task "+task.GetId()+" was "+detail)
	s.report.Trace(ctx, task.GetId(), &evidencev1.ProductEvent{
		Kind: evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_TASK_STATE, Detail: "task " + detail,
	})
	s.report.Emit(ctx, task.GetId(), "", event, detail)
}

// StopStart stops a task that could not be given a catalogue: it cannot
// do anything, so it is ended visibly rather than left active with
// nothing offered. When even that write fails, a retry of its request id
// ends it later (see the replay of a start).
func (s *Service) StopStart(ctx context.Context, task *orchestratorv1.Task, detail string) {
	if _, err := s.setState(ctx, task.GetId(), Cancel, detail); err != nil {
		s.log.WarnContext(ctx, "stop a task whose start failed", "task", task.GetId(), "err", err)
		return
	}
	s.TellStartStopped(ctx, task.GetId(), detail)
}

// TellStartStopped traces and emits that task id, whose start failed,
// was stopped.
func (s *Service) TellStartStopped(ctx context.Context, id, detail string) {
	s.report.Trace(ctx, id, &evidencev1.ProductEvent{
		Kind: evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_TASK_STATE, Detail: "task stopped: " + detail,
	})
	s.report.Emit(ctx, id, "", "task.cancelled", detail)
}

// setState moves task id by event ev and replaces its checkpoint.
func (s *Service) setState(ctx context.Context, id string, ev Event, checkpoint string) (*orchestratorv1.Task, error) {
	return s.st.UpdateTask(ctx, id, func(t *orchestratorv1.Task) error {
		if err := Move(t, ev); err != nil {
			return err
		}
		t.Checkpoint = checkpoint
		t.UpdateTime = s.timestamp()
		return nil
	})
}
