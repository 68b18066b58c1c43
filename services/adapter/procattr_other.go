//go:build !linux

package adapter

import "os/exec"

// setProcAttr applies no extra attributes outside Linux.
func setProcAttr(*exec.Cmd) {}

// killGroup kills the child process.
func killGroup(cmd *exec.Cmd) {
	if cmd.Process != nil {
		_ = cmd.Process.Kill()
	}
}
