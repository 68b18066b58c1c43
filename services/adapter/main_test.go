package adapter

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/fieldbehavior/fieldbehaviortest"
	"github.com/v0m3/v0m3/internal/grant"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/ids"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// secretEnv is set in the test process; no local server may see it.
const secretEnv = "V0M3_TEST_SECRET_TOKEN"

var (
	fixtureBin string // the built fixture command
	escapeBin  string // the built hostile escape server
	httpURL    string // a hostile fixture served over streamable HTTP
)

// TestMain builds the fixture into a binary and starts one HTTP instance.
func TestMain(m *testing.M) {
	// The test binary is the sandbox launcher of the servers it starts.
	if IsSandboxLaunch() {
		RunSandboxLaunch()
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "adapter-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	// Local servers run under uids of their own: the fixture must be
	// reachable by them, as a server's executable is in production.
	if err := os.Chmod(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fixtureBin = filepath.Join(dir, "fixture")
	escapeBin = filepath.Join(dir, "escape")
	for bin, pkg := range map[string]string{fixtureBin: "github.com/v0m3/v0m3/demo/fixture/fixturecmd", escapeBin: "github.com/v0m3/v0m3/services/adapter/internal/escapecmd"} {
		build := exec.Command("go", "build", "-o", bin, pkg)
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "build "+pkg+":", err)
			return 1
		}
	}
	os.Setenv(secretEnv, "hunter2")

	srv := exec.Command(fixtureBin, "--transport", "http", "--addr", "127.0.0.1:0", "--hostile")
	stderr, err := srv.StderrPipe()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := srv.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "start http fixture:", err)
		return 1
	}
	defer func() { _ = srv.Process.Kill(); _ = srv.Wait() }()
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		if u, ok := strings.CutPrefix(sc.Text(), "listening on "); ok {
			httpURL = u
			break
		}
	}
	if httpURL == "" {
		fmt.Fprintln(os.Stderr, "http fixture did not report its address")
		return 1
	}
	go func() {
		for sc.Scan() {
		}
	}()
	return m.Run()
}

// fakeRegistry is an in-process registry dependency: connections by id,
// snapshots recorded as given.
type fakeRegistry struct {
	registryv1.UnimplementedRegistryServiceServer
	mu        sync.Mutex
	conns     map[string]*registryv1.Connection
	snapshots []*registryv1.DiscoverySnapshot
	// gets counts GetConnection calls.
	gets atomic.Int64
	// credRoot is the adapter's credential root and planted the secrets
	// (by file name) that add provisions into each connection's directory
	// there, as a platform mounts a connection's Secret.
	credRoot string
	planted  map[string]string
}

