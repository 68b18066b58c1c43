package testkit

import (
	"path/filepath"
	"testing"
)

// TestThirdPartyPinsMatchPackageJSON: the tests look for the servers in a
// directory named for the versions pinned here, and the install script
// names it for the versions its package.json pins; were they to differ,
// every third-party test would skip (or fail in CI) as not installed.
func TestThirdPartyPinsMatchPackageJSON(t *testing.T) {
	t.Parallel()
	pins := PackagePins(t, filepath.Join("..", "..", "scripts", "npm", "third-party-mcp"))
	for pkg, want := range map[string]string{
		"@modelcontextprotocol/server-everything": EverythingVersion,
		"@modelcontextprotocol/server-filesystem": FilesystemVersion,
		"@modelcontextprotocol/server-memory":     MemoryVersion,
		"time-mcp":                                TimeMCPVersion,
	} {
		if pins[pkg] != want {
			t.Errorf("%s: package.json pins %q, the tests look for %q", pkg, pins[pkg], want)
		}
	}
	if len(pins) != 4 {
		t.Errorf("package.json pins %d packages, the tests know 4: %v", len(pins), pins)
	}
}
