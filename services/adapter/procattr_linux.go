package adapter

import (
	"os/exec"
	"syscall"
)

// setProcAttr puts the child in its own process group (so it and its
// descendants can be killed together) and has the kernel kill it if the
// adapter dies.
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// killGroup kills the child's whole process group.
func killGroup(cmd *exec.Cmd) {
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}
