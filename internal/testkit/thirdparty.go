package testkit

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Pinned third-party MCP servers: the versions in
// scripts/npm/third-party-mcp/package.json (a test holds them equal),
// which scripts/third-party-mcp.sh installs into a directory named for
// every version.
const (
	EverythingVersion = "2026.8.31"
	FilesystemVersion = "2026.8.31"
	MemoryVersion     = "2026.8.31"
	// TimeMCPVersion is the community server time-mcp, which prints a
	// banner line on stdout before it speaks JSON-RPC.
	TimeMCPVersion = "1.0.6"
)

// ThirdPartyMCP returns the installed servers' node_modules/@modelcontextprotocol
// directory (server-everything, server-filesystem, server-memory). Without
// an install or node it skips loudly, or fails in CI.
func ThirdPartyMCP(t testing.TB) string {
	t.Helper()
	return filepath.Join(thirdPartyInstall(t), "node_modules", "@modelcontextprotocol")
}

// TimeMCP returns the installed time-mcp's entry script, for node to
// run. Without an install or node it skips loudly, or fails in CI.
func TimeMCP(t testing.TB) string {
	t.Helper()
	return filepath.Join(thirdPartyInstall(t), "node_modules", "time-mcp", "dist", "index.js")
}

// thirdPartyInstall returns the install directory of every pinned
// server, reachable by the uids local servers run under.
func thirdPartyInstall(t testing.TB) string {
	t.Helper()
	NeedsExternal(t, "Node and the pinned third-party MCP servers (make third-party-mcp)")
	cache := os.Getenv("V0M3_NPM_CACHE")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			t.Fatal(err)
		}
		cache = filepath.Join(home, ".cache", "v0m3", "npm")
	}
	dir := filepath.Join(cache, "everything-"+EverythingVersion+"_filesystem-"+FilesystemVersion+"_memory-"+MemoryVersion+"_time-mcp-"+TimeMCPVersion)
	_, statErr := os.Stat(filepath.Join(dir, ".installed"))
	_, nodeErr := exec.LookPath("node")
	if statErr != nil || nodeErr != nil {
		msg := "third-party MCP servers are not installed (" + dir + ") or node is missing: run scripts/third-party-mcp.sh"
		if os.Getenv("CI") != "" {
			t.Fatal(msg + " (CI must run these tests)")
		}
		t.Skip("!!! SKIPPING THIRD-PARTY MCP SERVER TESTS: " + msg)
	}
	if os.Geteuid() == 0 {
		dir = reachableCopy(t, dir)
	}
	return dir
}

// reachableCopy copies the install into a directory every uid may
// read. A root adapter runs each local server under a uid of its own,
// and the install usually lies under root's 0700 home: the servers must be
// reachable by their uid, as in production.
func reachableCopy(t testing.TB, dir string) string {
	t.Helper()
	dst := ReachableDir(t)
	out := filepath.Join(dst, filepath.Base(dir))
	if b, err := exec.Command("cp", "-a", dir, dst).CombinedOutput(); err != nil {
		t.Fatalf("copy the third-party servers: %v: %s", err, b)
	}
	if b, err := exec.Command("chmod", "-R", "go+rX", out).CombinedOutput(); err != nil {
		t.Fatalf("open the third-party servers to every uid: %v: %s", err, b)
	}
	return out
}

// PackagePins returns the dependencies the package.json in dir pins, after
// checking that its package-lock.json locks the same (npm ci would refuse
// to install otherwise).
func PackagePins(t testing.TB, dir string) map[string]string {
	t.Helper()
	var pkg struct {
		Dependencies map[string]string `json:"dependencies"`
	}
	var lock struct {
		Packages map[string]struct {
			Version      string            `json:"version"`
			Dependencies map[string]string `json:"dependencies"`
		} `json:"packages"`
	}
	for name, v := range map[string]any{"package.json": &pkg, "package-lock.json": &lock} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	for name, version := range pkg.Dependencies {
		if got := lock.Packages[""].Dependencies[name]; got != version {
			t.Errorf("%s: package.json pins %q, package-lock.json's root %q", name, version, got)
		}
		if got := lock.Packages["node_modules/"+name].Version; got != version {
			t.Errorf("%s: package.json pins %q, package-lock.json installs %q", name, version, got)
		}
	}
	return pkg.Dependencies
}
