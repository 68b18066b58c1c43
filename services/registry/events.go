package registry

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/v0m3/v0m3/internal/authz"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

const (
	// eventPageSize bounds how many events one store read returns.
	eventPageSize = 256
	// eventPollInterval is how often a watcher rereads the store when no
	// in-process notification arrived: changes committed by another
	// process sharing the store (e.g. Redis) have no local notification.
	eventPollInterval = 2 * time.Second
)

// WatchEvents sends every event with a sequence greater than
// after_sequence, in order, then follows new events until the client
// cancels.
func (s *Server) WatchEvents(req *registryv1.WatchEventsRequest, stream grpc.ServerStreamingServer[registryv1.RegistryEvent]) error {
	ctx := stream.Context()
	// Events name connections, mappings and snapshots and what changed in
	// them: the same reconnaissance as reading the connections.
	if err := s.requireRead(ctx, authz.ConnectionRead, "connection", ""); err != nil {
		return err
	}
	after := max(req.GetAfterSequence(), 0)
	for {
		// Take the wake-up channel before reading, so a change committed
		// between the read and the wait is not missed.
		wake := s.changes()
		events, err := s.st.ListEvents(ctx, after, eventPageSize)
		if err != nil {
			if ctx.Err() != nil {
				return status.FromContextError(ctx.Err()).Err()
			}
			return s.storeError(ctx, err, "list events", nil)
		}
		for _, ev := range events {
			if err := stream.Send(ev); err != nil {
				return err
			}
			after = ev.GetSequence()
		}
		if len(events) == eventPageSize {
			continue
		}
		timer := time.NewTimer(eventPollInterval)
		select {
		case <-ctx.Done():
			timer.Stop()
			return status.FromContextError(ctx.Err()).Err()
		case <-wake:
		case <-timer.C:
		}
		timer.Stop()
	}
}
