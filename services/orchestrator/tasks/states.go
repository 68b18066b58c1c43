// Package tasks is the life of a task in the orchestrator: its states,
// the events that move it, and one transition table that says, for each
// state and event, the next state (this file). Every path that changes a
// task's state (starting it, completing or cancelling it, stopping a
// start that failed or was abandoned, losing its connection) does so
// through Move, so an illegal transition is refused here, in one place.
// The table holds no I/O and no clock.
//
// Service does the rest of a task's life over the store: the idempotent
// start and its replay (start.go), compiling and offering the catalogue
// (catalogue.go), ending a task (end.go, connection.go) and loading it.
// What only the request side can do (refusing waiting requests, telling
// whether one is in flight) comes in through the Requests interface.
package tasks

import (
	"errors"
	"fmt"
	"strings"

	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
)

// State is a task state, recorded on the task.
type State = orchestratorv1.TaskState

// Task states.
const (
	// None is a task not yet recorded.
	None                  = orchestratorv1.TaskState_TASK_STATE_UNSPECIFIED
	Active                = orchestratorv1.TaskState_TASK_STATE_ACTIVE
	Completed             = orchestratorv1.TaskState_TASK_STATE_COMPLETED
	Cancelled             = orchestratorv1.TaskState_TASK_STATE_CANCELLED
	ConnectionUnavailable = orchestratorv1.TaskState_TASK_STATE_CONNECTION_UNAVAILABLE
)

// Event is what happens to a task.
type Event int

// Events.
const (
	// Start records a new task, active.
	Start Event = iota + 1
	// Complete ends an active task as done (CompleteTask).
	Complete
	// Reopen takes back a completion that raced with a request recorded
	// meanwhile: the task is active again and the caller told to wait.
	Reopen
	// Cancel ends an active task: a caller cancelled it, or its start
	// could not give it a catalogue (failed or abandoned).
	Cancel
	// LoseConnection stops an active task whose offered catalogue uses a
	// connection that was retired.
	LoseConnection
)

var eventNames = map[Event]string{
	Start: "start", Complete: "complete", Reopen: "reopen", Cancel: "cancel", LoseConnection: "lose_connection",
}

// String is the event's name in errors.
func (e Event) String() string {
	if n, ok := eventNames[e]; ok {
		return n
	}
	return fmt.Sprintf("event(%d)", int(e))
}

// Transition is one row of the table.
type Transition struct {
	From  State
	Event Event
	To    State
}

// table is the task lifecycle: every legal (state, event) pair. Anything
// not listed is refused. Only an active task accepts requests; a task
// that ended stays as it is, except a completion taken back (Reopen).
var table = []Transition{
	{From: None, Event: Start, To: Active},
	{From: Active, Event: Complete, To: Completed},
	{From: Completed, Event: Reopen, To: Active},
	{From: Active, Event: Cancel, To: Cancelled},
	{From: Active, Event: LoseConnection, To: ConnectionUnavailable},
}

// index is table by (state, event), built once.
var index = func() map[State]map[Event]State {
	m := map[State]map[Event]State{}
	for _, t := range table {
		if m[t.From] == nil {
			m[t.From] = map[Event]State{}
		}
		if _, dup := m[t.From][t.Event]; dup {
			panic(fmt.Sprintf("tasks: (%s, %s) listed twice", Name(t.From), t.Event))
		}
		m[t.From][t.Event] = t.To
	}
	return m
}()

// Table returns a copy of the transition table, for documentation and
// tests.
func Table() []Transition { return append([]Transition(nil), table...) }

// ErrIllegal is wrapped by Move's error when the table has no row for
// the task's state and the event.
var ErrIllegal = errors.New("illegal task transition")

// Next is the state event moves a task in state from to; ok is false
// when the table has no such row.
func Next(from State, e Event) (to State, ok bool) {
	to, ok = index[from][e]
	return to, ok
}

// Move applies event e to t, setting its state, or refuses it with an
// error wrapping ErrIllegal and leaves t as it was.
func Move(t *orchestratorv1.Task, e Event) error {
	to, ok := Next(t.GetState(), e)
	if !ok {
		return fmt.Errorf("%w: task %s is %s and cannot %s", ErrIllegal, t.GetId(), Name(t.GetState()), e)
	}
	t.State = to
	return nil
}

// Name is a task state's name in messages and error metadata, e.g.
// "connection_unavailable".
func Name(s State) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "TASK_STATE_"))
}
