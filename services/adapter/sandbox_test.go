package adapter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/demo/fixture"
	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/adapter/internal/escape"
)

func textOf(t *testing.T, resp *adapterv1.ExecuteResponse) string {
	t.Helper()
	if resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK || len(resp.GetItems()) != 1 {
		t.Fatalf("outcome %v error %v items %d", resp.GetOutcome(), resp.GetError(), len(resp.GetItems()))
	}
	return resp.GetItems()[0].GetText()
}

// TestSandboxAppliedAndRecorded starts a local server, has it try to reach a
// loopback listener of the test, and checks that what the connection
// records is what the server lived under.
func TestSandboxAppliedAndRecorded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	conn := e.stdioConn("--hostile")

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int32
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			_ = c.Close()
		}
	}()
	dialed := textOf(t, execute(t, e, call(t, conn, "dial", map[string]any{"address": lis.Addr().String()}, nil)))
	_ = lis.Close()

	got, err := e.registry.GetConnection(context.Background(), &registryv1.GetConnectionRequest{Id: conn.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	sb := got.GetSandbox()
	if sb.GetWorkingDir() != filepath.Join(e.srv.workDir, conn.GetId()) || !sb.GetMinimalEnvironment() {
		t.Errorf("sandbox = %v", sb)
	}
	for _, want := range []string{"RLIMIT_AS=2GiB", "RLIMIT_NOFILE=256", "RLIMIT_FSIZE=64MiB", "RLIMIT_CPU=600s"} {
		if !slices.Contains(sb.GetResourceLimits(), want) {
			t.Errorf("resource limits %v lack %s", sb.GetResourceLimits(), want)
		}
	}
	switch sb.GetNetwork() {
	case registryv1.NetworkIsolation_NETWORK_ISOLATION_ENFORCED:
		if dialed != fixture.DialFailed || accepted.Load() != 0 {
			t.Errorf("network isolation recorded as enforced, but the server's dial %s and the listener accepted %d", dialed, accepted.Load())
		}
	case registryv1.NetworkIsolation_NETWORK_ISOLATION_NOT_ENFORCED:
		t.Log("!!! the kernel refused a network namespace here: checking that the record says so truthfully")
		if dialed != fixture.DialConnected {
			t.Errorf("isolation recorded as not enforced, yet the server could not dial: %s", dialed)
		}
	default:
		t.Errorf("network isolation = %v", sb.GetNetwork())
	}

	// By default a root adapter gives each server a uid of its own from
	// the default range; otherwise a user namespace.
	wantKind := registryv1.IdentityKind_IDENTITY_KIND_USER_NAMESPACE
	if os.Geteuid() == 0 {
		wantKind = registryv1.IdentityKind_IDENTITY_KIND_DEDICATED_UID
		if sb.GetIdentity().GetRangeFirstUid() != DefaultSandboxUIDs.First || sb.GetIdentity().GetRangeUidCount() != DefaultSandboxUIDs.Count ||
			sb.GetProcessLimit() != registryv1.Enforcement_ENFORCEMENT_ENFORCED || sb.GetMaxProcesses() != DefaultMaxProcesses {
			t.Errorf("sandbox = %v", sb)
		}
	}
	if sb.GetIdentity().GetKind() != wantKind && sb.GetIdentity().GetKind() != registryv1.IdentityKind_IDENTITY_KIND_NOT_ENFORCED {
		t.Errorf("identity = %v, want %v", sb.GetIdentity(), wantKind)
	}

	// The limits are the process's own, not just a record.
	limits := textOf(t, execute(t, e, call(t, conn, "limits", map[string]any{}, nil)))
	for _, want := range []string{"Max open files            256                  256", "Max address space         2147483648           2147483648",
		"Max processes             128                  128"} {
		if !strings.Contains(limits, want) {
			t.Errorf("/proc/self/limits of the server lacks %q:\n%s", want, limits)
		}
	}
}

// escapeConn registers a connection that runs the hostile escape server;
// name marks its process.
func (e *env) escapeConn(name, credentialRef string) *registryv1.Connection {
	return e.registry.add(&registryv1.Connection{DisplayName: "escape " + name, CredentialRef: credentialRef, Transport: &registryv1.Transport{
		Kind: &registryv1.Transport_Stdio{Stdio: &registryv1.StdioTransport{Command: escapeBin, Args: []string{"--name=" + name}}},
	}})
}

// escapeReport decodes the escape server's answer.
func escapeReport(t *testing.T, resp *adapterv1.ExecuteResponse) escape.Report {
	t.Helper()
	var r escape.Report
	if err := json.Unmarshal([]byte(textOf(t, resp)), &r); err != nil {
		t.Fatalf("escape report: %v", err)
	}
	return r
}

// pidOf waits for the process running escapeBin --name=name; starting it
// (and its sandbox) may take long on a loaded machine.
func pidOf(t *testing.T, name string) int {
	t.Helper()
	want := escapeBin + "\x00--name=" + name + "\x00"
	pid := 0
	testkit.Eventually(t, "a process runs the escape server "+name, func() bool {
		pid = findPID(want)
		return pid != 0
	})
	return pid
}

// findPID returns a process whose command line is cmdline, or 0.
func findPID(cmdline string) int {
	entries, _ := os.ReadDir("/proc")
	for _, en := range entries {
		pid, err := strconv.Atoi(en.Name())
		if err != nil {
			continue
		}
		if b, err := os.ReadFile("/proc/" + en.Name() + "/cmdline"); err == nil && string(b) == cmdline {
			return pid
		}
	}
	return 0
}

// limitLine returns the line of /proc/self/limits naming what.
func limitLine(id escape.Identity, what string) string {
	for _, l := range id.Limits {
		if strings.HasPrefix(l, what) {
			return strings.Join(strings.Fields(l), " ")
		}
	}
	return ""
}

// TestSandboxHostileChild runs a hostile local server through the
// adapter's real stdio path while another server holds a credential, and
// has it try each escape: the other server's and the adapter's environment
// and memory, signals, the adapter's data directory and a credential
// planted there, and a fork bomb. Each fails; the record says what was
// enforced and matches what the server lived under; nothing is left
// behind.
func TestSandboxHostileChild(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("dedicated uids need a root adapter; TestSandboxSharedIdentityRecorded covers the user-namespace path")
	}
	cfg := SandboxConfig{UIDs: UIDRange{First: 2_000_000_000, Count: 64}, MaxProcesses: 48}
	e := newEnvWith(t, slog.New(slog.DiscardHandler), func(d *Deps) { d.Sandbox = cfg })
	dataDir := e.srv.workDir
	// A data dir that arrives open is closed by the adapter.
	if err := os.Chmod(dataDir, 0o755); err != nil {
		t.Fatal(err)
	}
	const planted = "planted-credential-value"
	if err := os.WriteFile(filepath.Join(dataDir, "credential"), []byte(planted), 0o644); err != nil {
		t.Fatal(err)
	}
	victim := e.escapeConn("victim", e.plant("victim-secret-value"))
	attacker := e.escapeConn("attacker", "")

	// The victim runs, holding its credential, until released (or
	// escape.HoldMax). Its deadline outlasts HoldMax: however long the
	// attacker's run takes on a loaded machine, the victim's call ends
	// with its report, not its deadline.
	held := make(chan *adapterv1.ExecuteResponse, 1)
	victimCtx, cancelVictim := context.WithTimeout(context.Background(), 3*escape.HoldMax)
	defer cancelVictim()
	go func() {
		resp, err := e.srv.Execute(victimCtx, granted(t, call(t, victim, escape.ToolHold, map[string]any{}, nil)))
		if err != nil {
			t.Error(err)
		}
		held <- resp
	}()
	victimPID := pidOf(t, "victim")
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", victimPID)); err != nil || !strings.Contains(string(b), CredentialEnv+"=") {
		t.Fatalf("the victim does not hold a credential to steal (%v)", err)
	}

	// The victim's command line is what a neighbour would read a bearer
	// token from.
	needles := []string{CredentialEnv + "=", secretEnv + "=", planted, "--name=victim"}
	marker := "escape-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	t.Cleanup(func() {
		for _, dir := range sharedDirs {
			_ = os.Remove(filepath.Join(dir, marker))
		}
	})
	resp := execute(t, e, call(t, attacker, escape.ToolEscape, map[string]any{
		"pids":       []any{os.Getpid(), victimPID},
		"needles":    toAny(needles),
		"data_dir":   dataDir,
		"planted":    "credential",
		"forks":      100,
		"daemon":     true,
		"cmdlines":   true,
		"shared":     toAny(sharedDirs),
		"marker":     marker,
		"namespaces": true,
		"syscalls":   true,
	}, nil))
	r := escapeReport(t, resp)
	// SIGUSR1 releases the victim only once it listens for it (before it
	// answers initialize; until then the signal would kill it): its call
	// is in flight once its session is open.
	testkit.Eventually(t, "the victim's call is in flight", func() bool { return e.srv.pool.stats().InFlight == 1 })
	if err := syscall.Kill(victimPID, syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	victimID := escapeReport(t, <-held).Identity

	for _, pid := range []int{os.Getpid(), victimPID} {
		for _, what := range []string{"environ", "mem", "signal"} {
			name := fmt.Sprintf("%s %d", what, pid)
			a, ok := r.Attempt(name)
			if !ok || a.OK || len(a.Found) > 0 {
				t.Errorf("escape %q: tried %v, worked %v, found %v (%s)", name, ok, a.OK, a.Found, a.Error)
			}
		}
	}
	for _, name := range []string{"list data dir", "read planted", "write data dir", "list parent dir"} {
		a, ok := r.Attempt(name)
		// In its own mount namespace the planted file is not there at
		// all; without one, the closed data dir refuses it.
		if !ok || a.OK || (a.Error != "permission denied" && !(name == "read planted" && a.Error == "no such file or directory")) || len(a.Found) > 0 {
			t.Errorf("escape %q: tried %v, worked %v, error %q, found %v", name, ok, a.OK, a.Error, a.Found)
		}
	}
	if a, _ := r.Attempt("daemon"); !a.OK || r.DaemonPID == 0 {
		t.Errorf("the attacker could not leave a process behind to be cleaned up: %+v", a)
	}
	// No other process's command line: it sees none (its own PID
	// namespace and /proc).
	if a, ok := r.Attempt("cmdlines"); !ok || a.OK || len(a.Found) > 0 || r.Identity.VisibleProcesses > 2 {
		t.Errorf("escape \"cmdlines\": tried %v, read others' %v, found %v; %d processes visible", ok, a.OK, a.Found, r.Identity.VisibleProcesses)
	}
	// Its /tmp, /var/tmp and /dev/shm are its own: what it writes there
	// nobody else sees.
	for _, dir := range sharedDirs {
		if a, ok := r.Attempt("write " + dir); !ok || !a.OK {
			t.Errorf("the server could not write its own %s: %+v", dir, a)
		}
		if _, err := os.Stat(filepath.Join(dir, marker)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("what the server wrote into %s is visible outside its sandbox (%v)", dir, err)
		}
	}
	// No namespace, no system call a tool server has no use for.
	for _, name := range refusedEscapes {
		want := "operation not permitted"
		if name == "clone3" || name == "io_uring_setup" {
			want = "function not implemented"
		}
		if a, ok := r.Attempt(name); !ok || a.OK || a.Error != want {
			t.Errorf("escape %q: tried %v, worked %v, error %q, want %q", name, ok, a.OK, a.Error, want)
		}
	}
	if r.Identity.Seccomp != 2 {
		t.Errorf("the server's Seccomp mode is %d, want 2 (a filter)", r.Identity.Seccomp)
	}
	// A home, temporary and XDG directories of its own, which it can write.
	wantDirs(t, r.Identity)
	if r.ForksStarted >= int(cfg.MaxProcesses) || r.ForkError != "resource temporarily unavailable" {
		t.Errorf("fork bomb: %d of 100 processes started (limit %d), stopped by %q", r.ForksStarted, cfg.MaxProcesses, r.ForkError)
	}

	// Its own identity, distinct from the adapter's and the victim's.
	id := r.Identity
	inRange := func(uid int) bool { return uid >= int(cfg.UIDs.First) && uid < int(cfg.UIDs.First+cfg.UIDs.Count) }
	if !inRange(id.UID) || id.GID != id.UID || len(id.Groups) != 0 || !inRange(victimID.UID) || victimID.UID == id.UID {
		t.Errorf("attacker uid %d gid %d groups %v, victim uid %d: want distinct uids from %d..%d, gid = uid, no groups",
			id.UID, id.GID, id.Groups, victimID.UID, cfg.UIDs.First, cfg.UIDs.First+cfg.UIDs.Count-1)
	}
	if !id.OwnDirWritable {
		t.Error("the server could not write its own working directory")
	}
	// The uid is the connection's: its next run has it again. (Sessions
	// are long-lived: closing the idle ones, as the idle timeout would,
	// ends the run.)
	e.srv.pool.closeIdle()
	again := escapeReport(t, execute(t, e, call(t, attacker, escape.ToolEscape, map[string]any{}, nil))).Identity
	if again.UID != id.UID {
		t.Errorf("the attacker's next run has uid %d, its first had %d", again.UID, id.UID)
	}

	// The record is what the server lived under.
	got, err := e.registry.GetConnection(context.Background(), &registryv1.GetConnectionRequest{Id: attacker.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	sb := got.GetSandbox()
	enforced := registryv1.Enforcement_ENFORCEMENT_ENFORCED
	wantIdentity := &registryv1.SandboxIdentity{Kind: registryv1.IdentityKind_IDENTITY_KIND_DEDICATED_UID, Uid: uint32(id.UID), Gid: uint32(id.UID),
		RangeFirstUid: cfg.UIDs.First, RangeUidCount: cfg.UIDs.Count}
	if sb.GetPidNamespace() != enforced || sb.GetMountNamespace() != enforced || sb.GetSeccomp() != enforced ||
		sb.GetOwnHome() != enforced || sb.GetHome() != again.Env["HOME"] {
		t.Errorf("recorded sandbox %v; the server's HOME (last run) is %q", sb, again.Env["HOME"])
	}
	if !proto.Equal(sb.GetIdentity(), wantIdentity) || sb.GetProcessIsolation() != enforced || sb.GetDataDirIsolation() != enforced ||
		sb.GetProcessLimit() != enforced || sb.GetMaxProcesses() != cfg.MaxProcesses || !sb.GetAppliedBeforeExec() ||
		!sb.GetNoNewPrivileges() || sb.GetWorkingDir() != filepath.Join(dataDir, attacker.GetId()) {
		t.Errorf("recorded sandbox %v", sb)
	}
	if !id.NoNewPrivs {
		t.Error("no_new_privileges recorded, but the server's NoNewPrivs is 0")
	}
	if l := limitLine(id, "Max processes"); l != "Max processes 48 48 processes" {
		t.Errorf("process limit recorded as %d, the server's is %q", sb.GetMaxProcesses(), l)
	}
	for _, want := range sb.GetResourceLimits() {
		name, _, _ := strings.Cut(want, "=")
		line := map[string]string{"RLIMIT_AS": "Max address space", "RLIMIT_NOFILE": "Max open files", "RLIMIT_FSIZE": "Max file size", "RLIMIT_CPU": "Max cpu time"}[name]
		if line == "" || limitLine(id, line) == "" || strings.Contains(limitLine(id, line), "unlimited") {
			t.Errorf("%s recorded, the server's limit is %q", want, limitLine(id, line))
		}
	}

	// Once the runs end (closing the idle sessions, as the idle timeout
	// would), nothing is left behind: no process under either uid (the daemon,
	// out of the server's process group, was killed too), no file the
	// attacker wrote, no run directory, the planted file untouched, the
	// data dir closed.
	// (The daemon's pid is its PID namespace's: it is found, if left, by
	// its uid.)
	e.srv.pool.closeIdle()
	for _, uid := range []int{id.UID, victimID.UID} {
		if pids := pidsOf(uint32(uid)); len(pids) > 0 {
			t.Errorf("processes %v still run under uid %d", pids, uid)
		}
	}
	entries, err := os.ReadDir(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, en := range entries {
		if strings.HasPrefix(en.Name(), "escape-") {
			t.Errorf("the attacker wrote %s into the data dir", en.Name())
		}
		if en.IsDir() {
			if runs, _ := os.ReadDir(filepath.Join(dataDir, en.Name())); len(runs) > 0 {
				t.Errorf("run directories left in %s: %v", en.Name(), runs)
			}
		}
	}
	if b, err := os.ReadFile(filepath.Join(dataDir, "credential")); err != nil || string(b) != planted {
		t.Errorf("planted file changed: %q %v", b, err)
	}
	if fi, err := os.Stat(dataDir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("data dir mode %v (%v), want 0700", fi.Mode().Perm(), err)
	}
}

// TestSandboxSharedIdentityRecorded: configured to share the adapter's
// identity (a user namespace, as for a non-root adapter), the adapter
// records process isolation, data-dir isolation and the process limit as
// NOT_ENFORCED, and that record is true: the same hostile server may
// signal the adapter, reads the planted credential and (sharing host root)
// forks past the limit.
func TestSandboxSharedIdentityRecorded(t *testing.T) {
	t.Parallel()
	cfg := SandboxConfig{SharedIdentity: true, MaxProcesses: 48}
	e := newEnvWith(t, slog.New(slog.DiscardHandler), func(d *Deps) { d.Sandbox = cfg })
	dataDir := e.srv.workDir
	const plantedValue = "planted-credential-value"
	if err := os.WriteFile(filepath.Join(dataDir, "credential"), []byte(plantedValue), 0o600); err != nil {
		t.Fatal(err)
	}
	conn := e.escapeConn("shared", "")
	resp := execute(t, e, call(t, conn, escape.ToolEscape, map[string]any{
		"pids":       []any{os.Getpid()},
		"needles":    toAny([]string{secretEnv + "=", plantedValue}),
		"data_dir":   dataDir,
		"planted":    "credential",
		"forks":      64,
		"cmdlines":   true,
		"namespaces": true,
		"syscalls":   true,
	}, nil))
	if resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK && os.Geteuid() == 0 {
		// A root adapter never runs a server as root: without a user
		// namespace it refuses instead.
		t.Skipf("!!! the kernel refused a user namespace here, so a root adapter with a shared identity refuses to start servers: %v", resp.GetError())
	}
	r := escapeReport(t, resp)
	got, err := e.registry.GetConnection(context.Background(), &registryv1.GetConnectionRequest{Id: conn.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	sb := got.GetSandbox()
	not := registryv1.Enforcement_ENFORCEMENT_NOT_ENFORCED
	if sb.GetProcessIsolation() != not || sb.GetDataDirIsolation() != not || !sb.GetAppliedBeforeExec() {
		t.Errorf("recorded sandbox %v", sb)
	}
	switch k := sb.GetIdentity().GetKind(); k {
	case registryv1.IdentityKind_IDENTITY_KIND_USER_NAMESPACE:
		if sb.GetIdentity().GetUid() != uint32(os.Geteuid()) || sb.GetIdentity().GetNamespaceUid() != namespaceUID || r.Identity.UID != namespaceUID {
			t.Errorf("recorded identity %v; the server saw uid %d", sb.GetIdentity(), r.Identity.UID)
		}
	case registryv1.IdentityKind_IDENTITY_KIND_NOT_ENFORCED:
		t.Log("!!! the kernel refused a user namespace: the server ran as the adapter's user, and the record says so")
		if r.Identity.UID != os.Geteuid() {
			t.Errorf("identity recorded as the adapter's, the server ran as uid %d", r.Identity.UID)
		}
	default:
		t.Errorf("identity kind %v", k)
	}
	// What was recorded as not enforced was indeed not: sharing the
	// adapter's uid, the server may signal (here: kill) the adapter,
	// unless its own PID namespace hides the adapter. (Its environment
	// stays unreadable from another user namespace: the kernel's
	// capability check refuses that across namespaces.) The namespaces
	// and the filter are the server's own, whatever its identity.
	enforced := registryv1.Enforcement_ENFORCEMENT_ENFORCED
	signal, _ := r.Attempt(fmt.Sprintf("signal %d", os.Getpid()))
	cmdlines, _ := r.Attempt("cmdlines")
	switch sb.GetPidNamespace() {
	case enforced:
		if signal.OK || cmdlines.OK || r.Identity.VisibleProcesses > 2 {
			t.Errorf("PID namespace recorded, yet the server signalled the adapter (%+v) or read others' command lines (%+v)", signal, cmdlines)
		}
	case not:
		t.Log("!!! the kernel refused a PID namespace here: checking that the record says so truthfully")
		if !signal.OK || !cmdlines.OK {
			t.Errorf("process isolation recorded as not enforced, yet the server could not signal the adapter (%+v) or read command lines (%+v)", signal, cmdlines)
		}
	default:
		t.Errorf("pid namespace %v", sb.GetPidNamespace())
	}
	planted, _ := r.Attempt("read planted")
	switch sb.GetMountNamespace() {
	case enforced:
		if planted.OK || len(planted.Found) > 0 {
			t.Errorf("mount namespace recorded, yet the server read the planted file in the data dir: %+v", planted)
		}
	case not:
		if !planted.OK || !slices.Contains(planted.Found, plantedValue) {
			t.Errorf("data-dir isolation recorded as not enforced, yet the server could not read the planted file: %+v", planted)
		}
	default:
		t.Errorf("mount namespace %v", sb.GetMountNamespace())
	}
	if sb.GetSeccomp() == enforced {
		if r.Identity.Seccomp != 2 {
			t.Errorf("seccomp recorded, the server's Seccomp mode is %d", r.Identity.Seccomp)
		}
		for _, name := range refusedEscapes {
			if a, ok := r.Attempt(name); !ok || a.OK {
				t.Errorf("escape %q: tried %v, worked %v (%s)", name, ok, a.OK, a.Error)
			}
		}
	} else if a, _ := r.Attempt("add_key"); !a.OK {
		t.Errorf("seccomp recorded as %v, yet add_key was refused: %+v", sb.GetSeccomp(), a)
	}
	if sb.GetOwnHome() != enforced || sb.GetHome() != r.Identity.Env["HOME"] {
		t.Errorf("own home %v %q, the server's HOME %q", sb.GetOwnHome(), sb.GetHome(), r.Identity.Env["HOME"])
	}
	wantDirs(t, r.Identity)
	switch sb.GetProcessLimit() {
	case not:
		// Host root is exempt from RLIMIT_NPROC.
		if os.Geteuid() == 0 && r.ForksStarted != 64 {
			t.Errorf("process limit recorded as not enforced, yet only %d of 64 forks started (%s)", r.ForksStarted, r.ForkError)
		}
	case registryv1.Enforcement_ENFORCEMENT_ENFORCED:
		if os.Geteuid() == 0 || r.ForksStarted >= int(cfg.MaxProcesses) || sb.GetMaxProcesses() != cfg.MaxProcesses {
			t.Errorf("process limit recorded as %d, yet %d of 64 forks started", sb.GetMaxProcesses(), r.ForksStarted)
		}
	default:
		t.Errorf("process limit %v", sb.GetProcessLimit())
	}
	if got := r.Identity.NoNewPrivs; got != sb.GetNoNewPrivileges() {
		t.Errorf("no_new_privileges recorded %v, the server's is %v", sb.GetNoNewPrivileges(), got)
	}
}

// sharedDirs are the directories every process on a host may write.
var sharedDirs = []string{"/tmp", "/var/tmp", "/dev/shm"}

// refusedEscapes are the escape attempts the seccomp filter refuses.
var refusedEscapes = []string{"clone user namespace", "clone user and network namespaces", "unshare user namespace", "clone3", "setns",
	"mount", "ptrace", "add_key", "keyctl", "perf_event_open", "bpf", "kexec_load", "init_module", "io_uring_setup"}

// wantDirs checks that the server had a home, temporary, runtime and XDG
// base directories of its own run, and could write each.
func wantDirs(t *testing.T, id escape.Identity) {
	t.Helper()
	home := id.Env["HOME"]
	if !strings.HasPrefix(home, "/") || filepath.Base(home) != "home" || !strings.HasPrefix(filepath.Base(filepath.Dir(home)), "run-") {
		t.Errorf("HOME = %q, want the run's own", home)
	}
	for _, v := range escape.DirVars {
		dir, ok := id.Env[v]
		if !ok || !strings.HasPrefix(dir, filepath.Dir(home)+"/") {
			t.Errorf("%s = %q (set %v), want a directory of the run's own", v, dir, ok)
		}
		if !slices.Contains(id.Writable, v) {
			t.Errorf("the server could not write its %s (%s)", v, dir)
		}
	}
}

func toAny[T any](s []T) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// TestSandboxSetupRefused: when the sandbox cannot be set up as
// configured, the server is not started at all, and the caller is told
// why: SANDBOX_UNAVAILABLE, not a retryable unreachable server.
func TestSandboxSetupRefused(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("dedicated uids and foreign-owned data dirs need a root adapter")
	}
	cases := []struct {
		name    string
		cfg     SandboxConfig
		prepare func(t *testing.T, dataDir string)
		want    string
	}{
		{"uid range including root", SandboxConfig{UIDs: UIDRange{First: 0, Count: 8}}, nil, "must exclude root"},
		{"data dir owned by someone else", SandboxConfig{}, func(t *testing.T, dataDir string) {
			if err := os.Chown(dataDir, 12345, 12345); err != nil {
				t.Fatal(err)
			}
		}, "belongs to uid 12345"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// touch is an allowed executable here: what must stop it is the
			// sandbox that cannot be set up.
			e := newEnvWith(t, slog.New(slog.DiscardHandler), func(d *Deps) {
				d.Sandbox = tc.cfg
				d.StdioRoots = append(d.StdioRoots, "/usr/bin/touch")
			})
			if tc.prepare != nil {
				tc.prepare(t, e.srv.workDir)
			}
			marker := filepath.Join(testkit.WritableDir(t), "started")
			conn := e.registry.add(&registryv1.Connection{DisplayName: "touch", Transport: &registryv1.Transport{
				Kind: &registryv1.Transport_Stdio{Stdio: &registryv1.StdioTransport{Command: "/bin/touch", Args: []string{marker}}},
			}})
			_, err := e.srv.Discover(testkit.AsService(context.Background(), identity.Operator), &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()})
			if apierror.Reason(err) != CodeSandboxUnavailable || status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("discover: %v, want FAILED_PRECONDITION %s saying %q", err, CodeSandboxUnavailable, tc.want)
			}
			resp := execute(t, e, call(t, conn, "anything", map[string]any{}, nil))
			if resp.GetOutcome() != adapterv1.Outcome_OUTCOME_UNAVAILABLE || resp.GetError().GetSafeCode() != CodeSandboxUnavailable ||
				!strings.Contains(resp.GetError().GetAdapterDetail(), tc.want) {
				t.Errorf("execute: %v %v", resp.GetOutcome(), resp.GetError())
			}
			if _, err := os.Stat(marker); !os.IsNotExist(err) {
				t.Errorf("the server ran (%v)", err)
			}
			if _, err := os.Stat(filepath.Join(e.srv.workDir, conn.GetId())); !os.IsNotExist(err) {
				entries, _ := os.ReadDir(filepath.Join(e.srv.workDir, conn.GetId()))
				if len(entries) > 0 {
					t.Errorf("run directories left: %v", entries)
				}
			}
			got, err := e.registry.GetConnection(context.Background(), &registryv1.GetConnectionRequest{Id: conn.GetId()})
			if err != nil || got.GetSandbox() != nil {
				t.Errorf("sandbox recorded for a server that never started: %v %v", got.GetSandbox(), err)
			}
		})
	}
}

// TestUIDClaims: each connection keeps the uid it claimed, no two
// connections share one even when their hashes collide, a full range is
// refused, and a claim unused for claimTTL goes to another connection.
func TestUIDClaims(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("uid claims are made by a root adapter")
	}
	lockDir := filepath.Join(t.TempDir(), "locks")
	r := UIDRange{First: 2_000_001_000, Count: 2}
	lease := func(conn string) (uint32, error) {
		l, err := leaseUID(r, lockDir, conn)
		if err != nil {
			return 0, err
		}
		if !l.release() {
			t.Fatalf("release of %s's uid failed", conn)
		}
		return l.uid, nil
	}
	a, errA := lease("conn_a")
	b, errB := lease("conn_b")
	if errA != nil || errB != nil || a == b {
		t.Fatalf("conn_a uid %d (%v), conn_b uid %d (%v): want two distinct uids", a, errA, b, errB)
	}
	if again, err := lease("conn_a"); err != nil || again != a {
		t.Errorf("conn_a's next run: uid %d (%v), want %d", again, err, a)
	}
	if _, err := lease("conn_c"); !errors.Is(err, errNoFreeUID) {
		t.Errorf("a third connection in a range of two: %v, want %v", err, errNoFreeUID)
	}
	// Two concurrent runs of one connection share its uid.
	l1, err := leaseUID(r, lockDir, "conn_a")
	if err != nil {
		t.Fatal(err)
	}
	l2, err := leaseUID(r, lockDir, "conn_a")
	if err != nil || l2.uid != l1.uid {
		t.Fatalf("concurrent runs of conn_a: uids %d and %v (%v)", l1.uid, l2, err)
	}
	l1.release()
	l2.release()
	// conn_b's claim expires; conn_c takes it over.
	old := time.Now().Add(-claimTTL - time.Hour)
	if err := os.Chtimes(filepath.Join(lockDir, strconv.FormatUint(uint64(b), 10)), old, old); err != nil {
		t.Fatal(err)
	}
	if c, err := lease("conn_c"); err != nil || c != b {
		t.Errorf("conn_c after conn_b's claim expired: uid %d (%v), want %d", c, err, b)
	}
	if again, err := lease("conn_a"); err != nil || again != a {
		t.Errorf("conn_a's claim (in use within claimTTL) moved: uid %d (%v), want %d", again, err, a)
	}
}
