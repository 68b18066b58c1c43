package tasks

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
)

var (
	allStates = []State{None, Active, Completed, Cancelled, ConnectionUnavailable}
	allEvents = []Event{Start, Complete, Reopen, Cancel, LoseConnection}
)

// TestTaskTransitions checks every (state, event) pair: the ones a task's
// life uses move it as the design says, and every other is refused with
// the task left as it was. A task that ended accepts no event but a
// completion taken back, so nothing can revive a cancelled task or one
// whose connection is gone.
func TestTaskTransitions(t *testing.T) {
	legal := map[State]map[Event]State{
		None:      {Start: Active},
		Active:    {Complete: Completed, Cancel: Cancelled, LoseConnection: ConnectionUnavailable},
		Completed: {Reopen: Active},
	}
	for _, from := range allStates {
		for _, e := range allEvents {
			task := &orchestratorv1.Task{Id: "task_1", State: from, Checkpoint: "kept"}
			before := proto.Clone(task)
			err := Move(task, e)
			want, ok := legal[from][e]
			if ok {
				if err != nil || task.GetState() != want {
					t.Errorf("Move(%s, %s) = %s, %v; want %s", Name(from), e, Name(task.GetState()), err, Name(want))
				}
				continue
			}
			if !errors.Is(err, ErrIllegal) {
				t.Errorf("Move(%s, %s) = %v; want ErrIllegal", Name(from), e, err)
			}
			if !proto.Equal(task, before) {
				t.Errorf("Move(%s, %s) refused but changed the task to %v", Name(from), e, task)
			}
		}
	}
	if n := len(Table()); n != 5 {
		t.Errorf("table has %d rows; the test knows 5", n)
	}
}

// TestTaskStateNames keeps the names callers see in TASK_NOT_ACTIVE
// metadata.
func TestTaskStateNames(t *testing.T) {
	for s, want := range map[State]string{Active: "active", Completed: "completed", Cancelled: "cancelled", ConnectionUnavailable: "connection_unavailable"} {
		if got := Name(s); got != want {
			t.Errorf("Name(%v) = %q; want %q", s, got, want)
		}
	}
}
