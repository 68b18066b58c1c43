package store

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	kv "github.com/v0m3/v0m3/internal/store"
)

// The embedded store forgets leases that expired (an executed request's
// is left to expire) and, after boltGenerationKeep (shortened here), their
// generations, so memory does not grow with every call; a write under a
// forgotten generation is fenced, and a new lease still gets a newer one.
func TestBoltStoreForgetsEndedLeases(t *testing.T) {
	t.Parallel()
	b := newBoltStore(t).(*boltStore)
	b.genKeep = 20 * time.Millisecond
	ctx := t.Context()
	old, err := b.AcquireLease(ctx, "req_done", "replica_a", 0, time.Millisecond)
	if err != nil || old == 0 {
		t.Fatalf("AcquireLease = %d, %v", old, err)
	}
	if err := b.fence(Fence{RequestID: "req_done", Generation: old}); err != nil {
		t.Fatalf("a write under a kept generation: %v", err)
	}
	time.Sleep(50 * time.Millisecond) // past its ttl and the keep
	gen, err := b.AcquireLease(ctx, "req_next", "replica_a", 0, time.Hour)
	if err != nil || gen <= old {
		t.Fatalf("AcquireLease = %d, %v; want a generation newer than %d", gen, err, old)
	}
	b.leaseMu.Lock()
	_, leased := b.leases["req_done"]
	_, live := b.leases["req_next"]
	_, kept := b.gens["req_done"]
	gens := len(b.gens)
	b.leaseMu.Unlock()
	if leased {
		t.Error("an expired lease is still held in memory after a sweep")
	}
	if !live {
		t.Error("a live lease was forgotten")
	}
	if kept || gens != 1 {
		t.Errorf("generations kept: %d (req_done kept: %t); want only req_next's", gens, kept)
	}
	if err := b.fence(Fence{RequestID: "req_done", Generation: old}); !errors.Is(err, ErrFenced) {
		t.Errorf("a write under a forgotten generation: %v, want ErrFenced", err)
	}
}

// newBoltStore returns a Store on a new bbolt file, closed when the test
// ends.
func newBoltStore(t *testing.T) Store {
	t.Helper()
	db, err := kv.Open(filepath.Join(t.TempDir(), "orchestrator.db"))
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return NewBoltStore(db)
}
