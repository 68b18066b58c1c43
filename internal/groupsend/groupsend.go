// Package groupsend shares one round trip among concurrent callers of the
// same send: what callers hand over while a send is in flight goes out
// together in the next one. A lone caller sends at once (nobody waits for
// company), so it costs one caller nothing; under load N callers cost one
// round trip instead of N. Each caller still returns only once its own
// items were sent, with the error of the send that carried them, so what
// a caller learns stays what it would have learned sending alone.
//
// The callers take turns leading: the caller whose items head the queue
// sends everything queued (up to the limits), hands the lead to the next
// caller left waiting, and returns. No goroutine runs between sends.
package groupsend

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Sender sends the items of concurrent callers together. The zero value is
// not usable; see New.
type Sender[T any] struct {
	send func(ctx context.Context, items []T) error
	opts Options[T]

	mu    sync.Mutex
	queue []*call[T]
	busy  bool
}

// Options bound what one send carries and say when a shared send's error
// is one caller's fault.
type Options[T any] struct {
	// MaxItems bounds the items of one send; zero means no bound. A
	// caller's items are never split: a caller with more goes alone.
	MaxItems int
	// MaxBytes bounds the summed Size of one send's items; zero means no
	// bound. As with MaxItems, a larger caller goes alone.
	MaxBytes int
	// Size is an item's weight against MaxBytes.
	Size func(T) int
	// Isolate reports whether err refuses the items of one caller rather
	// than the send (an invalid item, say): a shared send that failed so
	// is sent again one caller at a time, so each caller gets the answer
	// its own items get and no caller fails for another's.
	Isolate func(err error) bool
}

// New returns a Sender that calls send with the items of one or more
// callers, in the order they arrived, each caller's items contiguous.
func New[T any](send func(ctx context.Context, items []T) error, opts Options[T]) *Sender[T] {
	return &Sender[T]{send: send, opts: opts}
}

type call[T any] struct {
	ctx   context.Context
	items []T
	bytes int
	// wake is signalled once: the call was sent (err is its answer) or
	// it leads the next send.
	wake chan struct{}
	lead bool
	err  error
}

// Send sends items, with those of whatever other callers are waiting,
// and returns the error of the send that carried them. A send carrying
// one caller's items runs under its ctx; a shared send, under the
// values of the caller that leads it, until every caller it carries has
// given up (see shared).
func (s *Sender[T]) Send(ctx context.Context, items []T) error {
	c := &call[T]{ctx: ctx, items: items, wake: make(chan struct{}, 1)}
	if s.opts.Size != nil {
		for _, it := range items {
			c.bytes += s.opts.Size(it)
		}
	}
	s.mu.Lock()
	s.queue = append(s.queue, c)
	if s.busy {
		s.mu.Unlock()
		<-c.wake
		if !c.lead {
			return c.err
		}
		s.mu.Lock()
	}
	s.busy = true
	// c heads the queue: it arrived to an idle sender, or was handed
	// the lead as the head.
	batch := s.take()
	s.mu.Unlock()

	s.sendBatch(batch)

	s.mu.Lock()
	if len(s.queue) > 0 {
		next := s.queue[0]
		next.lead = true
		next.wake <- struct{}{}
	} else {
		s.busy = false
	}
	s.mu.Unlock()
	return c.err
}

// take removes from the head of the queue the calls one send carries:
// always the first, then as many as fit the limits. Called with mu held.
func (s *Sender[T]) take() []*call[T] {
	n, items, bytes := 0, 0, 0
	for _, c := range s.queue {
		if n > 0 && (s.opts.MaxItems > 0 && items+len(c.items) > s.opts.MaxItems ||
			s.opts.MaxBytes > 0 && bytes+c.bytes > s.opts.MaxBytes) {
			break
		}
		n, items, bytes = n+1, items+len(c.items), bytes+c.bytes
	}
	batch := s.queue[:n:n]
	s.queue = s.queue[n:]
	if len(s.queue) == 0 {
		s.queue = nil // let the backing array go
	}
	return batch
}

// sendBatch sends the calls' items and sets each call's answer; every
// call but the first (the leader, which is running this) is woken.
func (s *Sender[T]) sendBatch(batch []*call[T]) {
	if len(batch) == 1 {
		batch[0].err = s.send(batch[0].ctx, batch[0].items)
	} else {
		var items []T
		for _, c := range batch {
			items = append(items, c.items...)
		}
		ctx, cancel := shared(batch)
		err := s.send(ctx, items)
		cancel()
		for _, c := range batch {
			c.err = err
		}
		if err != nil && s.opts.Isolate != nil && s.opts.Isolate(err) {
			for _, c := range batch {
				c.err = s.send(c.ctx, c.items)
			}
		}
	}
	for _, c := range batch[1:] {
		c.wake <- struct{}{}
	}
}

// shared returns the context of a send that carries the items of every
// call in batch: the leader's values (its trace, say), cancelled only once
// every call's context is done, and with the latest of their deadlines
// when each has one. Under the leader's context alone, a leader that gave
// up would fail the items of callers still waiting for them.
func shared[T any](batch []*call[T]) (context.Context, context.CancelFunc) {
	ctx := context.WithoutCancel(batch[0].ctx)
	var latest time.Time
	for _, c := range batch {
		d, ok := c.ctx.Deadline()
		if !ok {
			latest = time.Time{}
			break
		}
		if d.After(latest) {
			latest = d
		}
	}
	cancelDeadline := context.CancelFunc(func() {})
	if !latest.IsZero() {
		ctx, cancelDeadline = context.WithDeadline(ctx, latest)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	var left atomic.Int64
	left.Store(int64(len(batch)))
	stops := make([]func() bool, len(batch))
	for i, c := range batch {
		stops[i] = context.AfterFunc(c.ctx, func() {
			if left.Add(-1) == 0 {
				cancel(context.Cause(c.ctx))
			}
		})
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel(context.Canceled)
		cancelDeadline()
	}
}

// Waiting is how many callers wait for a send (not counting those of the
// send in flight): what the next send would carry.
func (s *Sender[T]) Waiting() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queue)
}
