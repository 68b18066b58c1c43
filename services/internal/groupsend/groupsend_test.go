package groupsend_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"

	"github.com/v0m3/v0m3/services/internal/groupsend"
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
