package adapter

import (
	"errors"
	"fmt"
	"runtime"
	"syscall"
	"unsafe"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// refusedSyscalls are the system calls a tool server has no use for and
// that widen what a compromised one can reach: creating or entering
// namespaces (a user namespace hands it capabilities over new mounts and
// the kernel surface behind them), mounting, tracing other processes or
// reading their memory, loading kernels, modules or BPF programs, the
// kernel keyring, performance counters, and the rest of the host
// administration calls. Each is refused with EPERM. Names a platform
// lacks are skipped.
var refusedSyscalls = []string{
	"unshare", "setns",
	"mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
	"ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp",
	"kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
	"bpf", "perf_event_open", "userfaultfd",
	"keyctl", "add_key", "request_key",
	"reboot", "swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "syslog",
	"open_by_handle_at", "iopl", "ioperm", "uselib", "vhangup", "lookup_dcookie",
	"settimeofday", "clock_settime", "clock_adjtime",
}

// enosysSyscalls are refused as absent (ENOSYS) rather than forbidden, so
// C libraries and runtimes fall back to what the filter can check: clone3
// passes its flags in memory a filter cannot read (glibc then uses clone,
// whose flags it can), and io_uring performs operations no filter sees
// (libuv then uses its thread pool).
var enosysSyscalls = []string{"clone3", "io_uring_setup", "io_uring_enter", "io_uring_register"}

// cloneNamespaceFlags are the clone flags that create namespaces.
const cloneNamespaceFlags = unix.CLONE_NEWNS | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWUSER |
	unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWCGROUP | unix.CLONE_NEWTIME

// seccompPolicy is the filter every local server runs under: everything
// not refused above is allowed (a tool server may be any program).
func seccompPolicy() (seccomp.Policy, error) {
	info, err := arch.GetInfo("")
	if err != nil {
		return seccomp.Policy{}, err
	}
	known := func(names []string) []string {
		var out []string
		for _, n := range names {
			if _, ok := info.SyscallNames[n]; ok {
				out = append(out, n)
			}
		}
		return out
	}
	return seccomp.Policy{
		DefaultAction: seccomp.ActionAllow,
		Syscalls: []seccomp.SyscallGroup{
			{Action: seccomp.ActionErrno, Names: known(refusedSyscalls), NamesWithCondtions: []seccomp.NameWithConditions{
				// clone's flags are its first argument on amd64 and arm64
				// (the platforms the adapter ships for).
				{Name: "clone", Conditions: seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.BitsSet, Value: cloneNamespaceFlags}}},
			}},
			{Action: seccomp.ActionErrno | seccomp.Action(unix.ENOSYS), Names: known(enosysSyscalls)},
		},
	}, nil
}

// loadSeccomp installs the filter on every thread of the calling process
// (it is inherited across exec). It needs no_new_privs (or CAP_SYS_ADMIN).
func loadSeccomp() error {
	if runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64" {
		return syscall.ENOSYS
	}
	policy, err := seccompPolicy()
	if err != nil {
		return err
	}
	if err := seccomp.LoadFilter(seccomp.Filter{Flag: seccomp.FilterFlagTSync, Policy: policy}); err != nil {
		var errno syscall.Errno
		if errors.As(err, &errno) {
			return errno
		}
		return err
	}
	// The policy allows, unfiltered, every call made through another
	// architecture's entry point (the 32-bit one on amd64), where the
	// refused calls have other numbers: a second filter refuses them all.
	return loadNativeOnly()
}

// auditArch is the audit architecture of the adapter's own platform.
func auditArch() uint32 {
	if runtime.GOARCH == "arm64" {
		return unix.AUDIT_ARCH_AARCH64
	}
	return unix.AUDIT_ARCH_X86_64
}

// loadNativeOnly installs a filter refusing (ENOSYS) every system call
// made through another architecture than the adapter's own.
func loadNativeOnly() error {
	raw, err := bpf.Assemble([]bpf.Instruction{
		bpf.LoadAbsolute{Off: 4, Size: 4}, // seccomp_data.arch
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: auditArch(), SkipTrue: 1},
		bpf.RetConstant{Val: unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)},
		bpf.RetConstant{Val: unix.SECCOMP_RET_ALLOW},
	})
	if err != nil {
		return fmt.Errorf("assemble: %w", err)
	}
	filter := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		filter[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	_, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&prog)))
	if errno != 0 {
		return errno
	}
	return nil
}
