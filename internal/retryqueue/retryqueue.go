// Package retryqueue hands records a service writes to another service
// (audit records, protocol trace events, both to evidence) so that an
// outage of the receiver delays them instead of losing them. A record is
// sent at once; one the receiver cannot take now (it is unavailable,
// slow, or its store is full) waits in a queue, in order, and is sent
// again until it is taken, and records written meanwhile queue behind it
// without waiting, so they stay in order and the writer is not held up.
// The queue in memory is bounded. Given a Spool, what waits is also kept
// in the service's own store, so that a crash or a stop during the
// receiver's outage delays it instead of losing it (see Queue.Recover),
// and a record that does not fit in memory waits in the store alone,
// to be read back once the queue in memory empties (after what queued
// meanwhile: past the bound, order holds among those records only). Without a Spool, a record that does
// not fit, or still waits when the service stops, is logged as lost.
// Records must be safe to send twice (the receiver stores them once by an
// id they carry), since a send that timed out may have been taken, and a
// spooled record may be sent by two replicas.
package retryqueue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/ids"
)

// Defaults of Options.
const (
	// DefaultMax bounds the records waiting.
	DefaultMax = 10000
	// DefaultSendWait bounds one send: a writer waits for its record at
	// most this long, then the record queues.
	DefaultSendWait = 5 * time.Second
	// DefaultFirstRetry and DefaultMaxRetry bound the waits between
	// sending queued records again (doubling from the first).
	DefaultFirstRetry = time.Second
	DefaultMaxRetry   = 30 * time.Second
)

// Options configure a Queue. Send is required; zero durations and Max
// take the defaults.
type Options[T any] struct {
	// What names a record in log lines, e.g. "audit record".
	What string
	// Send delivers one record.
	Send func(ctx context.Context, rec T) error
	// Describe gives a record's log attributes (never secret values).
	Describe func(rec T) []any
	// Max bounds the records waiting.
	Max int
	// SendWait bounds one send.
	SendWait time.Duration
	// FirstRetry and MaxRetry bound the waits between tries.
	FirstRetry, MaxRetry time.Duration
	// Spool, when set, keeps waiting records in the service's store;
	// Encode and Decode turn a record into bytes and back (both required
	// with a Spool).
	Spool  Spool
	Encode func(rec T) ([]byte, error)
	Decode func(b []byte) (T, error)
	// Waiting, when set, is kept at the number of records waiting in
	// memory; Lost, when set, counts the records dropped (metrics).
	Waiting Gauge
	Lost    Counter
}

// Gauge is set to a value (a prometheus.Gauge is one).
type Gauge interface{ Set(float64) }

// Counter is added to (a prometheus.Counter is one).
type Counter interface{ Add(float64) }

type nopMetric struct{}

func (nopMetric) Set(float64) {}
func (nopMetric) Add(float64) {}

// Spool is where waiting records are kept across a restart: a bucket or
// key of the sending service's own store, shared by its replicas. Keys
// sort in the order the records were queued.
type Spool interface {
	// Put stores rec under key.
	Put(ctx context.Context, key string, rec []byte) error
	// Delete removes key; an absent key is not an error.
	Delete(ctx context.Context, key string) error
	// List returns every record kept, in key order.
	List(ctx context.Context) ([]Spooled, error)
}

// Spooled is one record a Spool keeps.
type Spooled struct {
	Key string
	Rec []byte
}

// waiting is a record with its spool key ("" when not spooled); alone
// marks one kept in the store only (memory full, or the queue closed).
type waiting[T any] struct {
	key   string
	rec   T
	alone bool
}

