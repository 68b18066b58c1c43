// Package tracesend delivers trace events to evidence for the services
// that write them (the orchestrator its product layer, the adapter its
// protocol layer), the events of concurrent calls in shared round trips
// (groupsend): each call still returns once evidence took its events, so
// a trace read after a call returns holds them.
package tracesend

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/groupsend"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
)

const (
	// MaxEvents bounds the events of one AppendTraces: evidence refuses
	// more (it takes its bound from here).
	MaxEvents = 256
	// MaxBytes bounds one AppendTraces message, well under the 4 MiB
	// gRPC default.
	MaxBytes = 1 << 20
)

// Sender delivers trace events; see New.
type Sender = groupsend.Sender[*evidencev1.TraceEvent]

// New returns a Sender of trace events to ev. One send carries at most
// MaxEvents events and MaxBytes bytes; a shared send evidence refuses as
// invalid is sent again one caller at a time, so only the caller whose
// event is invalid gets the refusal.
func New(ev evidencev1.EvidenceServiceClient) *Sender {
	return groupsend.New(func(ctx context.Context, evs []*evidencev1.TraceEvent) error {
		return send(ctx, ev, evs)
	}, groupsend.Options[*evidencev1.TraceEvent]{
		MaxItems: MaxEvents,
		MaxBytes: MaxBytes,
		Size:     func(e *evidencev1.TraceEvent) int { return proto.Size(e) },
		Isolate:  func(err error) bool { return status.Code(err) == codes.InvalidArgument },
	})
}

// send sends events in one call; an evidence service without
// AppendTraces (an older version during an upgrade) gets them one by one.
func send(ctx context.Context, ev evidencev1.EvidenceServiceClient, evs []*evidencev1.TraceEvent) error {
	if len(evs) == 1 {
		_, err := ev.AppendTrace(ctx, &evidencev1.AppendTraceRequest{Event: evs[0]})
		return err
	}
	_, err := ev.AppendTraces(ctx, &evidencev1.AppendTracesRequest{Events: evs})
	if status.Code(err) != codes.Unimplemented {
		return err
	}
	var errs []error
	for _, e := range evs {
		if _, err := ev.AppendTrace(ctx, &evidencev1.AppendTraceRequest{Event: e}); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
