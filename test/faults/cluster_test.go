package faults_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/v0m3/v0m3/internal/failpoint"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/serve"
	"github.com/v0m3/v0m3/internal/testkit"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	"github.com/v0m3/v0m3/suite"
)

// Timings of the orchestrator replicas: short, so a takeover happens
// within a test, and far above the scheduling noise of a loaded machine
// for what they bound.
const (
	leaseTTL         = 2 * time.Second
	recoveryInterval = 200 * time.Millisecond
	// freezeFor is how long a frozen process stays stopped before SIGCONT:
	// past the lease, so another replica may take its requests over.
	freezeFor = 2 * leaseTTL
)

// proc is one service process.
type proc struct {
	name    string // "orchestrator-a", "evidence", ...
	service string
	addr    string
	args    []string
	dataDir string
	log     string // stderr of every run, appended
	mark    string // where an armed fail point records its hit

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when the current run exited
}

// cluster is the five services as processes on one store, with an
// optional second orchestrator replica.
type cluster struct {
	t     *testing.T
	dev   *identity.Dev
	dir   string
	roots *identity.Credentials
	procs map[string]*proc
	// orchestrators in the order a client tries them.
	orchestrators []string
	conns         map[string]*grpc.ClientConn
	clients       suite.Clients

	deadMu sync.Mutex
	dead   map[string]bool // orchestrator replicas killed for good
}

// newCluster starts registry, policy, evidence, adapter and one
// orchestrator ("orchestrator-a") on storeURL ("" = a file store per
// service), and a second replica ("orchestrator-b") when replicas is 2.
func newCluster(t *testing.T, storeURL string, replicas int) *cluster {
	t.Helper()
	dir := t.TempDir()
	dev, err := identity.NewDev(filepath.Join(dir, "pki"))
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, dev: dev, dir: dir, procs: map[string]*proc{}, conns: map[string]*grpc.ClientConn{}}
	names := []string{suite.Registry, suite.Policy, suite.Evidence, suite.Adapter, "orchestrator-a"}
	if replicas == 2 {
		names = append(names, "orchestrator-b")
	}
	// Every address is taken before any is released: a port released
	// early may be handed out again to the next one.
	var held []net.Listener
	for _, n := range names {
		service, _, _ := strings.Cut(n, "-")
		l := testkit.ListenLoopback(t)
		held = append(held, l)
		c.procs[n] = &proc{name: n, service: service, addr: l.Addr().String(), dataDir: filepath.Join(dir, n),
			log: filepath.Join(dir, n+".log"), mark: filepath.Join(dir, n+".mark")}
		if service == suite.Orchestrator {
			c.orchestrators = append(c.orchestrators, n)
		}
	}
	for _, l := range held {
		_ = l.Close()
	}
	for _, n := range names {
		p := c.procs[n]
		tls, err := dev.CA.WriteFiles(filepath.Join(dir, "tls-"+n), p.service)
		if err != nil {
			t.Fatal(err)
		}
		p.args = []string{p.service, "--listen", p.addr, "--data-dir", p.dataDir, "--log-level", "info",
			"--tls-ca-file", tls.CA, "--tls-cert-file", tls.Cert, "--tls-key-file", tls.Key,
			"--oidc-issuer", identity.DevIssuerName, "--oidc-audience", identity.DevAudience, "--oidc-jwks-file", dev.JWKSFile,
			// A frozen dependency costs a caller this long per call.
			"--internal-call-timeout", "5s"}
		if storeURL != "" {
			p.args = append(p.args, "--store", storeURL)
		}
		for _, peer := range suite.Names {
			if peer != p.service {
				p.args = append(p.args, "--"+peer+"-addr", c.addrOf(peer))
			}
		}
		switch p.service {
		case suite.Orchestrator:
			p.args = append(p.args, "--replica-id", n, "--lease-ttl", leaseTTL.String(), "--recovery-interval", recoveryInterval.String())
		case suite.Adapter:
			// The fixture MCP server listens on loopback.
			p.args = append(p.args, "--allow-loopback")
		}
	}
	if c.roots, err = dev.Credentials(suite.Orchestrator); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		c.start(n, "")
		conn, err := serve.Dial(c.procs[n].addr, identity.CallerDialOptions(c.roots.Roots())...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		c.conns[n] = conn
	}
	c.clients = suite.NewClients(c.conns[suite.Registry], c.conns[suite.Policy], c.conns[suite.Evidence], c.conns[suite.Adapter], c.conns["orchestrator-a"])
	for _, n := range names {
		c.waitServing(n)
	}
	return c
}

