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
	deadline := time.Now().Add(time.Minute)
	for wait := 5 * time.Millisecond; !cond(); wait = min(2*wait, 100*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("never reached: %s", what)
		}
		time.Sleep(wait)
	}
}