// Queue sends records, keeping those the receiver could not take; see the
// package comment.
type Queue[T any] struct {
	opt Options[T]
	log *slog.Logger

	// recovering holds one token: Recover runs one at a time (the
	// service's rescans, the drain reading back what overflowed), and a
	// caller waiting for it gives up with its context or Close.
	recovering chan struct{}

	mu sync.Mutex
	// queued records wait, oldest first; a goroutine sends them while it
	// is not empty.
	queued []waiting[T]
	// spooled holds the spool keys of queued records (recovered ones
	// included), so a recovery does not queue one twice.
	spooled map[string]bool
	// unkept holds the keys of queued records the store did not take:
	// they are in memory only.
	unkept map[string]bool
	// sentDuringRecover holds the keys sent while a Recover reads the
	// spool, which may still list them: it must not queue them again.
	sentDuringRecover map[string]bool
	// overflow: a record waits in the store alone (memory was full); the
	// queue reads the store again once it empties. overflows counts the
	// records sent to the store alone, overflowing those whose store
	// write is still in flight: a Recover that overlapped either keeps
	// overflow set.
	overflow    bool
	overflows   uint64
	overflowing int
	// putting counts store writes in flight; counted is set once Close
	// has counted what it could not send.
	putting int
	counted bool
	// undecodable holds the keys of kept records this version cannot
	// read, logged once and left in the store.
	undecodable map[string]bool
	// lastKey is the time part of the last spool key, which keeps keys
	// increasing when the wall clock steps back.
	lastKey int64
	// lost counts records dropped since the last one logged as lost.
	lost int
	// closed: the service is stopping; nothing more is queued. done ends
	// the drain goroutine's waits; draining is closed when it returns.
	closed   bool
	done     chan struct{}
	draining chan struct{}
}

// New returns a queue sending with opt.Send.
func New[T any](log *slog.Logger, opt Options[T]) *Queue[T] {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if opt.Max <= 0 {
		opt.Max = DefaultMax
	}
	if opt.SendWait <= 0 {
		opt.SendWait = DefaultSendWait
	}
	if opt.FirstRetry <= 0 {
		opt.FirstRetry = DefaultFirstRetry
	}
	if opt.MaxRetry <= 0 {
		opt.MaxRetry = DefaultMaxRetry
	}
	if opt.Describe == nil {
		opt.Describe = func(T) []any { return nil }
	}
	if opt.Waiting == nil {
		opt.Waiting = nopMetric{}
	}
	if opt.Lost == nil {
		opt.Lost = nopMetric{}
	}
	if opt.Spool != nil && (opt.Encode == nil || opt.Decode == nil) {
		panic("retryqueue: a Spool needs Encode and Decode")
	}
	q := &Queue[T]{opt: opt, log: log, done: make(chan struct{}), recovering: make(chan struct{}, 1)}
	q.recovering <- struct{}{}
	return q
}

// SetFirstRetry changes the first wait between tries (for tests); call it
// before the first Send.
func (q *Queue[T]) SetFirstRetry(d time.Duration) { q.opt.FirstRetry = d }

// Send sends rec, waiting at most SendWait, and not at all while records
// are queued: it queues behind them, keeping them in order (with a Spool,
// it waits for the store to keep the record, at most SendWait). A record
// the receiver refuses for what it is (invalid, not allowed) is logged
// and dropped: sending it again would not change the answer.
func (q *Queue[T]) Send(ctx context.Context, rec T) {
	q.mu.Lock()
	if len(q.queued) > 0 || q.overflow {
		w, keep := q.enqueue(ctx, rec)
		q.mu.Unlock()
		q.spool(ctx, w, keep)
		return
	}
	q.mu.Unlock()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), q.opt.SendWait)
	defer cancel()
	err := q.opt.Send(sctx, rec)
	if err == nil {
		return
	}
	if !retryable(err) {
		q.log.ErrorContext(ctx, q.opt.What+" refused, not sent", append(q.opt.Describe(rec), "err", err)...)
		return
	}
	q.mu.Lock()
	if len(q.queued) == 0 {
		q.log.WarnContext(ctx, q.opt.What+"s wait for their receiver; sent once it is back", append(q.opt.Describe(rec), "err", err)...)
	}
	w, keep := q.enqueue(ctx, rec)
	q.mu.Unlock()
	q.spool(ctx, w, keep)
}