// provision writes the planted secrets c's references name into c's
// credential directory.
func (f *fakeRegistry) provision(c *registryv1.Connection) {
	for _, ref := range []string{c.GetCredentialRef(), c.GetTransport().GetStreamableHttp().GetOauth().GetClientSecretRef()} {
		name, ok := strings.CutPrefix(ref, "file:")
		v, planted := f.planted[name]
		if !ok || !planted {
			continue
		}
		dir := filepath.Join(f.credRoot, c.GetId())
		if err := os.MkdirAll(dir, 0o700); err != nil {
			panic(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(v+"\n"), 0o600); err != nil {
			panic(err)
		}
	}
}

func (f *fakeRegistry) GetConnection(_ context.Context, req *registryv1.GetConnectionRequest) (*registryv1.Connection, error) {
	f.gets.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.conns[req.GetId()]
	if !ok {
		return nil, apierror.New(codes.NotFound, "CONNECTION_UNKNOWN", "no such connection", nil)
	}
	return proto.CloneOf(c), nil
}

func (f *fakeRegistry) RecordSnapshot(_ context.Context, req *registryv1.RecordSnapshotRequest) (*registryv1.DiscoverySnapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := req.GetSnapshot()
	s.Id = fmt.Sprintf("snap_%d", len(f.snapshots)+1)
	f.snapshots = append(f.snapshots, s)
	return s, nil
}

// ReportSandbox records the sandbox constraints the adapter reports,
// compare-and-set on the config revision. The fake has no
// UpdateConnection: the adapter changes no connection configuration.
func (f *fakeRegistry) ReportSandbox(_ context.Context, req *registryv1.ReportSandboxRequest) (*registryv1.Connection, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.conns[req.GetConnectionId()]
	if !ok {
		return nil, apierror.New(codes.NotFound, "CONNECTION_UNKNOWN", "no such connection", nil)
	}
	if req.GetConfigRevision() != c.GetConfigRevision() {
		return nil, apierror.New(codes.Aborted, "CONFIG_REVISION_CONFLICT", "stale revision", nil)
	}
	c = proto.CloneOf(c)
	c.Sandbox = req.GetSandbox()
	f.conns[c.Id] = c
	return c, nil
}

func (f *fakeRegistry) add(c *registryv1.Connection) *registryv1.Connection {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c.Id == "" {
		c.Id = fmt.Sprintf("conn_%d", len(f.conns)+1)
	}
	if c.ConfigRevision == 0 {
		c.ConfigRevision = 1
	}
	if c.State == registryv1.ConnectionState_CONNECTION_STATE_UNSPECIFIED {
		c.State = registryv1.ConnectionState_CONNECTION_STATE_ACTIVE
	}
	if c.ReviewState == registryv1.ReviewState_REVIEW_STATE_UNSPECIFIED {
		c.ReviewState = registryv1.ReviewState_REVIEW_STATE_APPROVED
	}
	f.provision(c)
	f.conns[c.Id] = c
	return proto.CloneOf(c)
}

// plant makes value a secret the registry provisions into the credential
// directory of every connection added with the returned reference.
func (e *env) plant(value string) (ref string) {
	e.registry.mu.Lock()
	defer e.registry.mu.Unlock()
	name := fmt.Sprintf("token-%d", len(e.registry.planted)+1)
	e.registry.planted[name] = value
	return "file:" + name
}

// plantSecret plants a fresh secret (see plant).
func (e *env) plantSecret(t *testing.T) (secret, ref string) {
	t.Helper()
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	secret = "planted-" + hex.EncodeToString(b)
	return secret, e.plant(secret)
}

// fakeEvidence records appended trace events.
type fakeEvidence struct {
	evidencev1.UnimplementedEvidenceServiceServer
	mu     sync.Mutex
	events []*evidencev1.TraceEvent
	// down makes every append fail as an evidence outage does.
	down bool
}

func (f *fakeEvidence) AppendTrace(_ context.Context, req *evidencev1.AppendTraceRequest) (*evidencev1.TraceEvent, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return nil, status.Error(codes.Unavailable, "evidence is down")
	}
	f.events = append(f.events, req.GetEvent())
	return req.GetEvent(), nil
}

func (f *fakeEvidence) setDown(down bool) {
	f.mu.Lock()
	f.down = down
	f.mu.Unlock()
}

func (f *fakeEvidence) appended() []*evidencev1.TraceEvent {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.events)
}

// fakePolicy records health reports.
type fakePolicy struct {
	policyv1.UnimplementedPolicyServiceServer
	mu      sync.Mutex
	reports []*policyv1.ReportConnectionHealthRequest
}

func (f *fakePolicy) ReportConnectionHealth(_ context.Context, req *policyv1.ReportConnectionHealthRequest) (*policyv1.ConnectionHealth, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reports = append(f.reports, req)
	return &policyv1.ConnectionHealth{ConnectionId: req.GetConnectionId(), State: req.GetState()}, nil
}

func (f *fakePolicy) last() *policyv1.ReportConnectionHealthRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.reports) == 0 {
		return nil
	}
	return f.reports[len(f.reports)-1]
}

type env struct {
	srv      *Server
	registry *fakeRegistry
	evidence *fakeEvidence
	policy   *fakePolicy
}

// newEnv serves fake dependencies over bufconn and returns an adapter using
// them.
func newEnv(t testing.TB) *env {
	t.Helper()
	return newEnvLog(t, slog.New(slog.DiscardHandler))
}

// newEnvLog is newEnv with the adapter logging to log.
func newEnvLog(t testing.TB, log *slog.Logger) *env {
	t.Helper()
	return newEnvWith(t, log, func(*Deps) {})
}

