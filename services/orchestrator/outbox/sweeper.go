// Package outbox is how the orchestrator's trace events wait for
// evidence: the names of the outbox's delivery claim, and the sweeper
// that deletes the entries calls delivered themselves, off the calls'
// path. The outbox's storage is the store's (store.TraceOutbox); its
// delivery in order is the server's recovery loop.
package outbox

import (
	"context"
	"sync"
	"time"

	ostore "github.com/v0m3/v0m3/services/orchestrator/store"
)

// Sweeper deletes the outbox entries calls delivered themselves, off the
// calls' path. A call hands its delivered entries over and returns; the
// next write this replica makes anyway (a request's next stage, another
// call's creation) deletes them in its own transaction (Take, Settle),
// and what no write took within a moment (pause), or at once when a
// batch is queued, is deleted in one store write for all of it (run).
// So deleting costs calls no store write of their own, whether they come
// together or one at a time (each made two), and the outbox stays as
// small as before.
// The entries stay this replica's (direct) until deleted, so no outbox
// loop sends them again: this replica's skips them as delivered (Holds),
// and other replicas' leave them while the claim lasts, which the pause
// is well inside. A delete that fails or never runs (the process
// stopped) leaves them to be delivered again, under the same delivery
// ids, which evidence stores once: delivery stays at least once.
type Sweeper struct {
	// Pause is how long delivered entries wait for a write to take their
	// deletes before a sweep deletes them (tests shorten or lengthen it
	// before use).
	Pause time.Duration
	// del deletes delivered entries from the outbox; undirect hands
	// entries back to the outbox loop.
	del      func(ctx context.Context, entries []ostore.OutboxEntry) error
	undirect func(entries []ostore.OutboxEntry)
	full     chan struct{} // a batch is queued: sweep without waiting
	closing  chan struct{} // closed by close: a sweep waits no more

	mu      sync.Mutex
	queued  []ostore.OutboxEntry // handed over, not taken by a write or a sweep
	held    map[string]struct{}  // keys handed over and not yet deleted
	running bool
	closed  bool
	done    sync.WaitGroup
}

// Lease names the claim on delivering the outbox, so among replicas on
// one store one delivers at a time, in order.
const Lease = "trace-outbox"

// Page bounds the entries read per delivery step.
const Page = 256

// Bounds of the sweeper.
const (
	// sweepTimeout bounds one delete of delivered entries.
	sweepTimeout = 10 * time.Second
	// sweepPause is how long delivered entries wait for a write to take
	// their deletes before a sweep deletes them.
	sweepPause = 20 * time.Millisecond
	// sweepBatch bounds the deletes one write carries, and is how many
	// queued entries are worth a sweep at once.
	sweepBatch = 64
)

// NewSweeper returns a sweeper that deletes with del and hands entries
// back with undirect; claim is how long other replicas leave a call's
// delivered entries alone.
func NewSweeper(claim time.Duration, del func(ctx context.Context, entries []ostore.OutboxEntry) error, undirect func(entries []ostore.OutboxEntry)) *Sweeper {
	return &Sweeper{Pause: min(sweepPause, claim/4), del: del, undirect: undirect, full: make(chan struct{}, 1), closing: make(chan struct{}),
		held: map[string]struct{}{}}
}

// Add hands delivered entries over for deletion.
func (w *Sweeper) Add(entries []ostore.OutboxEntry) {
	if len(entries) == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		// Shutting down: the entries are delivered again after restart.
		w.undirect(entries)
		return
	}
	for _, e := range entries {
		w.held[e.Key] = struct{}{}
	}
	w.queue(entries)
}

// queue queues entries for deletion and makes sure a sweep follows.
// Called with mu held.
func (w *Sweeper) queue(entries []ostore.OutboxEntry) {
	w.queued = append(w.queued, entries...)
	if len(w.queued) >= sweepBatch {
		select {
		case w.full <- struct{}{}:
		default:
		}
	}
	if w.running {
		return
	}
	w.running = true
	w.done.Add(1)
	go w.run()
}

// Take gives a write the deletes to carry: up to sweepBatch queued
// entries, which the write's caller settles.
func (w *Sweeper) Take() []ostore.OutboxEntry {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := min(len(w.queued), sweepBatch)
	if n == 0 {
		return nil
	}
	taken := w.queued[:n:n]
	w.queued = w.queued[n:]
	return taken
}

// Settle ends the deletes a write carried: done when it committed, else
// they are queued again.
func (w *Sweeper) Settle(taken []ostore.OutboxEntry, deleted bool) {
	if len(taken) == 0 {
		return
	}
	w.mu.Lock()
	if !deleted && !w.closed {
		w.queue(taken)
		w.mu.Unlock()
		return
	}
	w.mu.Unlock()
	// Deleted, or closing: the entries are delivered again after restart.
	w.forget(taken)
}

// forget drops entries whose delete ran (or failed, and are left to the
// outbox loop).
func (w *Sweeper) forget(entries []ostore.OutboxEntry) {
	w.mu.Lock()
	for _, e := range entries {
		delete(w.held, e.Key)
	}
	w.mu.Unlock()
	w.undirect(entries)
}

// Holds reports whether the entry of key was delivered and awaits its
// delete.
func (w *Sweeper) Holds(key string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.held[key]
	return ok
}

// run deletes what no write took, a moment after it was queued, until
// nothing is queued.
func (w *Sweeper) run() {
	defer w.done.Done()
	t := time.NewTimer(w.Pause)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-w.full:
		case <-w.closing:
		}
		w.mu.Lock()
		batch := w.queued
		w.queued = nil
		if len(batch) == 0 {
			w.running = false
			w.mu.Unlock()
			return
		}
		w.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), sweepTimeout)
		_ = w.del(ctx, batch)
		cancel()
		w.forget(batch)
		t.Reset(w.Pause)
	}
}

// Close waits for the deletes under way; later entries are left in the
// outbox.
func (w *Sweeper) Close() {
	w.mu.Lock()
	if !w.closed {
		w.closed = true
		close(w.closing)
	}
	w.mu.Unlock()
	w.done.Wait()
}
