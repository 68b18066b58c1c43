package groupsend_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/v0m3/v0m3/internal/groupsend"
)

// recorder is a send that records what each send carried, and can hold
// the first send until released, so callers pile up behind it.
type recorder struct {
	mu    sync.Mutex
	sends [][]string
	hold  chan struct{} // the first send waits on it when set
	held  chan struct{} // closed once the first send is waiting
	fail  func(items []string) error
}

func (r *recorder) send(_ context.Context, items []string) error {
	r.mu.Lock()
	first := len(r.sends) == 0
	r.sends = append(r.sends, slices.Clone(items))
	r.mu.Unlock()
	if first && r.hold != nil {
		close(r.held)
		<-r.hold
	}
	if r.fail != nil {
		return r.fail(items)
	}
	return nil
}

func (r *recorder) got() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.sends)
}

func held() *recorder {
	return &recorder{hold: make(chan struct{}), held: make(chan struct{})}
}

// pileUp starts a caller that leads a held send, then each of waiting in
// order, each queued before the next starts, and releases the held send;
// it returns each waiting caller's error once all returned.
func pileUp(t *testing.T, r *recorder, s *groupsend.Sender[string], lead []string, waiting ...[]string) []error {
	t.Helper()
	errs := make([]error, len(waiting))
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := s.Send(context.Background(), lead); err != nil {
			t.Errorf("leading send: %v", err)
		}
	})
	<-r.held
	for i, items := range waiting {
		wg.Go(func() { errs[i] = s.Send(context.Background(), items) })
		// Each caller is queued before the next starts, so the arrival
		// order is the slice's.
		for s.Waiting() < i+1 {
			runtime.Gosched()
		}
	}
	close(r.hold)
	wg.Wait()
	return errs
}

func TestLoneCallerSendsAtOnce(t *testing.T) {
	t.Parallel()
	r := &recorder{}
	s := groupsend.New(r.send, groupsend.Options[string]{})
	for i := range 3 {
		if err := s.Send(context.Background(), []string{fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := r.got(), [][]string{{"0"}, {"1"}, {"2"}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("sends = %v, want one per call, in order: %v", got, want)
	}
}

func TestCallersWaitingShareTheNextSend(t *testing.T) {
	t.Parallel()
	r := held()
	s := groupsend.New(r.send, groupsend.Options[string]{})
	errs := pileUp(t, r, s, []string{"a"}, []string{"b1", "b2"}, []string{"c"}, []string{"d"})
	for i, err := range errs {
		if err != nil {
			t.Errorf("caller %d: %v", i, err)
		}
	}
	want := [][]string{{"a"}, {"b1", "b2", "c", "d"}}
	if got := r.got(); !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("sends = %v, want the waiting callers' items in one send, in arrival order: %v", got, want)
	}
}

func TestLimitsSplitSendsNeverACallersItems(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts groupsend.Options[string]
		want [][]string
	}{
		{
			name: "items",
			opts: groupsend.Options[string]{MaxItems: 3},
			want: [][]string{{"a"}, {"b1", "b2", "c"}, {"d1", "d2", "d3", "d4"}, {"e"}},
		},
		{
			name: "bytes",
			opts: groupsend.Options[string]{MaxBytes: 5, Size: func(s string) int { return len(s) }},
			want: [][]string{{"a"}, {"b1", "b2", "c"}, {"d1", "d2", "d3", "d4"}, {"e"}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := held()
			s := groupsend.New(r.send, tc.opts)
			pileUp(t, r, s, []string{"a"}, []string{"b1", "b2"}, []string{"c"}, []string{"d1", "d2", "d3", "d4"}, []string{"e"})
			if got := r.got(); !slices.EqualFunc(got, tc.want, slices.Equal) {
				t.Errorf("sends = %v, want %v", got, tc.want)
			}
		})
	}
}

var errInvalid = errors.New("invalid item")

func TestAnIsolatedErrorIsOnlyItsCallers(t *testing.T) {
	t.Parallel()
	r := held()
	r.fail = func(items []string) error {
		if slices.Contains(items, "bad") {
			return errInvalid
		}
		return nil
	}
	s := groupsend.New(r.send, groupsend.Options[string]{Isolate: func(err error) bool { return errors.Is(err, errInvalid) }})
	errs := pileUp(t, r, s, []string{"a"}, []string{"b"}, []string{"bad"}, []string{"c"})
	if errs[0] != nil || errs[2] != nil {
		t.Errorf("callers with valid items got %v and %v, want nil: another caller's invalid item is not theirs", errs[0], errs[2])
	}
	if !errors.Is(errs[1], errInvalid) {
		t.Errorf("caller with the invalid item got %v, want %v", errs[1], errInvalid)
	}
	want := [][]string{{"a"}, {"b", "bad", "c"}, {"b"}, {"bad"}, {"c"}}
	if got := r.got(); !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("sends = %v, want the shared send then one per caller: %v", got, want)
	}
}

