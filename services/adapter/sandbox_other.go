//go:build !linux

package adapter

import (
	"os/exec"

	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// startSandboxed starts the command without network isolation or resource
// limits (outside Linux the adapter applies neither) and says so.
func startSandboxed(newCmd func() *exec.Cmd) (*exec.Cmd, *registryv1.SandboxConstraints, error) {
	cmd := newCmd()
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	return cmd, &registryv1.SandboxConstraints{Network: registryv1.NetworkIsolation_NETWORK_ISOLATION_NOT_ENFORCED}, nil
}

// killGroup kills the child process.
func killGroup(cmd *exec.Cmd) {
	if cmd.Process != nil {
		_ = cmd.Process.Kill()
	}
}
