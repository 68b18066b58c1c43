package loadgen

import (
	"bufio"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/serve"
	"github.com/v0m3/v0m3/suite"
)

// budget is what the bench gives every task and requester: far more than a
// run can use, so no measured call is refused for budget.
const budget = "1000000000000"

// child is a process the bench started: `v0m3 dev`, the HTTP fixture
// server or redis-server. Its stderr goes to a log file kept for a failure
// message.
type child struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// startChild starts exe with args, logging stderr (and stdout unless the
// caller reads it) to dir/<name>.log.
func startChild(name, dir string, stdout io.Writer, exe string, args ...string) (*child, error) {
	logPath := filepath.Join(dir, name+".log")
	lf, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("loadgen: %w", err)
	}
	cmd := exec.Command(exe, args...)
	cmd.Stderr = lf
	cmd.Stdout = lf
	if stdout != nil {
		cmd.Stdout = stdout
	}
	if err := cmd.Start(); err != nil {
		_ = lf.Close()
		return nil, fmt.Errorf("loadgen: start %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); _ = lf.Close(); close(c.done) }()
	return c, nil
}

// pid is the child's process id.
func (c *child) pid() int { return c.cmd.Process.Pid }

// stop ends the child gracefully (SIGTERM), then by SIGKILL after 15 s.
func (c *child) stop() {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(15 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

// logTail is the end of the child's log, for an error message.
func (c *child) logTail() string {
	b, err := os.ReadFile(c.log)
	if err != nil {
		return err.Error()
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return strings.TrimSpace(string(b))
}

// cpuTime is the CPU time (user + system) pid has used itself, not counting
// its children: /proc/<pid>/stat fields utime and stime. Children's time is
// in cutime/cstime, which is left out, so a stdio MCP server the adapter
// starts never counts as V0M3's CPU. The resolution is one clock tick
// (USER_HZ, 100 per second on Linux, fixed by the kernel ABI).
func cpuTime(pid int) (time.Duration, error) {
	self, _, err := cpuTimes(pid)
	return self, err
}

// cpuTimes returns pid's own CPU time and that of its children it has
// waited for (cutime + cstime): for `v0m3 dev`, the stdio servers the
// adapter started and reaped.
func cpuTimes(pid int) (self, children time.Duration, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, fmt.Errorf("loadgen: read CPU time: %w", err)
	}
	// The command name (field 2) is in parentheses and may hold spaces;
	// the fields after the last ')' start at field 3 (state).
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("loadgen: /proc/%d/stat does not parse", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 15 {
		return 0, 0, fmt.Errorf("loadgen: /proc/%d/stat does not parse", pid)
	}
	const userHZ = 100
	var ticks [4]int64 // utime (14), stime (15), cutime (16), cstime (17)
	for j := range ticks {
		n, err := strconv.ParseInt(f[11+j], 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("loadgen: /proc/%d/stat does not parse: %w", pid, err)
		}
		ticks[j] = n
	}
	tick := time.Second / userHZ
	return time.Duration(ticks[0]+ticks[1]) * tick, time.Duration(ticks[2]+ticks[3]) * tick, nil
}

// acceptsFlag reports whether `exe dev` has the flag name (the bench may
// measure a build older than the flag).
func acceptsFlag(ctx context.Context, exe, name string) bool {
	out, _ := exec.CommandContext(ctx, exe, "dev", "-h").CombinedOutput() // -h exits non-zero
	return strings.Contains(string(out), "-"+name+" ")
}

// devSystem is a `v0m3 dev` child serving the five services, and clients
// of it.
type devSystem struct {
	proc    *child
	dev     *identity.Dev
	clients suite.Clients
	conns   []*grpc.ClientConn
}

// startDev starts `exe dev` on storeURL with its data in dir, waits until
// it names its addresses, and dials each service as a product caller.
func startDev(ctx context.Context, exe, dir, storeURL string, extra []string) (*devSystem, error) {
	pki := filepath.Join(dir, "pki")
	// The bench makes the development CA and issuer first; `v0m3 dev`
	// given the same --pki-dir takes them up, so the bench's tokens and
	// trust roots match.
	dev, err := identity.NewDev(pki)
	if err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	// The log level is the default (info), as deployed: what the services
	// log per call is part of what a call costs. The log goes to a file.
	args := append([]string{"dev", "--data-dir", dir, "--pki-dir", pki, "--port-base", "0",
		"--task-budget-calls", budget, "--task-budget-bytes", budget, "--task-budget-cost", budget,
		"--requester-budget-calls", budget, "--requester-budget-bytes", budget, "--requester-budget-cost", budget,
	}, extra...)
	if acceptsFlag(ctx, exe, "caller-rate") {
		// A measurement is one caller submitting as fast as the system
		// answers: no caller rate limit (builds before it had none).
		args = append(args, "--caller-rate", "0", "--caller-rate-groups", "")
	}
	if storeURL != "" {
		args = append(args, "--store", storeURL)
	}
	proc, err := startChild("v0m3-dev", dir, pw, exe, args...)
	if err != nil {
		return nil, err
	}
	go func() { <-proc.done; _ = pw.Close() }()
	addrs := map[string]string{}
	ready := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			line := sc.Text()
			f := strings.Fields(line)
			if len(f) == 2 && slices.Contains(suite.Names, f[0]) {
				addrs[f[0]] = f[1]
			}
			if strings.HasPrefix(line, "serving until interrupted") {
				ready <- nil
				_, _ = io.Copy(io.Discard, pr)
				return
			}
		}
		ready <- errors.New("v0m3 dev exited before serving")
	}()
	select {
	case err = <-ready:
	case <-time.After(60 * time.Second):
		err = errors.New("v0m3 dev did not start within 60 s")
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		proc.stop()
		return nil, fmt.Errorf("loadgen: %w: %s", err, proc.logTail())
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(dev.CA.CertPEM())
	d := &devSystem{proc: proc, dev: dev}
	conns := map[string]*grpc.ClientConn{}
	for _, name := range suite.Names {
		c, err := serve.Dial(addrs[name], identity.CallerDialOptions(roots)...)
		if err != nil {
			d.close()
			return nil, err
		}
		d.conns = append(d.conns, c)
		conns[name] = c
	}
	d.clients = suite.NewClients(conns[suite.Registry], conns[suite.Policy], conns[suite.Evidence], conns[suite.Adapter], conns[suite.Orchestrator])
	return d, nil
}

// as returns ctx carrying a token for subject in groups.
func (d *devSystem) as(ctx context.Context, subject string, groups ...string) (context.Context, error) {
	tok, err := d.token(subject, groups...)
	if err != nil {
		return nil, err
	}
	return identity.WithBearer(ctx, tok), nil
}

// token mints a token for subject in groups, once per caller, so the
// bench's own signing stays out of the measured calls.
func (d *devSystem) token(subject string, groups ...string) (string, error) {
	return d.dev.Issuer.Mint(subject, groups, 12*time.Hour)
}

// execCommand is the direct client's stdio server command.
func execCommand(exe string, args ...string) *exec.Cmd { return exec.Command(exe, args...) }

// pooledHTTPClient keeps enough idle connections for every caller, as a
// tuned direct client would (the default keeps two per host).
func pooledHTTPClient() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 256
	t.MaxIdleConnsPerHost = 256
	return &http.Client{Transport: t}
}

// numCPU is the number of CPUs the bench may use.
func numCPU() int { return runtime.NumCPU() }

func (d *devSystem) close() {
	for _, c := range d.conns {
		_ = c.Close()
	}
	d.proc.stop()
}

// startHTTPFixture starts `exe fixture-server --transport http` and returns
// it with its MCP endpoint URL.
func startHTTPFixture(ctx context.Context, exe, dir string) (*child, string, error) {
	proc, err := startChild("fixture-http", dir, nil, exe, "fixture-server", "--transport", "http", "--addr", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	// The fixture prints its address on stderr: read it from the log.
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		b, _ := os.ReadFile(proc.log)
		for _, line := range strings.Split(string(b), "\n") {
			if u, ok := strings.CutPrefix(line, "listening on "); ok {
				return proc, strings.TrimSpace(u), nil
			}
		}
		select {
		case <-proc.done:
			return nil, "", fmt.Errorf("loadgen: the HTTP fixture server exited: %s", proc.logTail())
		case <-time.After(20 * time.Millisecond):
		}
	}
	proc.stop()
	return nil, "", fmt.Errorf("loadgen: the HTTP fixture server named no address: %s", proc.logTail())
}

// startRedis starts a private redis-server configured as the Helm chart
// configures production (append-only file, fsync every second, no RDB
// snapshots) on a free loopback port, with its data in dir.
func startRedis(ctx context.Context, dir string) (*child, string, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, "", errors.New("loadgen: redis-server is not installed (make redis, or scripts/ensure-redis.sh); or run with --stores file")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", fmt.Errorf("loadgen: find a free port: %w", err)
	}
	addr := l.Addr().String()
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	_ = l.Close()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, "", fmt.Errorf("loadgen: %w", err)
	}
	proc, err := startChild("redis", dir, nil, bin, "--port", port, "--bind", "127.0.0.1", "--dir", dir,
		"--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--protected-mode", "yes", "--daemonize", "no")
	if err != nil {
		return nil, "", err
	}
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			_ = c.Close()
			return proc, addr, nil
		}
		select {
		case <-proc.done:
			return nil, "", fmt.Errorf("loadgen: redis-server exited at start: %s", proc.logTail())
		case <-time.After(20 * time.Millisecond):
		}
	}
	proc.stop()
	return nil, "", fmt.Errorf("loadgen: redis-server on %s did not answer: %s", addr, proc.logTail())
}