// markDead records that replica n was killed and stays down.
func (c *cluster) markDead(n string) {
	c.deadMu.Lock()
	defer c.deadMu.Unlock()
	if c.dead == nil {
		c.dead = map[string]bool{}
	}
	c.dead[n] = true
}

// orchestrator is a client of the first orchestrator replica not killed
// for good: where a product client's requests go.
func (c *cluster) orchestrator() orchestratorv1.OrchestratorServiceClient {
	c.deadMu.Lock()
	defer c.deadMu.Unlock()
	for _, n := range c.orchestrators {
		if !c.dead[n] {
			return orchestratorv1.NewOrchestratorServiceClient(c.conns[n])
		}
	}
	c.t.Error("every orchestrator replica is dead")
	return c.clients.Orchestrator
}

// addrOf is where a client of service reaches it: the first orchestrator
// replica for the orchestrator.
func (c *cluster) addrOf(service string) string {
	if service == suite.Orchestrator {
		return c.procs["orchestrator-a"].addr
	}
	return c.procs[service].addr
}

// start runs process n, with fail point spec armed when not empty.
func (c *cluster) start(n, spec string) {
	c.t.Helper()
	if err := c.launch(n, spec); err != nil {
		c.t.Fatal(err)
	}
}

// launch is start for any goroutine: it returns what went wrong.
func (c *cluster) launch(n, spec string) error {
	p := c.procs[n]
	logf, err := os.OpenFile(p.log, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(v0m3Bin, p.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), failpoint.Env+"="+spec, failpoint.MarkEnv+"="+p.mark)
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return fmt.Errorf("start %s: %w", n, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); _ = logf.Close(); close(done) }()
	p.mu.Lock()
	p.cmd, p.done = cmd, done
	p.mu.Unlock()
	c.t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		<-done
	})
	return nil
}

// stop ends process n gracefully (SIGTERM) and waits for it.
func (c *cluster) stop(n string) {
	c.t.Helper()
	p := c.procs[n]
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(time.Minute):
		c.t.Fatalf("%s did not stop within a minute of SIGTERM", n)
	}
}

// restart stops n and starts it again with spec armed.
func (c *cluster) restart(n, spec string) {
	c.t.Helper()
	c.stop(n)
	_ = os.Remove(c.procs[n].mark)
	c.start(n, spec)
	c.waitServing(n)
}

// exited returns the channel closed when n's current run exits.
func (c *cluster) exited(n string) <-chan struct{} {
	p := c.procs[n]
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

// signal sends sig to n's current run.
func (c *cluster) signal(n string, sig syscall.Signal) {
	p := c.procs[n]
	p.mu.Lock()
	defer p.mu.Unlock()
	_ = p.cmd.Process.Signal(sig)
}

// hit reports whether n's armed fail point was reached.
func (c *cluster) hit(n string) bool {
	b, err := os.ReadFile(c.procs[n].mark)
	return err == nil && len(b) > 0
}

// waitServing waits until n answers health checks as SERVING.
func (c *cluster) waitServing(n string) {
	c.t.Helper()
	h := healthpb.NewHealthClient(c.conns[n])
	var (
		resp *healthpb.HealthCheckResponse
		err  error
	)
	serving := testkit.Within(2*time.Minute, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp, err = h.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return true
		}
		select {
		case <-c.exited(n):
			c.t.Fatalf("%s exited before serving; its log:\n%s", n, c.logTail(n))
		default:
		}
		return false
	})
	if !serving {
		c.t.Fatalf("%s not serving after 2 minutes: %v %v; its log:\n%s", n, resp.GetStatus(), err, c.logTail(n))
	}
}

// logTail is the end of n's log, for a failure message.
func (c *cluster) logTail(n string) string {
	b, _ := os.ReadFile(c.procs[n].log)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// logs is the end of every process's log.
func (c *cluster) logs() string {
	var sb strings.Builder
	for n := range c.procs {
		fmt.Fprintf(&sb, "--- %s ---\n%s\n", n, c.logTail(n))
	}
	return sb.String()
}

// As is ctx carrying sub's development token: the cluster is a
// testkit.Minter, for testkit.As.
func (c *cluster) As(ctx context.Context, sub string, groups ...string) context.Context {
	return c.dev.Issuer.As(ctx, sub, groups...)
}