// spool keeps a record in the Spool: one just queued, one that waits in
// the store alone, or one left for the next start. It runs outside the
// lock (a slow store must not hold other writers up), after the record is
// queued, so the record may already be sent and its key deleted: then the
// spool keeps a copy the next recovery sends again, which the receiver
// stores once. A queued record the store does not take waits in memory
// only, and is lost if the service stops before it is sent.
func (q *Queue[T]) spool(ctx context.Context, w waiting[T], keep bool) {
	if !keep || w.key == "" {
		return
	}
	b, err := q.opt.Encode(w.rec)
	if err == nil {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), q.opt.SendWait)
		err = q.opt.Spool.Put(sctx, w.key, b)
		cancel()
	}
	q.mu.Lock()
	q.putting--
	if w.alone && !q.closed {
		q.overflowing--
	}
	// In memory still: queued, not yet sent (Close does not forget it).
	inMemory := !w.alone && q.spooled[w.key]
	// A record that went to the store alone while the queue emptied is
	// read back now, not at the next rescan.
	readBack := w.alone && err == nil && !q.closed && len(q.queued) == 0
	lostNow := err != nil && (w.alone || (inMemory && q.counted))
	if err != nil && inMemory && !q.counted {
		if q.unkept == nil {
			q.unkept = map[string]bool{}
		}
		q.unkept[w.key] = true
	}
	q.mu.Unlock()
	switch {
	case readBack:
		go q.readBack()
	case lostNow:
		q.log.ErrorContext(ctx, q.opt.What+" lost: the store did not keep it", append(q.opt.Describe(w.rec), "err", err)...)
		q.opt.Lost.Add(1)
	case err != nil && inMemory:
		q.log.WarnContext(ctx, q.opt.What+" not kept in the store while it waits: a crash before it is sent loses it", append(q.opt.Describe(w.rec), "err", err)...)
	}
}

// readBack recovers what waits in the store alone, bounded by SendWait
// and by Close.
func (q *Queue[T]) readBack() {
	ctx, cancel := context.WithTimeout(context.Background(), q.opt.SendWait)
	defer cancel()
	go func() {
		select {
		case <-q.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	if err := q.Recover(ctx); err != nil && !errors.Is(err, context.Canceled) {
		q.log.Warn(q.opt.What+"s kept in the store not read back yet; read at the next rescan", "err", err)
	}
}

// unspool deletes a sent record's key from the Spool; a key left behind
// is sent again after a restart, which the receiver stores once.
func (q *Queue[T]) unspool(key string) {
	if key == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), q.opt.SendWait)
	defer cancel()
	if err := q.opt.Spool.Delete(ctx, key); err != nil {
		q.log.Debug(q.opt.What+" sent, still in the store: sent again after a restart", "key", key, "err", err)
	}
	q.mu.Lock()
	delete(q.spooled, key)
	delete(q.unkept, key)
	if q.sentDuringRecover != nil {
		q.sentDuringRecover[key] = true
	}
	q.mu.Unlock()
}

