package retryqueue_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/v0m3/v0m3/internal/retryqueue"
	"github.com/v0m3/v0m3/internal/testkit"
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
	testkit.Eventually(t, "after the outage the receiver takes every record", func() bool { return slices.Equal(r.got(), want) })
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

// memSpool is a Spool in memory, standing in for a service's store in
// these unit tests (the stores' own spools are tested on bbolt and Redis,
// and the whole path in the suite).
type memSpool struct {
	mu      sync.Mutex
	recs    map[string][]byte
	puts    int
	failPut bool
}

func (s *memSpool) Put(_ context.Context, key string, rec []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failPut {
		return errors.New("store out")
	}
	if s.recs == nil {
		s.recs = map[string][]byte{}
	}
	s.recs[key] = rec
	s.puts++
	return nil
}

func (s *memSpool) Delete(_ context.Context, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.recs, key)
	return nil
}

func (s *memSpool) List(context.Context) ([]retryqueue.Spooled, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []retryqueue.Spooled
	for k, v := range s.recs {
		out = append(out, retryqueue.Spooled{Key: k, Rec: v})
	}
	slices.SortFunc(out, func(a, b retryqueue.Spooled) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

func (s *memSpool) kept() []string {
	l, _ := s.List(context.Background())
	var out []string
	for _, e := range l {
		out = append(out, string(e.Rec))
	}
	return out
}

func spooledQueue(r *receiver, sp *memSpool, logs *testkit.SyncBuffer) *retryqueue.Queue[string] {
	q := retryqueue.New(slog.New(slog.NewTextHandler(logs, nil)), retryqueue.Options[string]{
		What: "record", Send: r.send, Spool: sp,
		Encode: func(rec string) ([]byte, error) { return []byte(rec), nil },
		Decode: func(b []byte) (string, error) { return string(b), nil },
	})
	q.SetFirstRetry(time.Millisecond)
	return q
}

// With a Spool, what waits is kept in the store too: a queue that stops
// while the receiver is out leaves it there, and the next queue on that
// store (the next start, or another replica) sends it, in order, each
// once, and empties the store. A record the receiver takes at once never
// touches the store.
func TestSpooledRecordsSurviveARestart(t *testing.T) {
	t.Parallel()
	r := &receiver{up: true}
	sp := &memSpool{}
	var logs testkit.SyncBuffer
	ctx := context.Background()
	first := spooledQueue(r, sp, &logs)
	first.Send(ctx, "a")
	if sp.puts != 0 {
		t.Fatalf("a record sent at once was written to the store %d times", sp.puts)
	}
	r.set(false)
	for _, rec := range []string{"b", "c", "d"} {
		first.Send(ctx, rec)
	}
	if got := sp.kept(); !slices.Equal(got, []string{"b", "c", "d"}) {
		t.Fatalf("while the receiver is out the store keeps %v, want b, c, d", got)
	}
	first.Close(ctx)        // the receiver is still out
	first.Send(ctx, "late") // after the stop: tried once, then kept
	if got := sp.kept(); !slices.Equal(got, []string{"b", "c", "d", "late"}) {
		t.Fatalf("after a stop the store keeps %v, want b, c, d, late", got)
	}
	if !strings.Contains(logs.String(), "kept in the store") || strings.Contains(logs.String(), "lost") {
		t.Errorf("the stop should say the records are kept, not lost: %s", logs.String())
	}

	r.set(true)
	next := spooledQueue(r, sp, &logs)
	next.Send(ctx, "e") // sent at once: the receiver is back
	if err := next.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if err := next.Recover(ctx); err != nil { // a second recovery queues nothing twice
		t.Fatal(err)
	}
	want := []string{"a", "e", "b", "c", "d", "late"}
	testkit.Eventually(t, "the receiver takes the recovered and the new records", func() bool { return slices.Equal(r.got(), want) })
	if got := r.got(); !slices.Equal(got, want) {
		t.Errorf("the receiver took %v, want %v", got, want)
	}
	testkit.Eventually(t, "the store lets go of what the receiver took", func() bool { return len(sp.kept()) == 0 })
	if got := sp.kept(); len(got) != 0 {
		t.Errorf("the store still keeps %v after the receiver took them", got)
	}
}

// With a Spool, memory's bound loses nothing: records past it wait in
// the store alone, and once the queue empties they are read back and
// sent, in order; a recovery likewise takes what fits and leaves the rest
// in the store until there is room.
func TestSpoolHoldsWhatDoesNotFitInMemory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, recovered := range []bool{false, true} {
		sp := &memSpool{}
		r := &receiver{}
		lost := &metric{}
		var logs testkit.SyncBuffer
		q := retryqueue.New(slog.New(slog.NewTextHandler(&logs, nil)), retryqueue.Options[string]{
			What: "record", Send: r.send, Spool: sp, Max: 2, Lost: lost,
			Encode: func(rec string) ([]byte, error) { return []byte(rec), nil },
			Decode: func(b []byte) (string, error) { return string(b), nil },
		})
		q.SetFirstRetry(time.Millisecond)
		want := []string{"a", "b", "c", "d"}
		if recovered {
			for i, rec := range want {
				if err := sp.Put(ctx, fmt.Sprint(i), []byte(rec)); err != nil {
					t.Fatal(err)
				}
			}
			if err := q.Recover(ctx); err != nil {
				t.Fatal(err)
			}
		} else {
			for _, rec := range want {
				q.Send(ctx, rec)
			}
		}
		if got := sp.kept(); !slices.Equal(got, want) || lost.get() != 0 {
			t.Fatalf("recovered=%v: with memory full the store keeps %v and %v were lost; want %v kept, none lost", recovered, got, lost.get(), want)
		}
		r.set(true)
		testkit.Eventually(t, "the receiver takes every kept record and the store lets go of them", func() bool {
			return slices.Equal(r.got(), want) && len(sp.kept()) == 0
		})
		if got := r.got(); !slices.Equal(got, want) || len(sp.kept()) > 0 {
			t.Errorf("recovered=%v: the receiver took %v and the store keeps %v; want %v taken in order, the store empty", recovered, got, sp.kept(), want)
		}
		q.Close(ctx)
	}
}

// A record the store did not keep waits in memory only: if the service
// stops before it is sent, it is counted and logged as lost, not said to
// be kept.
func TestCloseCountsWhatTheStoreDidNotKeep(t *testing.T) {
	t.Parallel()
	sp := &memSpool{failPut: true}
	r := &receiver{}
	lost := &metric{}
	var logs testkit.SyncBuffer
	q := retryqueue.New(slog.New(slog.NewTextHandler(&logs, nil)), retryqueue.Options[string]{
		What: "record", Send: r.send, Spool: sp, Lost: lost,
		Encode: func(rec string) ([]byte, error) { return []byte(rec), nil },
		Decode: func(b []byte) (string, error) { return string(b), nil },
	})
	q.SetFirstRetry(time.Hour)
	q.Send(context.Background(), "a")
	q.Close(context.Background())
	if lost.get() != 1 || !strings.Contains(logs.String(), "records lost") || strings.Contains(logs.String(), "kept in the store for its next start") {
		t.Errorf("lost %v; log: %s; want the record counted and logged as lost", lost.get(), logs.String())
	}
}

// metric records what a queue reports as a Gauge and a Counter.
type metric struct {
	mu  sync.Mutex
	val float64
}

func (m *metric) Set(v float64) { m.mu.Lock(); m.val = v; m.mu.Unlock() }
func (m *metric) Add(v float64) { m.mu.Lock(); m.val += v; m.mu.Unlock() }
func (m *metric) get() float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.val
}

