package orchestrator

import (
	"context"

	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
)

// taskSide is what package tasks needs back from the server: the request
// side (refusing waiting requests, checking none is in flight) and the
// task's trace and events. It keeps those methods off the server's
// exported API.
type taskSide struct{ s *Server }

// RefusePending implements tasks.Requests.
func (t taskSide) RefusePending(ctx context.Context, taskID, reason, detail string) {
	t.s.refusePending(ctx, taskID, reason, detail)
}

// NoRequestInFlight implements tasks.Requests.
func (t taskSide) NoRequestInFlight(ctx context.Context, taskID string) error {
	return t.s.noRequestInFlight(ctx, taskID)
}

// Trace implements tasks.Reporter.
func (t taskSide) Trace(ctx context.Context, taskID string, ev *evidencev1.ProductEvent) {
	t.s.trace(ctx, taskID, ev)
}

// Emit implements tasks.Reporter.
func (t taskSide) Emit(ctx context.Context, taskID, requestID, typ, detail string) {
	t.s.emit(ctx, taskID, requestID, typ, detail)
}