// Recover queues the records the Spool keeps that this queue does not
// hold (left by a crash or a stop of this service or another replica
// while the receiver was out, or kept in the store alone while memory
// was full), oldest first, behind what is queued now, as many as fit,
// and sends them like any other. The service calls it when it starts and
// from time to time; with no Spool it does nothing.
func (q *Queue[T]) Recover(ctx context.Context) error {
	if q.opt.Spool == nil {
		return nil
	}
	select {
	case <-q.recovering:
		defer func() { q.recovering <- struct{}{} }()
	case <-ctx.Done():
		return fmt.Errorf("retryqueue: read the %ss kept in the store: %w", q.opt.What, ctx.Err())
	case <-q.done:
		return nil // they stay for the next start
	}
	q.mu.Lock()
	q.sentDuringRecover = map[string]bool{}
	overflows := q.overflows
	q.mu.Unlock()
	kept, err := q.opt.Spool.List(ctx)
	q.mu.Lock()
	defer q.mu.Unlock()
	sent := q.sentDuringRecover
	q.sentDuringRecover = nil
	if err != nil {
		return fmt.Errorf("retryqueue: read the %ss kept in the store: %w", q.opt.What, err)
	}
	if q.closed {
		return nil // they stay for the next start
	}
	n := 0
	// What overflowed while the store was read, or is still being
	// written, may not be in kept: read again then.
	q.overflow = q.overflows != overflows || q.overflowing > 0
	for i, k := range kept {
		if q.spooled[k.Key] || sent[k.Key] || q.undecodable[k.Key] {
			continue
		}
		if len(q.queued) >= q.opt.Max {
			// The rest stay in the store until there is room.
			q.overflow = true
			q.log.DebugContext(ctx, q.opt.What+"s kept in the store stay there until there is room", "kept", len(kept)-i)
			break
		}
		rec, err := q.opt.Decode(k.Rec)
		if err != nil {
			// Not a record this version reads: leave it for one that does.
			if q.undecodable == nil {
				q.undecodable = map[string]bool{}
			}
			q.undecodable[k.Key] = true
			q.log.ErrorContext(ctx, q.opt.What+" kept in the store does not decode; left there", "key", k.Key, "err", err)
			continue
		}
		q.queue(waiting[T]{key: k.Key, rec: rec})
		n++
	}
	if n > 0 {
		q.log.InfoContext(ctx, q.opt.What+"s kept in the store are queued to be sent", "records", n)
	}
	return nil
}

// retryable says whether the receiver may take a record later: it was
// unavailable, slow, or out of room, not refusing the record itself.
func retryable(err error) bool {
	switch apierror.Code(err) {
	case codes.InvalidArgument, codes.PermissionDenied, codes.Unauthenticated, codes.Unimplemented, codes.FailedPrecondition:
		return false
	}
	return true
}

// enqueue queues rec under a new spool key (none without a Spool). It
// reports whether the record is to be kept in the Spool: queued; or, with
// memory full or the queue closed, waiting in the store alone (for a
// later Recover, or the next start). Without a Spool such a record is
// lost. Called with mu held.
func (q *Queue[T]) enqueue(ctx context.Context, rec T) (waiting[T], bool) {
	w := waiting[T]{rec: rec}
	if q.opt.Spool != nil {
		// Time first, so keys sort in the order records were queued
		// (never backwards, whatever the wall clock does); the random
		// part keeps replicas sharing a spool apart.
		t := max(time.Now().UnixNano(), q.lastKey+1)
		q.lastKey = t
		w.key = fmt.Sprintf("%016x-%s", t, ids.New("rec"))
	}
	switch {
	case q.closed && w.key != "":
		q.log.WarnContext(ctx, q.opt.What+" not taken while the service stopped: kept in the store for its next start", q.opt.Describe(rec)...)
		q.putting++
		w.alone = true
		return w, true
	case q.closed:
		q.log.ErrorContext(ctx, q.opt.What+" lost: not taken while the service stopped", q.opt.Describe(rec)...)
		q.opt.Lost.Add(1)
		return w, false
	case len(q.queued) >= q.opt.Max && w.key != "":
		if !q.overflow {
			q.log.WarnContext(ctx, q.opt.What+"s wait in the store alone: too many wait in memory", "waiting", len(q.queued))
		}
		q.overflow = true
		q.overflows++
		q.overflowing++
		q.putting++
		w.alone = true
		return w, true
	case len(q.queued) >= q.opt.Max:
		if q.lost++; q.lost == 1 {
			q.log.ErrorContext(ctx, q.opt.What+"s lost: too many wait", append(q.opt.Describe(rec), "waiting", len(q.queued))...)
		}
		q.opt.Lost.Add(1)
		return w, false
	}
	q.queue(w)
	if w.key != "" {
		q.putting++
	}
	return w, true
}

// queue appends w, starting the goroutine that sends the queue when it
// was empty. Called with mu held.
func (q *Queue[T]) queue(w waiting[T]) {
	q.queued = append(q.queued, w)
	q.opt.Waiting.Set(float64(len(q.queued)))
	if w.key != "" {
		if q.spooled == nil {
			q.spooled = map[string]bool{}
		}
		q.spooled[w.key] = true
	}
	if len(q.queued) == 1 {
		q.draining = make(chan struct{})
		go q.drain(q.draining)
	}
}

