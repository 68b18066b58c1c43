package testkit

import (
	"os"
	"testing"
)

// HostTestsEnv is the environment variable that opts in to tests which
// change this host (the real node's iptables rules, /etc/hosts block,
// bridge and sysctls). The Makefile sets it to 1 when CI is set.
const HostTestsEnv = "V0M3_HOST_TESTS"

// NeedsExternal marks t as needing part: a program or build that `go test`
// alone does not provide and a make target installs or builds, named with
// that target (e.g. "redis-server (make redis)"). Under -short (make unit:
// the fast loop that needs nothing installed) it skips t with one line
// saying so; otherwise it returns and the caller looks the part up, which
// skips loudly when it is missing, or fails when CI is set.
//
// Call it before looking the part up: a lookup may build it (envtest) or
// run a script, which the fast loop must not wait for.
func NeedsExternal(t testing.TB, part string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("-short (make unit) skips this: it needs %s; make test runs it", part)
	}
}

// ChangesHost marks t as changing this host outside its own files and
// processes: what names the changes (e.g. "iptables rules, a bridge,
// sysctls"). Outside CI such a test runs only when the person opted in with
// V0M3_HOST_TESTS=1; otherwise it skips with a message saying how. Under
// CI (CI set) the opt-in is required too, and its absence fails the test:
// the Makefile sets it, so a CI that does not run these tests fails rather
// than looking green.
func ChangesHost(t testing.TB, what string) {
	t.Helper()
	if os.Getenv(HostTestsEnv) == "1" {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("CI is set but %s is not 1: this test changes the host (%s) and CI must run it (make sets %s=1 under CI)", HostTestsEnv, what, HostTestsEnv)
	}
	t.Skipf("SKIPPED: this test changes this host (%s); run it with %s=1 (e.g. %s=1 make test) to opt in", what, HostTestsEnv, HostTestsEnv)
}
