package adapter

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

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

// childLimits are the resource limits of every local server besides its
// process limit. RLIMIT_AS is generous enough for Node (V8 reserves
// address space up front) and still bounds a runaway server; RLIMIT_FSIZE
// bounds any file it writes into its working directory (or anywhere
// else).
var childLimits = []rlimit{
	{"RLIMIT_AS", unix.RLIMIT_AS, 2 << 30, "2GiB"},
	{"RLIMIT_NOFILE", unix.RLIMIT_NOFILE, 256, "256"},
	{"RLIMIT_FSIZE", unix.RLIMIT_FSIZE, 64 << 20, "64MiB"},
	{"RLIMIT_CPU", unix.RLIMIT_CPU, 600, "600s"},
}

// nprocName names the process limit in the launcher's report.
const nprocName = "RLIMIT_NPROC"

// namespaceUID is the uid a server has inside its user namespace when it
// shares the adapter's host uid: unprivileged there, so it holds no
// capability even over its own namespaces once it runs.
const namespaceUID = 65534

// launchTimeout bounds how long the launcher may take to reach exec.
const launchTimeout = 10 * time.Second

// sandboxer starts local servers in their sandbox. Every server is started
// through the launcher: the adapter's own executable, re-executed, which
// enters the server's working directory, takes its identity, sets its
// limits and only then executes it, so no instruction of the server runs
// without them.
type sandboxer struct {
	cfg     SandboxConfig
	dataDir string
	log     *slog.Logger
}

func newSandboxer(cfg SandboxConfig, dataDir string, log *slog.Logger) *sandboxer {
	return &sandboxer{cfg: cfg.withDefaults(), dataDir: dataDir, log: log}
}