func TestASharedFailureReachesEveryCallerOfItsSend(t *testing.T) {
	t.Parallel()
	errDown := errors.New("unavailable")
	r := held()
	r.fail = func(items []string) error {
		if items[0] == "a" {
			return nil
		}
		return errDown
	}
	s := groupsend.New(r.send, groupsend.Options[string]{Isolate: func(err error) bool { return errors.Is(err, errInvalid) }})
	for i, err := range pileUp(t, r, s, []string{"a"}, []string{"b"}, []string{"c"}) {
		if !errors.Is(err, errDown) {
			t.Errorf("caller %d got %v, want the send's error %v", i, err, errDown)
		}
	}
	if got := len(r.got()); got != 2 {
		t.Errorf("%d sends, want 2: an error that is not isolated is not sent again", got)
	}
}

// TestEveryItemIsSentOnce runs many callers at once (under -race in make
// test): each item goes out in exactly one send, each caller's items
// together and in order.
func TestEveryItemIsSentOnce(t *testing.T) {
	t.Parallel()
	r := &recorder{}
	s := groupsend.New(r.send, groupsend.Options[string]{MaxItems: 16})
	const callers, per = 64, 3
	var wg sync.WaitGroup
	for c := range callers {
		wg.Go(func() {
			items := []string{fmt.Sprintf("%d/0", c), fmt.Sprintf("%d/1", c), fmt.Sprintf("%d/2", c)}
			if err := s.Send(context.Background(), items); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	seen := map[string]int{}
	for _, send := range r.got() {
		if len(send) > 16 {
			t.Errorf("a send carried %d items, over the bound of 16", len(send))
		}
		for i, it := range send {
			seen[it]++
			var c, k int
			fmt.Sscanf(it, "%d/%d", &c, &k)
			if k > 0 && (i == 0 || send[i-1] != fmt.Sprintf("%d/%d", c, k-1)) {
				t.Errorf("item %s is not right after its caller's previous item in %v", it, send)
			}
		}
	}
	if len(seen) != callers*per {
		t.Errorf("%d distinct items sent, want %d", len(seen), callers*per)
	}
	for it, n := range seen {
		if n != 1 {
			t.Errorf("item %s sent %d times", it, n)
		}
	}
}

// shareOf queues b and c, in that order, behind a held lone send, and
// returns what send saw of the shared send that carries both (b leads
// it): send gets the shared send's context.
func shareOf(t *testing.T, b, c context.Context, send func(ctx context.Context)) {
	t.Helper()
	hold, held := make(chan struct{}), make(chan struct{})
	var sends [][]string
	s := groupsend.New(func(ctx context.Context, items []string) error {
		sends = append(sends, slices.Clone(items)) // sends never overlap
		if len(sends) == 1 {
			close(held)
			<-hold
			return nil
		}
		send(ctx)
		return nil
	}, groupsend.Options[string]{})
	var wg sync.WaitGroup
	wg.Go(func() { _ = s.Send(context.Background(), []string{"a"}) })
	<-held
	errs := make([]error, 2)
	wg.Go(func() { errs[0] = s.Send(b, []string{"b"}) })
	for s.Waiting() < 1 {
		runtime.Gosched()
	}
	wg.Go(func() { errs[1] = s.Send(c, []string{"c"}) })
	for s.Waiting() < 2 {
		runtime.Gosched()
	}
	close(hold)
	wg.Wait()
	if want := [][]string{{"a"}, {"b", "c"}}; !slices.EqualFunc(sends, want, slices.Equal) {
		t.Fatalf("sends = %v, want %v", sends, want)
	}
	for i, err := range errs {
		if err != nil {
			t.Errorf("caller %d: %v", i, err)
		}
	}
}

func TestASharedSendOutlivesTheCallerLeadingIt(t *testing.T) {
	t.Parallel()
	b, cancelB := context.WithCancel(context.Background())
	c, cancelC := context.WithCancel(context.Background())
	var afterLeader, afterAll error
	shareOf(t, b, c, func(ctx context.Context) {
		cancelB()
		afterLeader = ctx.Err()
		cancelC()
		select {
		case <-ctx.Done():
			afterAll = ctx.Err()
		case <-time.After(10 * time.Second):
			afterAll = errors.New("still running 10s after every caller gave up")
		}
	})
	if afterLeader != nil {
		t.Errorf("the leader giving up ended the send carrying another caller's items: %v", afterLeader)
	}
	if !errors.Is(afterAll, context.Canceled) {
		t.Errorf("once every caller gave up the send's context = %v, want it cancelled", afterAll)
	}
}

func TestASharedSendHasTheLatestDeadline(t *testing.T) {
	t.Parallel()
	now := time.Now()
	soon, later := now.Add(time.Hour), now.Add(2*time.Hour)
	withDeadline := func(d time.Time) context.Context {
		ctx, cancel := context.WithDeadline(context.Background(), d)
		t.Cleanup(cancel)
		return ctx
	}
	for _, tc := range []struct {
		name       string
		b, c       context.Context
		want       time.Time
		wantBounds bool
	}{
		{"both bounded", withDeadline(soon), withDeadline(later), later, true},
		{"the follower unbounded", withDeadline(soon), context.Background(), time.Time{}, false},
		{"the leader unbounded", context.Background(), withDeadline(later), time.Time{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var got time.Time
			var bounded bool
			shareOf(t, tc.b, tc.c, func(ctx context.Context) { got, bounded = ctx.Deadline() })
			if bounded != tc.wantBounds || !got.Equal(tc.want) {
				t.Errorf("shared send's deadline = %v (set %v), want %v (set %v)", got, bounded, tc.want, tc.wantBounds)
			}
		})
	}
}
