package escape

import (
	"os/exec"
	"runtime"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// tryNamespaces tries to create namespaces (a user namespace needs no
// privilege, and hands its creator every capability over what it then
// creates), through clone and unshare, and to enter one.
func tryNamespaces(add func(string, []string, error)) {
	run := func(attr *syscall.SysProcAttr) error {
		c := exec.Command("/bin/true")
		c.SysProcAttr = attr
		return c.Run()
	}
	add("clone user namespace", nil, run(&syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER}))
	add("clone user and network namespaces", nil, run(&syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWNET}))
	add("unshare user namespace", nil, run(&syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWUSER}))
	// clone3 carries its flags in memory: given none (size 0), it fails
	// at once where it exists (EINVAL), and never starts a process.
	_, _, errno := unix.Syscall(unix.SYS_CLONE3, 0, 0, 0)
	add("clone3", nil, errnoErr(errno))
	fd, err := unix.Open("/proc/self/ns/user", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err == nil {
		err = unix.Setns(fd, 0)
		_ = unix.Close(fd)
	}
	add("setns", nil, err)
}

// trySyscalls tries the system calls a tool server has no use for.
func trySyscalls(add func(string, []string, error)) {
	add("mount", nil, unix.Mount("escape", "/tmp", "tmpfs", 0, ""))
	add("ptrace", nil, ptraceChild())
	_, err := unix.AddKey("user", "escape", []byte("x"), unix.KEY_SPEC_PROCESS_KEYRING)
	add("add_key", nil, err)
	_, err = unix.KeyctlGetKeyringID(unix.KEY_SPEC_SESSION_KEYRING, false)
	add("keyctl", nil, err)
	attr := unix.PerfEventAttr{Type: unix.PERF_TYPE_SOFTWARE, Config: unix.PERF_COUNT_SW_CPU_CLOCK, Size: uint32(unsafe.Sizeof(unix.PerfEventAttr{}))}
	fd, err := unix.PerfEventOpen(&attr, 0, -1, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err == nil {
		_ = unix.Close(fd)
	}
	add("perf_event_open", nil, err)
	// An array map: what an unprivileged bpf() would start with.
	mapAttr := [5]uint32{unix.BPF_MAP_TYPE_ARRAY, 4, 4, 1, 0}
	r, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_MAP_CREATE, uintptr(unsafe.Pointer(&mapAttr)), unsafe.Sizeof(mapAttr))
	if errno == 0 {
		_ = unix.Close(int(r))
	}
	add("bpf", nil, errnoErr(errno))
	_, _, errno = unix.Syscall6(unix.SYS_KEXEC_LOAD, 0, 0, 0, 0, 0, 0)
	add("kexec_load", nil, errnoErr(errno))
	add("init_module", nil, unix.InitModule(nil, ""))
	var params [120]byte // struct io_uring_params
	r, _, errno = unix.Syscall(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&params)), 0)
	if errno == 0 {
		_ = unix.Close(int(r))
	}
	add("io_uring_setup", nil, errnoErr(errno))
}

// ptraceChild attaches to a child of its own: what the kernel allows any
// process over its descendants of the same uid.
func ptraceChild() error {
	c := exec.Command("/bin/sleep", "30")
	if err := c.Start(); err != nil {
		return err
	}
	defer func() {
		_ = c.Process.Kill()
		_ = c.Wait()
	}()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.PtraceAttach(c.Process.Pid); err != nil {
		return err
	}
	_ = unix.PtraceDetach(c.Process.Pid)
	return nil
}

func errnoErr(errno syscall.Errno) error {
	if errno == 0 {
		return nil
	}
	return errno
}
