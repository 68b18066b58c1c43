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

// SetCacheSize bounds the answers kept of each kind to n; call it before
// the first Authenticate.
func (t *TokenReview) SetCacheSize(n int) { t.size = n }

// SetRefusalLogClock makes the guard's refusal log read the time from now;
// call it before the first refusal.
func (g *Guard) SetRefusalLogClock(now func() time.Time) { g.logged.Now = now }
