//go:build !failpoints

package failpoint

// Enabled reports whether this binary honours Env: false, it was built
// without the failpoints tag.
const Enabled = false

// Hit does nothing in a binary built without the failpoints tag.
func Hit(string) {}