// The queue reports what waits and counts what it drops, so an SRE can
// alert on a backlog for evidence before anything is lost.
func TestQueueMetrics(t *testing.T) {
	t.Parallel()
	r := &receiver{}
	waiting, lost := &metric{}, &metric{}
	q := retryqueue.New(nil, retryqueue.Options[string]{What: "record", Send: r.send, Max: 3, Waiting: waiting, Lost: lost})
	q.SetFirstRetry(time.Millisecond)
	ctx := context.Background()
	for _, rec := range []string{"a", "b", "c", "d", "e"} {
		q.Send(ctx, rec)
	}
	if waiting.get() != 3 || lost.get() != 2 {
		t.Errorf("with the receiver out: waiting %v, lost %v; want 3 waiting (the bound) and 2 lost", waiting.get(), lost.get())
	}
	r.set(true)
	testkit.Eventually(t, "nothing waits once the receiver is back", func() bool { return waiting.get() == 0 })
	if waiting.get() != 0 || !slices.Equal(r.got(), []string{"a", "b", "c"}) {
		t.Errorf("once the receiver is back: waiting %v, taken %v; want 0 and a, b, c", waiting.get(), r.got())
	}
	r.set(false)
	q.Send(ctx, "f")
	q.Close(ctx) // no spool: what waits is lost
	if waiting.get() != 0 || lost.get() != 3 {
		t.Errorf("after a stop with f waiting: waiting %v, lost %v; want 0 and 3", waiting.get(), lost.get())
	}
}