// start starts sp in a sandbox and returns it with the constraints
// actually applied (working_dir and minimal_environment are the caller's
// to fill in).
//
// As root (unless SharedIdentity), the server runs as its connection's own
// uid and gid (see leaseUID), in a new network namespace without
// interfaces when the kernel permits it. Otherwise it runs in a new user
// namespace (unprivileged inside, the adapter's uid outside) and network
// namespace. A refused namespace is recorded as not enforced; a root
// adapter never runs a server as root, so without a dedicated uid or a
// user namespace it refuses to start one.
func (sx *sandboxer) start(sp launchSpec) (*sandboxed, *registryv1.SandboxConstraints, error) {
	if !launcherWired.Load() {
		return nil, nil, setupFailed("this binary does not run the sandbox launcher: its main (or TestMain) must call adapter.IsSandboxLaunch first")
	}
	if err := prepareDataDir(sx.dataDir); err != nil {
		return nil, nil, err
	}
	if err := os.MkdirAll(sp.connDir, 0o700); err != nil {
		return nil, nil, setupFailed("create working directory: %w", err)
	}
	dir, err := os.MkdirTemp(sp.connDir, "run-")
	if err != nil {
		return nil, nil, setupFailed("create working directory: %w", err)
	}
	euid := os.Geteuid()
	dedicated := euid == 0 && !sx.cfg.SharedIdentity
	var lease *uidLease
	if dedicated {
		if r := sx.cfg.UIDs; r.First == 0 || r.First+r.Count < r.First {
			_ = os.RemoveAll(dir)
			return nil, nil, setupFailed("sandbox uid range %d+%d must exclude root and fit in 32 bits", r.First, r.Count)
		}
		if lease, err = leaseUID(sx.cfg.UIDs, sx.cfg.LockDir, sp.connID); err != nil {
			_ = os.RemoveAll(dir)
			return nil, nil, err
		}
		if err := os.Chown(dir, int(lease.uid), int(lease.uid)); err != nil {
			sx.releaseUID(lease)
			_ = os.RemoveAll(dir)
			return nil, nil, setupFailed("give the working directory to the server's uid: %w", err)
		}
	}
	// The run's own home, temporary and XDG directories, inside its
	// working directory (so removed with it).
	owner := -1
	if dedicated {
		owner = int(lease.uid)
	}
	home, env, err := runDirs(dir, owner, sp.env)
	if err != nil {
		if lease != nil {
			sx.releaseUID(lease)
		}
		_ = os.RemoveAll(dir)
		return nil, nil, err
	}
	spec := launcherSpec{Path: sp.path, Args: sp.args, Env: env, Dir: dir, Parent: os.Getpid(), Seccomp: true}
	if dedicated {
		spec.SetID, spec.UID, spec.GID = true, lease.uid, lease.uid
	}
	// The mounts of the server's own mount namespace, when it gets one.
	// Its private directories belong to the server: its dedicated uid, or
	// its uid inside its user namespace.
	mountOwner := uint32(namespaceUID)
	if dedicated {
		mountOwner = lease.uid
	}
	mounts := &launcherMounts{Private: privateDirs, Owner: mountOwner, DataDir: sx.dataDir, RunDir: dir,
		Binds: configuredPaths(privateDirs, sx.dataDir, sp.path, sp.args, env)}
	for _, l := range childLimits {
		spec.Limits = append(spec.Limits, launcherLimit{Name: l.name, Resource: l.resource, Value: l.value})
	}
	spec.Limits = append(spec.Limits, launcherLimit{Name: nprocName, Resource: unix.RLIMIT_NPROC, Value: uint64(sx.cfg.MaxProcesses)})

	done := func() {
		_ = os.RemoveAll(dir)
		if lease != nil {
			sx.releaseUID(lease)
		}
	}
	sb := &registryv1.SandboxConstraints{}
	// Each attempt is tried in turn while the kernel refuses namespaces
	// (or, inside them, the mounts): first every namespace, then without
	// the network namespace, then the network namespace alone, then none.
	type attempt struct {
		network, isolate bool // a network namespace; PID, mount and IPC namespaces
		userns           bool
	}
	var attempts []attempt
	for _, userns := range []bool{!dedicated, false} {
		if !userns && !dedicated && euid == 0 {
			break // a root adapter never runs a server as root
		}
		attempts = append(attempts, attempt{true, true, userns}, attempt{false, true, userns}, attempt{true, false, userns}, attempt{false, false, userns})
		if dedicated {
			break
		}
	}
	var (
		cmd    *exec.Cmd
		report *launchReport
		used   attempt
	)
	for i, a := range attempts {
		var flags uintptr
		if a.network {
			flags |= syscall.CLONE_NEWNET
		}
		spec.Mounts, spec.PIDNamespace = nil, false
		if a.isolate {
			flags |= syscall.CLONE_NEWPID | syscall.CLONE_NEWNS | syscall.CLONE_NEWIPC
			spec.Mounts, spec.PIDNamespace = mounts, true
		}
		attr := withClone(flags)
		if a.userns {
			attr = userNamespace(flags)
			if a.isolate {
				// The launcher is unprivileged in its user namespace:
				// it keeps CAP_SYS_ADMIN there across its own exec to
				// make the mounts, and clears it before the server's.
				attr.AmbientCaps = []uintptr{unix.CAP_SYS_ADMIN}
			}
		}
		cmd, report, err = launch(attr, &spec, sp.stdin, sp.stdout)
		if err == nil {
			used = a
			break
		}
		if namespaceRefused(err) && i < len(attempts)-1 {
			sx.log.Debug("the kernel refused a sandbox namespace; trying with fewer", "connection_id", sp.connID, "error", err)
		}
		if !namespaceRefused(err) || i == len(attempts)-1 {
			done()
			if !dedicated && euid == 0 && namespaceRefused(err) {
				return nil, nil, setupFailed("the kernel refused a user namespace and the adapter runs as root with a shared identity: a local server never runs as root")
			}
			var lf *launcherFailure
			if errors.As(err, &lf) {
				uid := -1
				if dedicated {
					uid = int(lease.uid)
				}
				return nil, nil, launchFailed(lf.step, lf.errno, uid)
			}
			return nil, nil, err
		}
	}

	notEnforced := registryv1.Enforcement_ENFORCEMENT_NOT_ENFORCED
	enforced := registryv1.Enforcement_ENFORCEMENT_ENFORCED
	sb.ProcessIsolation, sb.DataDirIsolation, sb.ProcessLimit = notEnforced, notEnforced, notEnforced
	sb.PidNamespace, sb.MountNamespace, sb.Seccomp, sb.OwnHome = notEnforced, notEnforced, notEnforced, notEnforced
	sb.Network = registryv1.NetworkIsolation_NETWORK_ISOLATION_NOT_ENFORCED
	if used.network {
		sb.Network = registryv1.NetworkIsolation_NETWORK_ISOLATION_ENFORCED
	}
	if used.isolate {
		sb.PidNamespace, sb.MountNamespace = enforced, enforced
	}
	if report.seccomp {
		sb.Seccomp = enforced
	}
	// A dedicated uid reaches its run directory (and so its home) only
	// through its own mount namespace: the data directory above it is
	// closed to it. Sharing the adapter's host uid, it reaches it anyway.
	if !dedicated || used.isolate {
		sb.OwnHome, sb.Home = enforced, home
	}
	userns := used.userns
	sb.AppliedBeforeExec = true
	sb.NoNewPrivileges = report.noNewPrivs
	switch {
	case dedicated:
		sb.Identity = &registryv1.SandboxIdentity{Kind: registryv1.IdentityKind_IDENTITY_KIND_DEDICATED_UID, Uid: lease.uid, Gid: lease.uid,
			RangeFirstUid: sx.cfg.UIDs.First, RangeUidCount: sx.cfg.UIDs.Count}
		sb.ProcessIsolation = registryv1.Enforcement_ENFORCEMENT_ENFORCED
		sb.DataDirIsolation = registryv1.Enforcement_ENFORCEMENT_ENFORCED
	case userns:
		sb.Identity = &registryv1.SandboxIdentity{Kind: registryv1.IdentityKind_IDENTITY_KIND_USER_NAMESPACE, Uid: uint32(euid), Gid: uint32(os.Getegid()), NamespaceUid: namespaceUID}
	default:
		sb.Identity = &registryv1.SandboxIdentity{Kind: registryv1.IdentityKind_IDENTITY_KIND_NOT_ENFORCED, Uid: uint32(euid), Gid: uint32(os.Getegid())}
	}
	for _, l := range childLimits {
		if report.limits[l.name] {
			sb.ResourceLimits = append(sb.ResourceLimits, l.name+"="+l.text)
		}
	}
	// The kernel does not count host root against RLIMIT_NPROC, so a
	// server sharing a root adapter's uid has no process limit.
	hostUID := euid
	if dedicated {
		hostUID = int(lease.uid)
	}
	if report.limits[nprocName] && hostUID != 0 {
		sb.ProcessLimit, sb.MaxProcesses = registryv1.Enforcement_ENFORCEMENT_ENFORCED, sx.cfg.MaxProcesses
	}
	return &sandboxed{cmd: cmd, done: done}, sb, nil
}

