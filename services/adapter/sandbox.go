package adapter

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
)

// SandboxConfig says how local (stdio) servers are isolated from the
// adapter and from each other. The zero value is the default: a dedicated
// uid per connection when the adapter runs as root, a user namespace
// otherwise.
type SandboxConfig struct {
	// UIDs is the range of host uids from which each connection gets one
	// of its own (its gid is the same number) when the adapter runs as
	// root: claimed on the connection's first run and kept for it, so
	// files a server keeps between runs stay its own, and no other
	// connection's server shares it. The range must be reserved for the
	// adapter on the host: processes found running under a uid no run
	// holds are leftovers and are killed. Adapters on one host share
	// claims through LockDir. Zero means DefaultSandboxUIDs.
	UIDs UIDRange
	// SharedIdentity runs local servers under the adapter's own host uid
	// (unprivileged inside a user namespace of their own) even when the
	// adapter is root. They can then reach the adapter's data directory
	// and signal the adapter and each other, and the record says so
	// (NOT_ENFORCED); as host root they also have no process limit. For
	// development hosts where servers need files only the adapter's user
	// can reach.
	SharedIdentity bool
	// MaxProcesses is each local server's process limit (RLIMIT_NPROC):
	// processes and threads its identity may have at once (concurrent runs
	// of one connection share it). Zero means DefaultMaxProcesses.
	MaxProcesses uint32
	// LockDir holds the claims of dedicated uids, a file per uid naming its
	// connection, and their locks. It must be owned by root, is made mode
	// 0700, and should persist across reboots (a claim is what keeps a
	// uid, and the files left under it, with one connection). Every
	// adapter using a range must use the same LockDir. Empty means
	// DefaultSandboxLockDir.
	LockDir string
}

// UIDRange is a range of host uids: First, First+1, ..., First+Count-1.
type UIDRange struct {
	// First is the first uid of the range.
	First uint32
	// Count is the number of uids in the range.
	Count uint32
}

// DefaultSandboxUIDs is the uid range connections take their uids from
// by default: high enough to stay clear of system and login users and of
// the usual subordinate-id ranges, below 2^31 for tools that sign uids,
// and large enough that claims (which expire only after a month unused)
// do not run out.
var DefaultSandboxUIDs = UIDRange{First: 2_100_000_000, Count: 1 << 20}

// DefaultMaxProcesses is the default process limit of a local server:
// room for Node's or Go's runtime threads and a few helpers, not for a
// fork bomb.
const DefaultMaxProcesses = 128

// DefaultSandboxLockDir is where uid claims live by default.
const DefaultSandboxLockDir = "/var/lib/v0m3/sandbox-uids"

// withDefaults fills the zero fields of c.
func (c SandboxConfig) withDefaults() SandboxConfig {
	if c.UIDs.Count == 0 {
		c.UIDs = DefaultSandboxUIDs
	}
	if c.MaxProcesses == 0 {
		c.MaxProcesses = DefaultMaxProcesses
	}
	if c.LockDir == "" {
		c.LockDir = DefaultSandboxLockDir
	}
	return c
}

// launchSpec is one local server to start.
type launchSpec struct {
	path string
	args []string
	env  []string
	// connID is the connection whose server this is.
	connID string
	// connDir is the connection's directory under the data dir; the run
	// gets a fresh working directory inside it.
	connDir string
	stdin   *os.File
	stdout  *os.File
}

// sandboxed is a started local server.
type sandboxed struct {
	cmd *exec.Cmd
	// done must be called once the process has exited and was waited
	// for: it ends whatever the server left running under its identity,
	// frees the identity and removes the run's working directory.
	done func()
}

// sandboxError is a failure to start a server in its sandbox, in the
// adapter's own words: it names a step, a directory or a uid, never the
// command's arguments or environment, so it may be returned and logged.
type sandboxError struct {
	msg   string
	errno syscall.Errno // 0 when there is none
	// setup says the sandbox itself could not be set up (as opposed to
	// the server's executable failing to run in it): a configuration or
	// host problem that retrying does not fix.
	setup bool
}

func (e *sandboxError) Error() string { return e.msg }

func (e *sandboxError) Unwrap() error {
	if e.errno == 0 {
		return nil
	}
	return e.errno
}

// setupFailed is a sandboxError for a failure to prepare the sandbox.
func setupFailed(format string, args ...any) *sandboxError {
	err := fmt.Errorf(format, args...)
	se := &sandboxError{msg: "sandbox: " + err.Error(), setup: true}
	_ = errors.As(err, &se.errno)
	return se
}

// launchFailed is a sandboxError for a launcher step that failed; uid is
// the server's dedicated uid, or -1.
func launchFailed(step string, errno syscall.Errno, uid int) *sandboxError {
	msg := fmt.Sprintf("sandbox %s: %v", step, errno)
	if uid >= 0 && (errno == syscall.EACCES || errno == syscall.EPERM) {
		msg += fmt.Sprintf(" (the server runs as its own uid %d: its executable and every file it needs must be reachable by that uid)", uid)
	}
	return &sandboxError{msg: msg, errno: errno, setup: step != "exec"}
}

// isSandboxSetup reports whether err is a sandbox setup failure.
func isSandboxSetup(err error) bool {
	_, ok := sandboxSetupError(err)
	return ok
}

// sandboxSetupError returns err's sandbox setup failure, if it is one.
func sandboxSetupError(err error) (*sandboxError, bool) {
	var se *sandboxError
	if errors.As(err, &se) && se.setup {
		return se, true
	}
	return nil, false
}

// prepareDataDir makes the adapter's data directory exist, belong to the
// adapter and be closed to everyone else (0700), so a local server under
// its own uid can neither list, read nor write it: it reaches only its own
// working directory, which the launcher enters for it.
func prepareDataDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return setupFailed("create data directory: %w", err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return setupFailed("data directory: %w", err)
	}
	if !fi.IsDir() {
		return setupFailed("data directory %s is not a directory", dir)
	}
	if uid, ok := fileOwner(fi); ok && uid != os.Geteuid() {
		return setupFailed("data directory %s belongs to uid %d, not to the adapter (uid %d)", dir, uid, os.Geteuid())
	}
	if fi.Mode().Perm() != 0o700 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return setupFailed("close data directory: %w", err)
		}
	}
	return nil
}