// gateSpool is a memSpool whose Put of one record waits for a gate, and
// whose List can hang until its context ends.
type gateSpool struct {
	memSpool
	gateRec  string
	gate     chan struct{}
	listHang chan struct{}
}

func (s *gateSpool) Put(ctx context.Context, key string, rec []byte) error {
	if string(rec) == s.gateRec {
		<-s.gate
	}
	return s.memSpool.Put(ctx, key, rec)
}

func (s *gateSpool) List(ctx context.Context) ([]retryqueue.Spooled, error) {
	if s.listHang != nil {
		select {
		case <-s.listHang:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return s.memSpool.List(ctx)
}

func gateQueue(r *receiver, sp retryqueue.Spool) *retryqueue.Queue[string] {
	q := retryqueue.New(nil, retryqueue.Options[string]{
		What: "record", Send: r.send, Spool: sp, Max: 1,
		Encode: func(rec string) ([]byte, error) { return []byte(rec), nil },
		Decode: func(b []byte) (string, error) { return string(b), nil },
	})
	q.SetFirstRetry(time.Millisecond)
	return q
}

// A record that overflowed memory and whose store write lands after the
// queue emptied (and read the store back without it) is sent then, not
// stranded in the store until the service's next rescan.
func TestOverflowWrittenLateIsStillSent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	sp := &gateSpool{gateRec: "b", gate: make(chan struct{})}
	r := &receiver{}
	q := gateQueue(r, sp)
	defer q.Close(ctx)
	q.Send(ctx, "a") // queued: memory is full
	sent := make(chan struct{})
	go func() { q.Send(ctx, "b"); close(sent) }() // to the store alone; its write waits
	r.set(true)
	testkit.Eventually(t, "a sent", func() bool { return slices.Equal(r.got(), []string{"a"}) })
	close(sp.gate)
	<-sent
	testkit.Eventually(t, "b sent without another Send or a rescan", func() bool { return slices.Equal(r.got(), []string{"a", "b"}) })
	testkit.Eventually(t, "the store emptied", func() bool { return len(sp.kept()) == 0 })
}

// A Recover hanging on a slow store holds up neither the queue's own
// read-back nor Close: Close returns while the store still hangs.
func TestCloseDoesNotWaitForAHangingRecover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	sp := &gateSpool{}
	r := &receiver{}
	q := gateQueue(r, sp)
	q.Send(ctx, "a") // queued
	q.Send(ctx, "b") // in the store alone
	sp.listHang = make(chan struct{})
	defer close(sp.listHang)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = q.Recover(rctx) }() // the service's rescan, hanging
	r.set(true)                         // a is sent; the read-back of b waits behind the rescan
	testkit.Eventually(t, "a sent", func() bool { return slices.Contains(r.got(), "a") })
	closed := make(chan struct{})
	go func() { q.Close(ctx); close(closed) }()
	testkit.Eventually(t, "Close returned while the store hangs", func() bool {
		select {
		case <-closed:
			return true
		default:
			return false
		}
	})
	if got := sp.kept(); !slices.Equal(got, []string{"b"}) {
		t.Errorf("after Close the store keeps %v, want b for the next start", got)
	}
}