// releaseUID ends a run's hold on its connection's uid.
func (sx *sandboxer) releaseUID(l *uidLease) {
	if !l.release() {
		sx.log.Warn("processes a local server left under its uid survived being killed; its connection's servers stay stopped until they end", "uid", l.uid)
	}
}

func baseAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

func withClone(flags uintptr) *syscall.SysProcAttr {
	a := baseAttr()
	a.Cloneflags = flags
	return a
}

// userNamespace adds a new user namespace in which the server is
// namespaceUID, mapped to the adapter's own host ids (the only ones an
// unprivileged process may map), plus the given namespaces.
func userNamespace(flags uintptr) *syscall.SysProcAttr {
	a := withClone(syscall.CLONE_NEWUSER | flags)
	a.UidMappings = []syscall.SysProcIDMap{{ContainerID: namespaceUID, HostID: os.Geteuid(), Size: 1}}
	a.GidMappings = []syscall.SysProcIDMap{{ContainerID: namespaceUID, HostID: os.Getegid(), Size: 1}}
	a.GidMappingsEnableSetgroups = false
	return a
}

// namespaceRefused reports whether a start failed because the kernel (or a
// seccomp profile) refused to create the namespaces.
func namespaceRefused(err error) bool {
	var lf *launcherFailure
	if errors.As(err, &lf) {
		// The launcher ran: the namespaces were created, but the kernel
		// may still refuse the mounts inside them (a fresh /proc where
		// parts of the host's are masked, say).
		return lf.step == "mount"
	}
	return errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.EACCES) ||
		errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EUSERS) || errors.Is(err, syscall.ENOSYS)
}

