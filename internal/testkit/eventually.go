package testkit

import (
	"testing"
	"time"
)

// Eventually polls cond until it holds, for a state a test waits for but
// does not cause, and fails t naming what after a minute. The bound only
// keeps a broken run from hanging: the assertion is that the state is
// reached at all, never how fast. Polls start at 5 ms and slow to 100 ms,
// so a quick state is seen at once and a slow one costs little.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	EventuallyWithin(t, time.Minute, what, cond)
}

// EventuallyWithin is Eventually bounded by bound instead of a minute,
// for a state that takes a cluster or a restart to reach.
func EventuallyWithin(t testing.TB, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Within(bound, cond) {
		t.Fatal("never reached: " + what)
	}
}

// EventuallySucceeds polls call until it returns nil, for a call that
// must work once a dependency is back, and fails t naming what and the
// last error after a minute.
func EventuallySucceeds(t testing.TB, what string, call func() error) {
	t.Helper()
	EventuallySucceedsWithin(t, time.Minute, what, call)
}

// EventuallySucceedsWithin is EventuallySucceeds bounded by bound.
func EventuallySucceedsWithin(t testing.TB, bound time.Duration, what string, call func() error) {
	t.Helper()
	var err error
	if !Within(bound, func() bool { err = call(); return err == nil }) {
		t.Fatalf("never succeeded: %s: %v", what, err)
	}
}

// Within polls cond as Eventually does and reports whether it held
// within bound, failing nothing: for a goroutine other than the test's
// (which must not call t.Fatal), or a test that collects what went wrong
// before it reports.
func Within(bound time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(bound)
	for wait := 5 * time.Millisecond; !cond(); wait = min(2*wait, 100*time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(wait)
	}
	return true
}
