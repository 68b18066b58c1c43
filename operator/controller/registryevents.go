package controller

import (
	"context"
	"errors"
	"io"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"

	v1alpha1 "github.com/v0m3/v0m3/operator/api/v1alpha1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// connectionIndex indexes MCPServers by the registry connection they
// registered (status.connectionID).
const connectionIndex = "status.connectionID"

// registryWatch follows the registry's event stream and wakes the
// MCPServer whose connection an event concerns, so Discovered and
// ReviewRequired follow the registry within moments (a snapshot recorded,
// a mapping sent to review, a review decided) instead of at the next
// resync. The registry cannot call the operator; the operator listens.
type registryWatch struct {
	client   client.Client
	registry registryv1.RegistryServiceClient
	events   chan event.TypedGenericEvent[*v1alpha1.MCPServer]
}

// watchBackoff bounds how long the watch waits before reconnecting after
// the stream breaks; the resync still catches up meanwhile.
const (
	watchBackoffMin = time.Second
	watchBackoffMax = 30 * time.Second
)

// Start implements manager.Runnable: it follows the stream until ctx ends,
// reconnecting from the last sequence it saw.
func (w *registryWatch) Start(ctx context.Context) error {
	logger := log.FromContext(ctx).WithName("registry-watch")
	var after int64
	backoff := watchBackoffMin
	for {
		seen, err := w.follow(ctx, &after)
		if ctx.Err() != nil {
			return nil
		}
		if seen {
			backoff = watchBackoffMin
		}
		logger.V(1).Info("registry event stream ended; reconnecting", "after", after, "error", err, "in", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, watchBackoffMax)
	}
}

// follow reads one stream until it breaks, advancing *after. seen says
// whether any event arrived.
func (w *registryWatch) follow(ctx context.Context, after *int64) (seen bool, err error) {
	stream, err := w.registry.WatchEvents(ctx, &registryv1.WatchEventsRequest{AfterSequence: *after})
	if err != nil {
		return false, err
	}
	for {
		ev, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return seen, nil
		}
		if err != nil {
			return seen, err
		}
		seen = true
		*after = max(*after, ev.GetSequence())
		if id := ev.GetConnectionId(); id != "" {
			w.wake(ctx, id)
		}
	}
}

// wake enqueues the MCPServers registered as connection id; a connection
// no MCPServer registered (made through the API) wakes nothing.
func (w *registryWatch) wake(ctx context.Context, id string) {
	var list v1alpha1.MCPServerList
	if err := w.client.List(ctx, &list, client.MatchingFields{connectionIndex: id}); err != nil {
		log.FromContext(ctx).Error(err, "list MCPServers by connection", "connection", id)
		return
	}
	for i := range list.Items {
		select {
		case w.events <- event.TypedGenericEvent[*v1alpha1.MCPServer]{Object: &list.Items[i]}:
		case <-ctx.Done():
			return
		}
	}
}