// fileOwner returns the uid owning fi.
func fileOwner(fi os.FileInfo) (int, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return int(st.Uid), true
}

// killGroup kills the child's whole process group.
func killGroup(cmd *exec.Cmd) {
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}

// The launcher. The adapter starts its own executable (/proc/self/exe)
// with argv[0] launcherArg0, the spec on fd 3 and a status pipe on fd 4;
// main recognises it first thing (IsSandboxLaunch) and runs it
// (RunSandboxLaunch). Fed a spec, it:
//
//  1. enters the run's working directory (possible for root even where the
//     server's uid may not traverse the data directory),
//  2. drops to the server's uid and gid with no supplementary groups,
//  3. sets no_new_privs and the parent-death signal (which a uid change
//     cleared), and exits if the adapter is already gone,
//  4. sets every resource limit, and
//  5. executes the server,
//
// reporting each limit applied, then "ready", on the status pipe, which
// closes on exec. After step 4 it allocates nothing and calls only raw
// system calls: the address-space limit may be below what its own runtime
// has mapped.

// launcherArg0 marks the adapter's executable running as the launcher.
const launcherArg0 = "v0m3-sandbox-launcher"

// The launcher's descriptors: the spec it reads, the status it writes.
const (
	launcherSpecFD   = 3
	launcherStatusFD = 4
)

// maxLauncherSpec bounds the spec the launcher reads.
const maxLauncherSpec = 1 << 20

// isLauncher reports whether this process was started as the launcher.
func isLauncher() bool { return len(os.Args) > 0 && os.Args[0] == launcherArg0 }

// runLauncherAndExit runs the launcher on its spec descriptor and exits
// with its status.
func runLauncherAndExit() {
	os.Exit(runLauncher(os.NewFile(launcherSpecFD, "spec")))
}

// launcherSpec is what the launcher runs, and how.
type launcherSpec struct {
	Path   string          `json:"path"`
	Args   []string        `json:"args"`
	Env    []string        `json:"env"`
	Dir    string          `json:"dir"`
	SetID  bool            `json:"set_id"`
	UID    uint32          `json:"uid"`
	GID    uint32          `json:"gid"`
	Limits []launcherLimit `json:"limits"`
	Parent int             `json:"parent"`
	// PIDNamespace says the launcher is the first process of a PID
	// namespace of its own (its parent, outside, has no pid there).
	PIDNamespace bool `json:"pid_namespace"`
	// Mounts, when set, are made in the launcher's own mount namespace.
	Mounts *launcherMounts `json:"mounts,omitempty"`
	// Seccomp installs the server's seccomp filter.
	Seccomp bool `json:"seccomp"`
}

// launcherMounts is the view of the file system a server gets in its own
// mount namespace: a fresh /proc of its PID namespace; a fresh, private
// tmpfs on each of Private (so no directory there is shared with another
// process); the host paths its configuration names under them, bound back
// in; and the adapter's data directory replaced by an empty one in which
// only its own run directory appears, at the same path.
type launcherMounts struct {
	Private []string `json:"private"`
	// Owner is the uid and gid, as the launcher's namespace sees it, that
	// the private directories belong to: the server's.
	Owner   uint32   `json:"owner"`
	DataDir string   `json:"data_dir"`
	RunDir  string   `json:"run_dir"`
	Binds   []string `json:"binds"`
}

