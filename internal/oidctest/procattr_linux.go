package oidctest

import "syscall"

// procAttr makes the kernel kill Hydra if the test binary dies without
// running its cleanups (a panic, or go test's timeout), so no authorization
// server outlives its test.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
