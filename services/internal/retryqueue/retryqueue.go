// Package retryqueue hands records a service writes to another service
// (audit records, protocol trace events, both to evidence) so that an
// outage of the receiver delays them instead of losing them. A record is
// sent at once; one the receiver cannot take now (it is unavailable,
// slow, or its store is full) waits in a queue, in order, and is sent
// again until it is taken, and records written meanwhile queue behind it
// without waiting, so they stay in order and the writer is not held up.
// The queue is in memory and bounded: a record that does not fit, or
// still waits when the service stops, is logged as lost. Records must be
// safe to send twice (the receiver stores them once by an id they carry),
// since a send that timed out may have been taken.
package retryqueue

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/services/internal/apierror"
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
}

// Queue sends records, keeping those the receiver could not take; see the
// package comment.
type Queue[T any] struct {
	opt Options[T]
	log *slog.Logger

	mu sync.Mutex
	// queued records wait, oldest first; a goroutine sends them while it
	// is not empty.
	queued []T
	// lost counts records dropped since the last one logged as lost.
	lost int
	// closed: the service is stopping; nothing more is queued.
	closed bool
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
	return &Queue[T]{opt: opt, log: log}
}

// SetFirstRetry changes the first wait between tries (for tests); call it
// before the first Send.
func (q *Queue[T]) SetFirstRetry(d time.Duration) { q.opt.FirstRetry = d }

// Send sends rec, waiting at most SendWait, and not at all while records
// are queued: it queues behind them, keeping them in order. A record the
// receiver refuses for what it is (invalid, not allowed) is logged and
// dropped: sending it again would not change the answer.
func (q *Queue[T]) Send(ctx context.Context, rec T) {
	q.mu.Lock()
	if len(q.queued) > 0 {
		q.enqueue(ctx, rec)
		q.mu.Unlock()
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
	defer q.mu.Unlock()
	if len(q.queued) == 0 {
		q.log.WarnContext(ctx, q.opt.What+"s wait for their receiver; sent once it is back", append(q.opt.Describe(rec), "err", err)...)
	}
	q.enqueue(ctx, rec)
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

// enqueue queues rec, starting the goroutine that sends the queue when it
// was empty. Called with mu held.
func (q *Queue[T]) enqueue(ctx context.Context, rec T) {
	if q.closed {
		q.log.ErrorContext(ctx, q.opt.What+" lost: not taken while the service stopped", q.opt.Describe(rec)...)
		return
	}
	if len(q.queued) >= q.opt.Max {
		if q.lost++; q.lost == 1 {
			q.log.ErrorContext(ctx, q.opt.What+"s lost: too many wait", append(q.opt.Describe(rec), "waiting", len(q.queued))...)
		}
		return
	}
	q.queued = append(q.queued, rec)
	if len(q.queued) == 1 {
		go q.drain()
	}
}

// drain sends the queued records in order until the queue is empty,
// waiting longer between tries while the receiver does not take them.
func (q *Queue[T]) drain() {
	wait := q.opt.FirstRetry
	for {
		time.Sleep(wait)
		for {
			q.mu.Lock()
			if len(q.queued) == 0 || q.closed {
				q.mu.Unlock()
				return
			}
			rec := q.queued[0]
			q.mu.Unlock()
			ctx, cancel := context.WithTimeout(context.Background(), q.opt.SendWait)
			err := q.opt.Send(ctx, rec)
			cancel()
			if err != nil && retryable(err) {
				break
			}
			if err != nil {
				q.log.Error(q.opt.What+" refused, not sent", append(q.opt.Describe(rec), "err", err)...)
			}
			q.mu.Lock()
			if q.closed {
				// Close took the queue over (and sends rec again,
				// which the receiver stores once).
				q.mu.Unlock()
				return
			}
			q.queued = q.queued[1:]
			empty, lost := len(q.queued) == 0, q.lost
			if empty {
				q.queued, q.lost = nil, 0
			}
			q.mu.Unlock()
			if empty {
				q.log.Info(q.opt.What+"s that waited are sent", "lost", lost)
				return
			}
			wait = q.opt.FirstRetry
		}
		wait = min(2*wait, q.opt.MaxRetry)
	}
}

// Close is called when the service stops: it sends the records still
// waiting, until ctx ends, and logs those not taken as lost. Records
// after Close are sent once, not queued.
func (q *Queue[T]) Close(ctx context.Context) {
	q.mu.Lock()
	q.closed = true
	queued := q.queued
	q.queued = nil
	q.mu.Unlock()
	for i, rec := range queued {
		sctx, cancel := context.WithTimeout(ctx, q.opt.SendWait)
		err := q.opt.Send(sctx, rec)
		cancel()
		if err != nil {
			q.log.ErrorContext(ctx, q.opt.What+"s lost: not taken before the service stopped", "lost", len(queued)-i, "err", err)
			return
		}
	}
}
