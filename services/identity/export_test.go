package identity

import "time"

// ForceReloadCheck makes the next use look for changed files at once
// instead of within reloadEvery.
func (c *Credentials) ForceReloadCheck() {
	c.mu.Lock()
	c.checked = time.Time{}
	c.mu.Unlock()
}
