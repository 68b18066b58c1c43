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
	poll(t, bound, cond, func() string { return "never reached: " + what })
}

// EventuallySucceeds polls call until it returns nil, for a call that
// must work once a dependency is back, and fails t naming what and the
// last error after a minute.
func EventuallySucceeds(t testing.TB, what string, call func() error) {
	t.Helper()
	var err error
	poll(t, time.Minute, func() bool { err = call(); return err == nil },
		func() string { return "never succeeded: " + what + ": " + err.Error() })
}

func poll(t testing.TB, bound time.Duration, cond func() bool, failure func() string) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for wait := 5 * time.Millisecond; !cond(); wait = min(2*wait, 100*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal(failure())
		}
		time.Sleep(wait)
	}
}
