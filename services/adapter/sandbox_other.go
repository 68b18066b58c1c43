//go:build !linux

package adapter

import (
	"fmt"
	"log/slog"
	"os"
	"os/exec"

	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// sandboxer starts local servers. Outside Linux the adapter applies no
// isolation, identity or limits, and records exactly that.
type sandboxer struct {
	dataDir string
}

func newSandboxer(_ SandboxConfig, dataDir string, _ *slog.Logger) *sandboxer {
	return &sandboxer{dataDir: dataDir}
}

// start starts sp under the adapter's own identity in a fresh working
// directory and says that nothing else was enforced.
func (sx *sandboxer) start(sp launchSpec) (*sandboxed, *registryv1.SandboxConstraints, error) {
	if err := prepareDataDir(sx.dataDir); err != nil {
		return nil, nil, err
	}
	if err := os.MkdirAll(sp.connDir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("create working directory: %w", err)
	}
	dir, err := os.MkdirTemp(sp.connDir, "run-")
	if err != nil {
		return nil, nil, fmt.Errorf("create working directory: %w", err)
	}
	cmd := &exec.Cmd{Path: sp.path, Args: sp.args, Env: sp.env, Dir: dir, Stdin: sp.stdin, Stdout: sp.stdout}
	if err := cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, nil, err
	}
	no := registryv1.Enforcement_ENFORCEMENT_NOT_ENFORCED
	sb := &registryv1.SandboxConstraints{
		Network:          registryv1.NetworkIsolation_NETWORK_ISOLATION_NOT_ENFORCED,
		Identity:         &registryv1.SandboxIdentity{Kind: registryv1.IdentityKind_IDENTITY_KIND_NOT_ENFORCED, Uid: uint32(max(os.Geteuid(), 0)), Gid: uint32(max(os.Getegid(), 0))},
		ProcessIsolation: no,
		DataDirIsolation: no,
		ProcessLimit:     no,
		PidNamespace:     no,
		MountNamespace:   no,
		Seccomp:          no,
		OwnHome:          no,
	}
	return &sandboxed{cmd: cmd, done: func() { _ = os.RemoveAll(dir) }}, sb, nil
}

// fileOwner reports no owner: outside Linux the data directory's owner is
// not checked (nothing is isolated there anyway).
func fileOwner(os.FileInfo) (int, bool) { return 0, false }

// killGroup kills the child process.
func killGroup(cmd *exec.Cmd) {
	if cmd.Process != nil {
		_ = cmd.Process.Kill()
	}
}

// isLauncher is false: outside Linux the adapter starts servers directly,
// never through a launcher.
func isLauncher() bool { return false }

// runLauncherAndExit is never reached outside Linux (isLauncher is false).
func runLauncherAndExit() {
	fmt.Fprintln(os.Stderr, "v0m3: the sandbox launcher runs only on Linux")
	os.Exit(2)
}
