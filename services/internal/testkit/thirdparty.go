package testkit

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Pinned third-party MCP servers; keep in step with
// scripts/third-party-mcp.sh, which installs them into a directory named
// for every version.
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
