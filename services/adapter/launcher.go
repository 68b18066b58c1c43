package adapter

import "sync/atomic"

// launcherWired records that this binary's main (or TestMain) asked
// IsSandboxLaunch first thing: only then may the adapter re-execute its
// own executable as the sandbox launcher. A binary that never asks would
// run its whole main (or its tests) again in place of the launcher, so
// the adapter refuses to start a local server there instead.
var launcherWired atomic.Bool

// IsSandboxLaunch reports whether this process is the adapter's own
// executable re-executed as the sandbox launcher of one local server (see
// sandbox_linux.go). Every binary that may run an adapter calls it first
// thing in main, and every test binary that runs one in TestMain:
//
//	if adapter.IsSandboxLaunch() {
//		adapter.RunSandboxLaunch() // never returns
//	}
//
// Asking is also what lets this process start local servers at all.
func IsSandboxLaunch() bool {
	launcherWired.Store(true)
	return isLauncher()
}

// RunSandboxLaunch runs the sandbox launcher (it reads its spec, takes the
// server's identity and limits, and executes the server) and exits the
// process; it never returns. Call it only when IsSandboxLaunch is true.
func RunSandboxLaunch() {
	runLauncherAndExit()
}