type launcherLimit struct {
	Name     string `json:"name"`
	Resource int    `json:"resource"`
	Value    uint64 `json:"value"`
}

// launcherFailure is a launcher step that failed.
type launcherFailure struct {
	step  string
	errno syscall.Errno
}

func (e *launcherFailure) Error() string { return e.step + ": " + e.errno.Error() }

// launchReport is what the launcher reported before it executed the
// server.
type launchReport struct {
	limits     map[string]bool
	noNewPrivs bool
	seccomp    bool
}

// launch starts the launcher with attr, hands it spec and waits until it
// executed the server (or failed to).
func launch(attr *syscall.SysProcAttr, spec *launcherSpec, stdin, stdout *os.File) (*exec.Cmd, *launchReport, error) {
	specR, specW, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	statusR, statusW, err := os.Pipe()
	if err != nil {
		closeAll(specR, specW)
		return nil, nil, err
	}
	defer closeAll(specW, statusR)
	cmd := &exec.Cmd{
		Path: "/proc/self/exe",
		Args: []string{launcherArg0},
		Env:  []string{}, // the server's environment travels in the spec
		// Stderr stays nil (/dev/null): it is untrusted free text and
		// is neither buffered nor logged.
		Stdin:       stdin,
		Stdout:      stdout,
		ExtraFiles:  []*os.File{specR, statusW},
		SysProcAttr: attr,
	}
	err = cmd.Start()
	closeAll(specR, statusW)
	if err != nil {
		return nil, nil, err
	}
	fail := func(err error) (*exec.Cmd, *launchReport, error) {
		killGroup(cmd)
		_ = cmd.Wait()
		return nil, nil, err
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return fail(err)
	}
	deadline := time.Now().Add(launchTimeout)
	_ = specW.SetWriteDeadline(deadline)
	if _, err := specW.Write(b); err != nil {
		return fail(&launcherFailure{"spec", syscall.EPIPE})
	}
	_ = specW.Close()
	_ = statusR.SetReadDeadline(deadline)
	status, err := io.ReadAll(io.LimitReader(statusR, 64<<10))
	if err != nil {
		return fail(&launcherFailure{"launch", syscall.ETIMEDOUT})
	}
	report := &launchReport{limits: map[string]bool{}}
	ready := false
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 2 && f[0] == "limit":
			report.limits[f[1]] = true
		case len(f) == 1 && f[0] == "nnp":
			report.noNewPrivs = true
		case len(f) == 1 && f[0] == "seccomp":
			report.seccomp = true
		case len(f) == 1 && f[0] == "ready":
			ready = true
		case len(f) == 3 && f[0] == "fail":
			n, _ := strconv.Atoi(f[2])
			return fail(&launcherFailure{f[1], syscall.Errno(n)})
		}
	}
	if !ready {
		return fail(&launcherFailure{"launch", syscall.ECHILD})
	}
	return cmd, report, nil
}

