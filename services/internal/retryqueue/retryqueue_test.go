package retryqueue_test

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/v0m3/v0m3/services/internal/retryqueue"
	"github.com/v0m3/v0m3/services/internal/testkit"
)

// receiver takes records while up, refuses with Unavailable while down,
// and refuses the records named in invalid for what they are.
type receiver struct {
	mu      sync.Mutex
	up      bool
	invalid map[string]bool
	taken   []string
}

func (r *receiver) send(_ context.Context, rec string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.invalid[rec]:
		return status.Error(codes.InvalidArgument, "bad record")
	case !r.up:
		return status.Error(codes.Unavailable, "down")
	}
	r.taken = append(r.taken, rec)
	return nil
}

func (r *receiver) set(up bool) {
	r.mu.Lock()
	r.up = up
	r.mu.Unlock()
}

func (r *receiver) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.taken)
}

func newQueue(r *receiver, max int, logs *testkit.SyncBuffer) *retryqueue.Queue[string] {
	q := retryqueue.New(slog.New(slog.NewTextHandler(logs, nil)), retryqueue.Options[string]{
		What: "record", Send: r.send, Max: max,
		Describe: func(rec string) []any { return []any{"record", rec} },
	})
	q.SetFirstRetry(time.Millisecond)
	return q
}

// Records sent while the receiver is down reach it once it is back, in
// the order they were sent, each once; one it refuses for what it is is
// dropped and logged, not retried for ever ahead of the others.
func TestQueueKeepsOrderThroughAnOutage(t *testing.T) {
	t.Parallel()
	r := &receiver{up: true, invalid: map[string]bool{"bad": true}}
	var logs testkit.SyncBuffer
	q := newQueue(r, 100, &logs)
	ctx := context.Background()
	q.Send(ctx, "a")
	r.set(false)
	for _, rec := range []string{"b", "c", "bad", "d"} {
		q.Send(ctx, rec)
	}
	if got := r.got(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("while down the receiver took %v, want only a", got)
	}
	r.set(true)
	want := []string{"a", "b", "c", "d"}
	deadline := time.Now().Add(10 * time.Second)
	for !slices.Equal(r.got(), want) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if got := r.got(); !slices.Equal(got, want) {
		t.Errorf("after the outage the receiver took %v, want %v", got, want)
	}
	if !strings.Contains(logs.String(), "record=bad") || !strings.Contains(logs.String(), "refused") {
		t.Errorf("the refused record was not logged: %s", logs.String())
	}
	// The queue is empty again: the next record is sent at once.
	q.Send(ctx, "e")
	if got := r.got(); got[len(got)-1] != "e" {
		t.Errorf("after the queue emptied, e was not sent at once: %v", got)
	}
}

// Past its bound the queue drops records and says so once; Close sends
// what waits, and what the receiver still does not take is logged lost.
func TestQueueBoundAndClose(t *testing.T) {
	t.Parallel()
	r := &receiver{}
	var logs testkit.SyncBuffer
	q := retryqueue.New(slog.New(slog.NewTextHandler(&logs, nil)), retryqueue.Options[string]{What: "record", Send: r.send, Max: 2})
	q.SetFirstRetry(time.Hour) // only Close sends them again
	ctx := context.Background()
	for _, rec := range []string{"a", "b", "c", "d"} {
		q.Send(ctx, rec)
	}
	if n := strings.Count(logs.String(), "too many wait"); n != 1 {
		t.Errorf("dropping past the bound logged %d times, want once: %s", n, logs.String())
	}
	r.set(true)
	q.Close(ctx)
	if got := r.got(); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("Close sent %v, want the two that fit: a, b", got)
	}
	r.set(false)
	q.Send(ctx, "e") // after Close: tried once, not queued
	q.Close(ctx)
	if !strings.Contains(logs.String(), "record lost") {
		t.Errorf("a record not taken after Close was not logged lost: %s", logs.String())
	}
}
