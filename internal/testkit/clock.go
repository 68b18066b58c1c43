package testkit

import (
	"sync"
	"time"
)

// Clock is a fake clock a test moves forward, safe for concurrent use:
// give a server its Now, then Advance past an expiry instead of waiting
// for it. NewClock's stands still between Advances; NewOffsetClock's is
// the wall clock plus what was advanced, for a server whose other parts
// (leases, retries, timers) need real time to pass.
type Clock struct {
	mu     sync.Mutex
	at     time.Time // the frozen time, when wall is false
	offset time.Duration
	wall   bool
}

// NewClock returns a clock that reads start until advanced.
func NewClock(start time.Time) *Clock { return &Clock{at: start} }

// NewOffsetClock returns a clock that reads the wall clock plus every
// Advance so far.
func NewOffsetClock() *Clock { return &Clock{wall: true} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.wall {
		return time.Now().Add(c.offset)
	}
	return c.at.Add(c.offset)
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.offset += d
}