// runLauncher is the launcher's main; it returns only on failure.
func runLauncher(specF *os.File) int {
	// The status pipe closes when the server is executed; until then it
	// is used through its raw descriptor only (an *os.File would close it
	// when collected).
	const st = launcherStatusFD
	syscall.CloseOnExec(st)
	fail := func(step string, err error) int {
		errno := syscall.EINVAL
		_ = errors.As(err, &errno)
		writeRaw(st, []byte("fail "+step+" "+strconv.Itoa(int(errno))+"\n"))
		return 126
	}
	var spec launcherSpec
	err := json.NewDecoder(io.LimitReader(specF, maxLauncherSpec)).Decode(&spec)
	_ = specF.Close()
	if err != nil {
		return fail("spec", err)
	}
	if err := syscall.Chdir(spec.Dir); err != nil {
		return fail("chdir", err)
	}
	if spec.Mounts != nil {
		if err := spec.Mounts.apply(spec.PIDNamespace); err != nil {
			return fail("mount", err)
		}
		// The working directory again, as this namespace shows it.
		if err := syscall.Chdir(spec.Dir); err != nil {
			return fail("chdir", err)
		}
	}
	if spec.SetID {
		if err := syscall.Setgroups([]int{}); err != nil {
			return fail("setgroups", err)
		}
		if err := syscall.Setresgid(int(spec.GID), int(spec.GID), int(spec.GID)); err != nil {
			return fail("setgid", err)
		}
		if err := syscall.Setresuid(int(spec.UID), int(spec.UID), int(spec.UID)); err != nil {
			return fail("setuid", err)
		}
		if os.Getuid() != int(spec.UID) || os.Geteuid() != int(spec.UID) || os.Getgid() != int(spec.GID) {
			return fail("setuid", syscall.EPERM)
		}
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err == nil {
		writeRaw(st, []byte("nnp\n"))
	}
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(syscall.SIGKILL), 0, 0, 0); err != nil {
		return fail("pdeathsig", err)
	}
	// The adapter may have gone before the parent-death signal was set.
	// In a PID namespace of its own the launcher cannot see its parent
	// (getppid is 0): a write to the status pipe, whose reader is the
	// adapter, fails instead.
	if ppid := os.Getppid(); ppid != spec.Parent && !(spec.PIDNamespace && ppid == 0) {
		return 126
	}
	if _, err := syscall.Write(st, []byte("alive\n")); err != nil {
		return 126
	}
	// No capability reaches the server (a launcher in a user namespace
	// holds CAP_SYS_ADMIN there as an ambient capability).
	_ = unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
	// The filter comes last before exec: it refuses calls the launcher
	// itself made above (mount, for one).
	if spec.Seccomp && loadSeccomp() == nil {
		writeRaw(st, []byte("seccomp\n"))
	}
	argv0, err := syscall.BytePtrFromString(spec.Path)
	if err != nil {
		return fail("exec", err)
	}
	argv, err := syscall.SlicePtrFromStrings(spec.Args)
	if err != nil {
		return fail("exec", err)
	}
	envv, err := syscall.SlicePtrFromStrings(spec.Env)
	if err != nil {
		return fail("exec", err)
	}
	lines := make([][]byte, len(spec.Limits))
	for i, l := range spec.Limits {
		lines[i] = []byte("limit " + l.Name + "\n")
	}
	limits := make([]unix.Rlimit, 2*len(spec.Limits))
	failExec := []byte("fail exec          \n")
	ready := []byte("ready\n")
	// From here on: no allocation, raw system calls only.
	runtime.GC()
	debug.SetGCPercent(-1)
	for i, l := range spec.Limits {
		cur, next := &limits[2*i], &limits[2*i+1]
		if unix.Prlimit(0, l.Resource, nil, cur) != nil {
			continue
		}
		next.Cur, next.Max = min(cur.Cur, l.Value), min(cur.Max, l.Value)
		if unix.Prlimit(0, l.Resource, next, nil) != nil {
			continue
		}
		writeRaw(st, lines[i])
	}
	writeRaw(st, ready)
	_, _, errno := syscall.RawSyscall(syscall.SYS_EXECVE,
		uintptr(unsafe.Pointer(argv0)), uintptr(unsafe.Pointer(&argv[0])), uintptr(unsafe.Pointer(&envv[0])))
	n := strconv.AppendInt(failExec[:len("fail exec ")], int64(errno), 10)
	n = append(n, '\n')
	writeRaw(st, n)
	return 127
}

// writeRaw writes b to fd with a raw system call (no allocation).
func writeRaw(fd int, b []byte) {
	if len(b) > 0 {
		_, _, _ = syscall.RawSyscall(syscall.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	}
}
