package orchestrator

import (
	"context"
	ostore "github.com/v0m3/v0m3/services/orchestrator/store"
	"sync"
	"testing"
	"time"

	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
)

// leaseCalls counts a store's lease round trips of their own.
type leaseCalls struct {
	ostore.Store
	mu       sync.Mutex
	acquired []string // request ids
	released []string
}

func (l *leaseCalls) AcquireLease(ctx context.Context, requestID, owner string, gen int64, ttl time.Duration) (int64, error) {
	if gen == 0 { // renewals are the lease's background work
		l.mu.Lock()
		l.acquired = append(l.acquired, requestID)
		l.mu.Unlock()
	}
	return l.Store.AcquireLease(ctx, requestID, owner, gen, ttl)
}

func (l *leaseCalls) ReleaseLease(ctx context.Context, requestID, owner string) error {
	l.mu.Lock()
	l.released = append(l.released, requestID)
	l.mu.Unlock()
	return l.Store.ReleaseLease(ctx, requestID, owner)
}

func (l *leaseCalls) reset() (acquired, released []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	acquired, released = l.acquired, l.released
	l.acquired, l.released = nil, nil
	return acquired, released
}

// An executed call's lease costs no store round trip of its own: it is
// taken with the request's creation and, once the request is executed
// and nobody has anything left to do with it, left to expire. A request
// that awaits approval has its lease released when the call returns, so
// an approver on any replica takes it at once.
func TestLeaseRidesTheCallsWrites(t *testing.T) {
	t.Parallel()
	st := &leaseCalls{Store: newBoltStore(t)}
	h := newHarnessOn(t, st, func(d *Deps) { d.RecoveryInterval = time.Hour })
	task := h.start(t, "source_review", false).GetCatalogue()
	handle := handleFor(t, task, capRetrieveAuthorizedSource, migrationGuide.GetTitle())
	st.reset()
	r, err := h.submit(t, task.GetTaskId(), "call_1", capRetrieveAuthorizedSource, map[string]any{"source": handle})
	if err != nil || r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
		t.Fatalf("submit = %v, %v", r, err)
	}
	if acquired, released := st.reset(); len(acquired) != 0 || len(released) != 0 {
		t.Errorf("an executed call took leases of %v and released %v; want neither as a round trip of its own", acquired, released)
	}

	st = &leaseCalls{Store: newBoltStore(t)}
	ph := newPreviewHarnessOn(t, st, func(d *Deps) { d.RecoveryInterval = time.Hour })
	preview := ph.start(t, "preview", false).GetTask()
	st.reset()
	awaiting := ph.submitPreview(t, preview.GetId(), "call_p")
	if acquired, released := st.reset(); len(acquired) != 0 || len(released) != 1 || released[0] != awaiting.GetId() {
		t.Errorf("a call left awaiting approval took leases of %v and released %v; want its own released", acquired, released)
	}
	if gen, err := st.AcquireLease(t.Context(), awaiting.GetId(), "replica_other", 0, time.Hour); err != nil || gen == 0 {
		t.Errorf("another replica taking the lease of a request awaiting approval = %d, %v; want it free", gen, err)
	}
}
