//go:build !linux

package oidctest

import "syscall"

// procAttr has no parent-death signal to ask for outside Linux; cleanups
// stop Hydra.
func procAttr() *syscall.SysProcAttr { return nil }
