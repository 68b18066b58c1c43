package registry_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/v0m3/v0m3/internal/redistest"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/registry"
)

// TestRedisEventGroup checks that two replicas in one consumer group see
// each registry event exactly once between them, that another group sees
// every event, and that an event a dead replica never acknowledged can be
// claimed by a live one.
func TestRedisEventGroup(t *testing.T) {
	t.Parallel()
	addr, _ := redistest.Start(t)
	prefix := redistest.Prefix(t)
	st := registry.NewRedisStore(redistest.Client(t, addr), prefix)
	ctx := context.Background()
	if err := st.CreateConnection(ctx, &registryv1.Connection{Id: "conn_a"}, &registryv1.ConfigRevision{ConnectionId: "conn_a", Revision: 1}, &registryv1.RegistryEvent{ConnectionId: "conn_a", Detail: "created"}); err != nil {
		t.Fatal(err)
	}
	for i := range 19 {
		if err := st.UpdateConnection(ctx, "conn_a", func(u *registry.ConnectionUpdate) error {
			u.Events = []*registryv1.RegistryEvent{{ConnectionId: "conn_a", Detail: fmt.Sprint(i)}}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}

	join := func(group, consumer string) *registry.RedisEventGroup {
		g, err := registry.NewRedisEventGroup(ctx, redistest.Client(t, addr), prefix, group, consumer)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	a, b := join("orchestrator", "replica-a"), join("orchestrator", "replica-b")
	seen := map[int64]string{}
	for len(seen) < 20 {
		progressed := false
		for _, m := range []struct {
			name string
			g    *registry.RedisEventGroup
		}{{"a", a}, {"b", b}} {
			name, g := m.name, m.g
			evs, err := g.Next(ctx, 3, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, ev := range evs {
				if prev, dup := seen[ev.GetSequence()]; dup {
					t.Fatalf("event %d delivered to %s and %s", ev.GetSequence(), prev, name)
				}
				seen[ev.GetSequence()] = name
				progressed = true
				// b "dies" holding event 5 unacknowledged.
				if ev.GetSequence() != 5 || name != "b" {
					if err := g.Ack(ctx, ev.GetSequence()); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		if !progressed {
			break
		}
	}
	if len(seen) != 20 {
		t.Fatalf("the group saw %d of 20 events", len(seen))
	}
	// a reads 1-3, b 4-6, and so on: event 5 went to b.
	claimed, err := a.Claim(ctx, 0, 10)
	if err != nil || len(claimed) != 1 || claimed[0].GetSequence() != 5 {
		t.Errorf("claim of b's unacknowledged event = %v, %v", claimed, err)
	}
	other := join("policy", "replica-a")
	evs, err := other.Next(ctx, 100, time.Millisecond)
	if err != nil || len(evs) != 20 || evs[0].GetSequence() != 1 || evs[19].GetSequence() != 20 {
		t.Errorf("another group saw %d events, %v; want all 20 in order", len(evs), err)
	}
	if evs, err := a.Next(ctx, 10, 0); err != nil || len(evs) != 0 {
		t.Errorf("after the stream was consumed: %v, %v", evs, err)
	}
}
