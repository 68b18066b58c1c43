package adapter

import (
	"errors"
	"os"
	"os/exec"
	"syscall"

	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"golang.org/x/sys/unix"
)

// rlimit is one resource limit applied to a local server.
type rlimit struct {
	name     string
	resource int
	value    uint64
	text     string
}

// childLimits are the resource limits of every local server. RLIMIT_AS is
// generous enough for Node (V8 reserves address space up front) and still
// bounds a runaway server; RLIMIT_FSIZE bounds any file it writes into its
// working directory (or anywhere else).
var childLimits = []rlimit{
	{"RLIMIT_AS", unix.RLIMIT_AS, 2 << 30, "2GiB"},
	{"RLIMIT_NOFILE", unix.RLIMIT_NOFILE, 256, "256"},
	{"RLIMIT_FSIZE", unix.RLIMIT_FSIZE, 64 << 20, "64MiB"},
	{"RLIMIT_CPU", unix.RLIMIT_CPU, 600, "600s"},
}

// startSandboxed starts the command newCmd builds in its own process group
// (so it and its descendants are killed together), killed by the kernel if
// the adapter dies, and in a new network namespace without interfaces when
// the kernel permits it (with a user namespace when the adapter is not
// root). If the kernel refuses the namespaces, the server starts with the
// host's network and that is recorded as not enforced. Resource limits are
// applied to the started process; it runs without them only for the
// instant between exec and prlimit.
//
// It returns the started command and the constraints actually applied
// (working_dir and minimal_environment are the caller's to fill in).
func startSandboxed(newCmd func() *exec.Cmd) (*exec.Cmd, *registryv1.SandboxConstraints, error) {
	sb := &registryv1.SandboxConstraints{Network: registryv1.NetworkIsolation_NETWORK_ISOLATION_ENFORCED}
	cmd := newCmd()
	cmd.SysProcAttr = isolatedAttr()
	err := cmd.Start()
	if err != nil && namespaceRefused(err) {
		sb.Network = registryv1.NetworkIsolation_NETWORK_ISOLATION_NOT_ENFORCED
		cmd = newCmd()
		cmd.SysProcAttr = baseAttr()
		err = cmd.Start()
	}
	if err != nil {
		return nil, nil, err
	}
	pid := cmd.Process.Pid
	for _, l := range childLimits {
		var cur unix.Rlimit
		if err := unix.Prlimit(pid, l.resource, nil, &cur); err != nil {
			continue
		}
		// Lower, never raise: a limit already below ours stays.
		next := unix.Rlimit{Cur: min(cur.Cur, l.value), Max: min(cur.Max, l.value)}
		if err := unix.Prlimit(pid, l.resource, &next, nil); err != nil {
			continue
		}
		sb.ResourceLimits = append(sb.ResourceLimits, l.name+"="+l.text)
	}
	return cmd, sb, nil
}

func baseAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// isolatedAttr adds a new network namespace, and a user namespace that maps
// the adapter's own ids when it lacks the privilege to create one alone.
func isolatedAttr() *syscall.SysProcAttr {
	a := baseAttr()
	a.Cloneflags = syscall.CLONE_NEWNET
	if uid := os.Geteuid(); uid != 0 {
		gid := os.Getegid()
		a.Cloneflags |= syscall.CLONE_NEWUSER
		a.UidMappings = []syscall.SysProcIDMap{{ContainerID: uid, HostID: uid, Size: 1}}
		a.GidMappings = []syscall.SysProcIDMap{{ContainerID: gid, HostID: gid, Size: 1}}
		a.GidMappingsEnableSetgroups = false
	}
	return a
}

// namespaceRefused reports whether a start failed because the kernel (or a
// seccomp profile) refused to create the namespaces.
func namespaceRefused(err error) bool {
	return errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EINVAL) ||
		errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EUSERS) || errors.Is(err, syscall.ENOSYS)
}

// killGroup kills the child's whole process group.
func killGroup(cmd *exec.Cmd) {
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}