// drain sends the queued records in order until the queue is empty,
// waiting longer between tries while the receiver does not take them,
// then reads back what waits in the store alone; it closes finished when
// it returns.
func (q *Queue[T]) drain(finished chan struct{}) {
	defer close(finished)
	wait := q.opt.FirstRetry
	for {
		select {
		case <-q.done:
			return
		case <-time.After(wait):
		}
		for {
			q.mu.Lock()
			if len(q.queued) == 0 || q.closed {
				q.mu.Unlock()
				return
			}
			w := q.queued[0]
			q.mu.Unlock()
			ctx, cancel := context.WithTimeout(context.Background(), q.opt.SendWait)
			err := q.opt.Send(ctx, w.rec)
			cancel()
			if err != nil && retryable(err) {
				break
			}
			if err != nil {
				q.log.Error(q.opt.What+" refused, not sent", append(q.opt.Describe(w.rec), "err", err)...)
			}
			q.unspool(w.key)
			q.mu.Lock()
			if q.closed {
				// Close took the queue over (and sends w again,
				// which the receiver stores once).
				q.mu.Unlock()
				return
			}
			q.queued = q.queued[1:]
			q.opt.Waiting.Set(float64(len(q.queued)))
			empty, lost, overflow := len(q.queued) == 0, q.lost, q.overflow
			if empty {
				q.queued, q.lost = nil, 0
			}
			q.mu.Unlock()
			if empty && overflow {
				// What waited in the store alone comes back in order;
				// a new drain sends it.
				q.readBack()
				return
			}
			if empty {
				q.log.Info(q.opt.What+"s that waited are sent", "lost", lost)
				return
			}
			wait = q.opt.FirstRetry
		}
		wait = min(2*wait, q.opt.MaxRetry)
	}
}

// Close is called when the service stops: it ends the sending goroutine's
// waits and sends the records still waiting, until ctx ends. Those not
// taken stay in the Spool for the next start, or, without one (or where
// the store did not keep them), are logged as lost. Records after Close
// are sent once, not queued (with a Spool, one not taken is kept there).
func (q *Queue[T]) Close(ctx context.Context) {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return
	}
	q.closed = true
	close(q.done)
	queued, draining := q.queued, q.draining
	q.queued = nil
	q.opt.Waiting.Set(0)
	q.mu.Unlock()
	if draining != nil {
		// A send in flight ends within SendWait.
		select {
		case <-draining:
		case <-ctx.Done():
		}
	}
	for i, w := range queued {
		sctx, cancel := context.WithTimeout(ctx, q.opt.SendWait)
		err := q.opt.Send(sctx, w.rec)
		cancel()
		if err != nil {
			rest := queued[i:]
			q.awaitPuts(ctx)
			q.mu.Lock()
			q.counted = true
			lost := 0
			for _, r := range rest {
				if r.key == "" || q.unkept[r.key] {
					lost++
				}
			}
			q.mu.Unlock()
			if kept := len(rest) - lost; kept > 0 {
				q.log.WarnContext(ctx, q.opt.What+"s not taken before the service stopped: kept in the store for its next start", "kept", kept, "err", err)
			}
			if lost > 0 {
				q.log.ErrorContext(ctx, q.opt.What+"s lost: not taken before the service stopped", "lost", lost, "err", err)
				q.opt.Lost.Add(float64(lost))
			}
			return
		}
		q.unspool(w.key)
	}
}

// awaitPuts waits, until ctx ends, for the store writes in flight, so
// that Close counts a record whose write fails as lost, not kept. (A
// write that fails later counts itself, see spool.)
func (q *Queue[T]) awaitPuts(ctx context.Context) {
	for {
		q.mu.Lock()
		n := q.putting
		q.mu.Unlock()
		if n == 0 {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
}
