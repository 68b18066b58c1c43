package identity

import "time"

// ForceReloadCheck makes the next use look for changed files at once
// instead of within reloadEvery.
func (c *Credentials) ForceReloadCheck() {
	c.mu.Lock()
	c.checked = time.Time{}
	c.mu.Unlock()
}

// SetClock makes the limiter read the time from now.
func (l *CallerLimiter) SetClock(now func() time.Time) { l.now = now }