// newEnvWith is newEnvLog with the adapter's dependencies changed by
// configure.
func newEnvWith(t testing.TB, log *slog.Logger, configure func(*Deps)) *env {
	t.Helper()
	e := &env{registry: &fakeRegistry{conns: map[string]*registryv1.Connection{}, credRoot: t.TempDir(), planted: map[string]string{}}, evidence: &fakeEvidence{}, policy: &fakePolicy{}}
	deps := testkit.Serve(t, func(g *grpc.Server) {
		registryv1.RegisterRegistryServiceServer(g, e.registry)
		evidencev1.RegisterEvidenceServiceServer(g, e.evidence)
		policyv1.RegisterPolicyServiceServer(g, e.policy)
	}, grpc.UnaryInterceptor(fieldbehaviortest.UnaryServer()))
	cc := deps.Dial(t)
	d := Deps{
		// The adapter's own certificate: grants verify against its CA.
		Credentials: testPKI(t).adapter,
		Registry:    registryv1.NewRegistryServiceClient(cc),
		Policy:      policyv1.NewPolicyServiceClient(cc),
		Evidence:    evidencev1.NewEvidenceServiceClient(cc),
		WorkDir:     t.TempDir(),
		// The fixture's build directory is the only stdio root; the HTTP
		// fixture listens on loopback.
		StdioRoots:      []string{filepath.Dir(fixtureBin)},
		CredentialRoots: []string{e.registry.credRoot},
		AllowLoopback:   true,
	}
	configure(&d)
	e.srv = NewServer(d, log)
	// Registered after the fake dependencies' server, so it runs first:
	// the adapter closes while they still answer.
	t.Cleanup(func() { _ = e.srv.Close() })
	return e
}

// stdioConn registers a connection that runs the fixture over stdio.
func (e *env) stdioConn(args ...string) *registryv1.Connection {
	return e.registry.add(&registryv1.Connection{DisplayName: "V0M3 Sources (stdio)", Transport: &registryv1.Transport{
		Kind: &registryv1.Transport_Stdio{Stdio: &registryv1.StdioTransport{
			Command: fixtureBin,
			Args:    append([]string{"--transport", "stdio"}, args...),
			Env:     map[string]string{"FIXTURE_MODE": "test"},
		}},
	}})
}

// httpConn registers a connection to a streamable HTTP endpoint.
func (e *env) httpConn(url string) *registryv1.Connection {
	return e.registry.add(&registryv1.Connection{DisplayName: "V0M3 Sources (http)", Transport: &registryv1.Transport{
		Kind: &registryv1.Transport_StreamableHttp{StreamableHttp: &registryv1.StreamableHTTPTransport{Url: url}},
	}})
}

// transports runs fn against a hostile fixture over each transport.
func transports(t *testing.T, fn func(t *testing.T, e *env, conn *registryv1.Connection)) {
	t.Helper()
	for _, kind := range []string{"stdio", "http"} {
		t.Run(kind, func(t *testing.T) {
			e := newEnv(t)
			conn := e.httpConn(httpURL)
			if kind == "stdio" {
				conn = e.stdioConn("--hostile")
			}
			fn(t, e, conn)
		})
	}
}

var _ adapterv1.AdapterServiceServer = (*Server)(nil)

// pki is a CA with the two identities an Execute involves: the
// orchestrator that signs grants and the adapter that verifies them.
type pki struct {
	ca                    *identity.CA
	adapter, orchestrator *identity.Credentials
}

var testPKIOnce = sync.OnceValues(func() (*pki, error) {
	ca, err := identity.NewCA()
	if err != nil {
		return nil, err
	}
	p := &pki{ca: ca}
	if p.adapter, err = ca.Issue(identity.Adapter); err != nil {
		return nil, err
	}
	if p.orchestrator, err = ca.Issue(identity.Orchestrator); err != nil {
		return nil, err
	}
	return p, nil
})

// testPKI returns the CA every test adapter trusts.
func testPKI(t testing.TB) *pki {
	t.Helper()
	p, err := testPKIOnce()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// granted returns req carrying the orchestrator's execution grant for
// exactly it, as the orchestrator sends every call.
func granted(t testing.TB, req *adapterv1.ExecuteRequest) *adapterv1.ExecuteRequest {
	t.Helper()
	return grantedBy(t, testPKI(t).orchestrator, req, time.Minute)
}

// grantedBy is granted with the signer and lifetime given.
func grantedBy(t testing.TB, signer *identity.Credentials, req *adapterv1.ExecuteRequest, ttl time.Duration) *adapterv1.ExecuteRequest {
	t.Helper()
	g, err := grant.For(req, ids.New("grant"), "int_test", "test_capability", time.Now(), ttl)
	if err != nil {
		t.Fatal(err)
	}
	req = proto.CloneOf(req)
	if req.Grant, err = grant.Sign(signer, g); err != nil {
		t.Fatal(err)
	}
	return req
}
