package orchestrator

import (
	"context"
	"errors"
	"io"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// Registry watch backoff bounds.
const (
	watchBackoffMin = 500 * time.Millisecond
	watchBackoffMax = 30 * time.Second
)

// MarkConnectionUnavailable stops every active task whose offered catalogue
// uses the connection: the task becomes CONNECTION_UNAVAILABLE with a
// checkpoint naming its last committed request, and requests waiting for
// approval are refused. Every record stays readable.
func (s *Server) MarkConnectionUnavailable(ctx context.Context, connectionID string) error {
	return s.tasks.MarkConnectionUnavailable(ctx, connectionID)
}

// watchRegistry follows registry events and stops tasks whose connection
// was retired. The registry may be down or restarting: the watch resumes
// after the last event seen, with capped exponential backoff, until Close.
func (s *Server) watchRegistry(ctx context.Context) {
	var after int64
	backoff := watchBackoffMin
	for {
		progressed, err := s.followRegistry(ctx, &after)
		if ctx.Err() != nil {
			return
		}
		if progressed {
			backoff = watchBackoffMin
		}
		logf := s.log.WarnContext
		if c := status.Code(err); errors.Is(err, io.EOF) || c == codes.Unavailable || c == codes.Unimplemented || c == codes.Canceled {
			logf = s.log.DebugContext // expected while the registry starts or restarts
		}
		logf(ctx, "registry event watch ended", "after", after, "retry_in", backoff, "err", err)
		if !sleep(ctx, backoff) {
			return
		}
		backoff = min(backoff*2, watchBackoffMax)
	}
}

// followRegistry reads one event stream until it ends. It reports whether
// any event arrived.
func (s *Server) followRegistry(ctx context.Context, after *int64) (bool, error) {
	stream, err := s.deps.Registry.WatchEvents(ctx, &registryv1.WatchEventsRequest{AfterSequence: *after})
	if err != nil {
		return false, err
	}
	progressed := false
	for {
		ev, err := stream.Recv()
		if err != nil {
			return progressed, err
		}
		progressed = true
		*after = ev.GetSequence()
		if ev.GetType() == registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_CONNECTION_RETIRED {
			if err := s.MarkConnectionUnavailable(ctx, ev.GetConnectionId()); err != nil {
				s.log.ErrorContext(ctx, "mark connection unavailable", "connection", ev.GetConnectionId(), "err", err)
			}
		}
	}
}

// sleep waits for d, or until ctx ends; it reports whether the full wait
// elapsed. The background loops (registry watch, recovery) back off with it.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
