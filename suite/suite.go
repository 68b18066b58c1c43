// Package suite wires the five V0M3 services together. `v0m3 dev`, the demo
// and the end-to-end tests all use it, so the wiring exists once: each
// service gets its own embedded store file and its own gRPC listener, and
// every service reaches the others over real gRPC, never in-process calls.
package suite

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/deadline"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/serve"
	"github.com/v0m3/v0m3/internal/stranger"
	"github.com/v0m3/v0m3/internal/telemetry"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/adapter"
	"github.com/v0m3/v0m3/services/evidence"
	"github.com/v0m3/v0m3/services/policy"
)

// Service names, in start order (dependencies first).
const (
	Registry     = "registry"
	Policy       = "policy"
	Evidence     = "evidence"
	Adapter      = "adapter"
	Orchestrator = "orchestrator"
)

// services is the suite: one row per service, in start order. Each names
// the services it calls (its peers, reached over gRPC as itself) and the
// constructor that opens its store, builds its server and registers it
// (service.go); Start runs the rows this process serves.
var services = []service{
	{name: Registry, calls: []string{Policy}, start: startRegistry, watchStore: true},
	{name: Policy, calls: []string{Registry}, start: startPolicy, watchStore: true},
	{name: Evidence, calls: []string{Policy}, start: startEvidence, watchStore: true, auditsItself: true},
	{name: Adapter, calls: []string{Registry, Policy, Evidence}, start: startAdapter},
	{name: Orchestrator, calls: []string{Registry, Policy, Adapter, Evidence}, start: startOrchestrator, watchStore: true},
}

// Names lists every service in start order.
var Names = func() []string {
	out := make([]string, 0, len(services))
	for _, svc := range services {
		out = append(out, svc.name)
	}
	return out
}()

// Config configures a suite.
type Config struct {
	// DataDir holds the adapter's work files and, unless Store says
	// otherwise, one embedded store file per service. Required.
	DataDir string
	// Store is the store URL (see OpenStores): "file:///dir" or
	// "redis://host:port/db?prefix=name". Empty means file:// DataDir.
	Store string
	// Services lists the services to run in this process; empty runs all.
	Services []string
	// Listen maps a service name to its listen address; a missing entry
	// listens on an ephemeral loopback port.
	Listen map[string]string
	// Peers maps a service that does not run here to its address.
	Peers map[string]string
	// PolicyFile is a Cedar policy file; "" uses the built-in default.
	PolicyFile string
	// TaskBudget and RequesterBudget override the policy service's default
	// budgets; zero fields keep the defaults.
	TaskBudget, RequesterBudget policy.Limits
	// PolicyClock, when set, is the policy service's clock (handle expiry),
	// so a test can let handles expire without waiting; nil is time.Now.
	PolicyClock func() time.Time
	// Log receives structured logs; nil discards them.
	Log *slog.Logger
	// Fixtures, when set, makes the adapter record or replay discovery and
	// calls (adapter.Fixtures); nil means live only.
	Fixtures *adapter.Fixtures
	// AdapterSessions bounds the adapter's long-lived MCP sessions (calls
	// in flight per connection, idle timeout); the zero value is the
	// default (adapter.SessionConfig).
	AdapterSessions adapter.SessionConfig
	// Direct registers the adapter's direct (non-MCP) adapters by name
	// (adapter.Deps.Direct); nil means none. The suite imports no fixture:
	// `v0m3 dev`, the demo and the tests register the demo's
	// (demo/fixture/fixturedirect) here.
	Direct map[string]adapter.DirectSource
	// AssetDir holds evidence assets (content stored by digest); "" means
	// DataDir/assets.
	AssetDir string
	// EvidenceMaxInlineBytes bounds the text one observation holds inline;
	// zero means evidence.DefaultMaxInlineBytes.
	EvidenceMaxInlineBytes int64
	// AssetThreshold is the content size above which a retrieval whose
	// mapping allows asset references is stored as an asset; zero means
	// orchestrator.DefaultAssetThreshold.
	AssetThreshold int64
	// InternalCallTimeout bounds every unary call one service makes to
	// another (a sooner deadline of the caller stays), except the
	// adapter's Execute and Discover, which carry their own bounds; zero
	// means deadline.DefaultInternalCallTimeout.
	InternalCallTimeout time.Duration
	// Replica configures the orchestrator's ownership of in-flight
	// requests among replicas on one store (orchestrator.Deps: ReplicaID,
	// LeaseTTL, RecoveryInterval, FailPoint); the zero value is the
	// default.
	Replica Replica
	// RetentionAge, when positive, prunes trace protocol events older than
	// it to their sanitized summary every RetentionInterval (default one
	// hour).
	RetentionAge      time.Duration
	RetentionInterval time.Duration
	// SpoolRescan is how often each service reads its spool again (what
	// waits for evidence, kept in its store) for what a stopped replica
	// left there; zero means DefaultSpoolRescan. Each start reads it too.
	SpoolRescan time.Duration
	// Reach says which servers the adapter may start or reach; nil is the
	// development default: loopback allowed (fixtures listen there),
	// private networks refused, stdio executables under the adapter's
	// default roots (adapter.Deps.StdioRoots).
	Reach *Reach
	// Identity says how services prove themselves to each other and how
	// callers are authenticated; nil makes a development setup
	// (identity.Dev) under DataDir/pki: an ephemeral CA with a certificate
	// per service and a development token issuer.
	Identity *Identity
	// CallerRateLimits say how fast each service admits the requests of
	// one product or admin caller (and the task MCP endpoint those of one
	// task's requester); the zero value admits without limit (the
	// commands default to identity.DefaultRateLimits).
	CallerRateLimits identity.RateLimits
	// MCP, when set and the orchestrator runs here, serves the task MCP
	// endpoints (issue 17) on a listener of their own; nil serves none.
	MCP *MCP
	// TracerProvider receives the spans of every server and client here;
	// nil means the process's global provider (telemetry.Setup), which is
	// a no-op unless OTLP export is configured.
	TracerProvider trace.TracerProvider
}

// DefaultInternalCallTimeout bounds each call one service makes to another
// when Config.InternalCallTimeout is zero.
const DefaultInternalCallTimeout = deadline.DefaultInternalCallTimeout

// Replica is how an orchestrator replica shares in-flight requests with
// the others on its store (see orchestrator.Deps).
type Replica struct {
	// ID names the replica as a lease owner; "" means a random id.
	ID string
	// LeaseTTL and RecoveryInterval: zero means the orchestrator's
	// defaults.
	LeaseTTL, RecoveryInterval time.Duration
	// FailPoint stops the orchestrator at a named point as if its process
	// died; tests only.
	FailPoint func(point string) error
}

// MCP configures the orchestrator's task MCP endpoint.
type MCP struct {
	// Addr is the listen address; "" means an ephemeral loopback port.
	Addr string
	// BaseURL is the URL clients reach Addr at (what StartTask hands
	// out); "" means https://<listen address> (http:// when plaintext).
	BaseURL string
	// AllowedHosts are the host names clients may use besides loopback
	// (DNS-rebinding protection; see hostguard).
	AllowedHosts []string
	// TokenTTL is how long a task token lasts; zero means the
	// orchestrator's default.
	TokenTTL time.Duration
	// ApprovalURL is the approval page with "{request_id}" in it, offered
	// to MCP clients through URL elicitation (orchestrator.Deps.ApprovalURL);
	// "" offers none.
	ApprovalURL string
}

// Reach is what the adapter may start and reach (see reach.Policy).
type Reach struct {
	// StdioRoots are where stdio executables must lie; nil means the
	// adapter's default roots, empty means none.
	StdioRoots []string
	// CredentialRoots are where connections' credentials are read, each
	// connection's in <root>/<connection id>/ (adapter.Deps.CredentialRoots);
	// nil means DataDir/credentials, empty means none.
	CredentialRoots []string
	// AllowLoopback admits loopback endpoints.
	AllowLoopback bool
	// AllowPrivateNetworks admits private-range endpoints (in-cluster
	// MCPServer services).
	AllowPrivateNetworks bool
}

// Identity is how the services of a suite know each other and their
// callers.
type Identity struct {
	// Insecure serves and dials plaintext, where peers name themselves and
	// nobody checks: a development flag only, logged loudly.
	Insecure bool
	// Creds returns the credentials of a service running here; required
	// unless Insecure.
	Creds func(service string) (*identity.Credentials, error)
	// Roots are the CA certificates callers of this suite trust (the
	// suite's own Clients use them); nil takes them from the first
	// service's credentials.
	Roots *x509.CertPool
	// Authn verifies the bearer tokens of product and admin callers; nil
	// admits none.
	Authn identity.Authenticator
}

// Clients holds a gRPC client for every service.
type Clients struct {
	Registry     registryv1.RegistryServiceClient
	Policy       policyv1.PolicyServiceClient
	Evidence     evidencev1.EvidenceServiceClient
	Adapter      adapterv1.AdapterServiceClient
	Orchestrator orchestratorv1.OrchestratorServiceClient
}

// Suite is the running set of services.
type Suite struct {
	// Addr maps a service name to the address it serves on.
	Addr map[string]string
	// Clients reach each service over gRPC as a product or admin caller:
	// TLS without a client certificate, so every call needs a bearer token
	// (see As).
	Clients
	// MCPURL is the base URL of the task MCP endpoints; "" when not served.
	MCPURL string
	// Dev is the development identity setup when the suite made one (no
	// Config.Identity): it mints tokens its services accept.
	Dev *identity.Dev

	ident *Identity
	// credentialRoot is the adapter's first credential root ("" if none).
	credentialRoot string
	// callerRate is Config.CallerRateLimits.
	callerRate identity.RateLimits
	// tp is Config.TracerProvider.
	tp trace.TracerProvider
	// internalCallTimeout is Config.InternalCallTimeout.
	internalCallTimeout time.Duration

	conns   []*grpc.ClientConn
	credsMu sync.Mutex
	creds   map[string]*identity.Credentials
	stores  *Stores
	closers []func()
	// flushers hand evidence what the services hold for it (audit
	// records, the adapter's protocol trace events); run first, while
	// evidence still serves.
	flushers []func(context.Context)
	// stoppers end each service's background work (watch streams, pollers,
	// child processes). They run before the servers stop, so a graceful
	// stop never waits on a stream one of our own services holds open.
	stoppers []func()
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	errMu    sync.Mutex
	err      error
}

// Start opens the stores, listens, and serves every service. Close stops
// them and releases the stores.
func Start(ctx context.Context, cfg Config) (s *Suite, err error) {
	if cfg.DataDir == "" {
		return nil, errors.New("suite: data dir is required")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Reach == nil {
		cfg.Reach = &Reach{AllowLoopback: true}
	}
	run, err := toRun(cfg.Services)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	s = &Suite{Addr: map[string]string{}, cancel: cancel, tp: cfg.TracerProvider, internalCallTimeout: cfg.InternalCallTimeout, callerRate: cfg.CallerRateLimits}
	// Every failure below returns a nil suite, so release what was
	// started through this copy.
	started := s
	defer func() {
		if err != nil {
			started.Close()
		}
	}()
	// Listen first so every client can be created before any server runs.
	lis, err := s.listen(cfg, run)
	if err != nil {
		return nil, err
	}
	s.credentialRoot = credentialRoot(cfg)
	if s.ident, err = s.setupIdentity(cfg, cfg.Log); err != nil {
		return nil, err
	}
	if s.Clients, err = s.callerClients(); err != nil {
		return nil, err
	}
	if s.stores, err = openStores(cfg); err != nil {
		return nil, err
	}
	for _, svc := range services {
		if !slices.Contains(run, svc.name) {
			continue
		}
		w, err := s.wire(ctx, &cfg, svc)
		if err != nil {
			return nil, err
		}
		if err := svc.start(w); err != nil {
			return nil, err
		}
		s.serve(ctx, w.srv, lis[svc.name], svc.watchStore)
	}
	return s, nil
}

// toRun returns the services to run here: those named, or all.
func toRun(names []string) ([]string, error) {
	if len(names) == 0 {
		return Names, nil
	}
	for _, name := range names {
		if !slices.Contains(Names, name) {
			return nil, fmt.Errorf("suite: unknown service %q (want one of %v)", name, Names)
		}
	}
	return names, nil
}

// listen opens the listener of each service in run and records every
// service's address (the peers' as configured).
func (s *Suite) listen(cfg Config, run []string) (map[string]net.Listener, error) {
	lis := map[string]net.Listener{}
	for _, name := range run {
		addr := cfg.Listen[name]
		if addr == "" {
			addr = "127.0.0.1:0"
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("suite: listen %s on %s: %w", name, addr, err)
		}
		lis[name] = l
		s.Addr[name] = l.Addr().String()
		s.closers = append(s.closers, func() { _ = l.Close() })
	}
	for name, addr := range cfg.Peers {
		if _, here := s.Addr[name]; !here && addr != "" {
			s.Addr[name] = addr
		}
	}
	return lis, nil
}

// credentialRoot is the adapter's first credential root ("" if none).
func credentialRoot(cfg Config) string {
	switch {
	case cfg.Reach.CredentialRoots == nil:
		return adapter.DefaultCredentialRoot(filepath.Join(cfg.DataDir, "work"))
	case len(cfg.Reach.CredentialRoots) > 0:
		return cfg.Reach.CredentialRoots[0]
	}
	return ""
}

// callerClients dials every service with an address as a product or
// admin caller (Suite.Clients).
func (s *Suite) callerClients() (Clients, error) {
	conns := map[string]*grpc.ClientConn{}
	for _, name := range Names {
		if s.Addr[name] == "" {
			continue // not needed unless a service here calls it; checked in wire
		}
		c, err := serve.Dial(s.Addr[name], s.CallerDialOptions()...)
		if err != nil {
			return Clients{}, err
		}
		s.conns = append(s.conns, c)
		conns[name] = c
	}
	return clientsOf(conns), nil
}

// openStores opens the configured stores: one embedded file per service
// under DataDir unless Config.Store says otherwise.
func openStores(cfg Config) (*Stores, error) {
	if cfg.Store == "" {
		return FileStores(cfg.DataDir), nil
	}
	return OpenStores(cfg.Store)
}

// serve serves srv on l until the suite stops; watchStore makes it
// NOT_SERVING while a shared store is unreachable.
func (s *Suite) serve(ctx context.Context, srv *serve.Server, l net.Listener, watchStore bool) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := srv.Serve(ctx, l); err != nil {
			s.setErr(err)
		}
	}()
	if watchStore && s.stores.Shared() {
		s.wg.Go(func() { srv.WatchDependency(ctx, time.Second, s.stores.Ping) })
	}
}

// DefaultSpoolRescan is Config.SpoolRescan's default.
const DefaultSpoolRescan = 5 * time.Minute

// recoverSpooled runs recover (a queue's Recover: what its spool keeps
// is queued to be sent) once the store answers, trying again while it
// does not, and then every rescan: on a shared store a replica that
// stopped during an evidence outage leaves what waited in the spool, and
// the replicas still running send it without waiting for a restart (a
// record two replicas send is stored once).
func (s *Suite) recoverSpooled(ctx context.Context, log *slog.Logger, rescan time.Duration, recover func(context.Context) error) {
	if rescan <= 0 {
		rescan = DefaultSpoolRescan
	}
	s.wg.Go(func() {
		backoff := time.Second
		for {
			wait := rescan
			if err := recover(ctx); err != nil && ctx.Err() == nil {
				log.Warn("what waits for evidence in this service's store is not read yet; trying again", "err", err)
				wait, backoff = backoff, min(2*backoff, 30*time.Second)
			} else {
				backoff = time.Second
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
	})
}

func (s *Suite) setErr(err error) {
	s.errMu.Lock()
	defer s.errMu.Unlock()
	if s.err == nil {
		s.err = err
	}
}

// CredentialDir is where the adapter here reads connection id's
// credentials (its directory under the first credential root, see
// adapter.Deps.CredentialRoots): put a file there and reference it as
// "file:<name>". "" when no credential root is configured.
func (s *Suite) CredentialDir(connectionID string) string {
	if s.credentialRoot == "" {
		return ""
	}
	return filepath.Join(s.credentialRoot, connectionID)
}

// Err returns the first serving error, if any.
func (s *Suite) Err() error {
	s.errMu.Lock()
	defer s.errMu.Unlock()
	return s.err
}

// Wait blocks until every server has stopped.
func (s *Suite) Wait() { s.wg.Wait() }

// flushWait bounds how long Close waits for audit records and protocol
// trace events still waiting for evidence.
const flushWait = 5 * time.Second

// Close stops every server, closes clients and stores. It is safe to call
// more than once.
func (s *Suite) Close() {
	// What waits for evidence goes first, while it still serves.
	ctx, cancel := context.WithTimeout(context.Background(), flushWait)
	for _, flush := range s.flushers {
		flush(ctx)
	}
	cancel()
	s.flushers = nil
	for i := len(s.stoppers) - 1; i >= 0; i-- {
		s.stoppers[i]()
	}
	s.stoppers = nil
	if s.cancel != nil {
		s.cancel()
	}
	s.wg.Wait()
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
	s.closers = nil
	for _, c := range s.conns {
		_ = c.Close()
	}
	s.conns = nil
	if s.stores != nil {
		_ = s.stores.Close()
		s.stores = nil
	}
}

// setupIdentity returns the suite's identity: the configured one, or a
// development setup under DataDir/pki.
func (s *Suite) setupIdentity(cfg Config, log *slog.Logger) (*Identity, error) {
	id := cfg.Identity
	if id == nil {
		dev, err := identity.NewDev(filepath.Join(cfg.DataDir, "pki"))
		if err != nil {
			return nil, fmt.Errorf("suite: development identity: %w", err)
		}
		authn, err := dev.Authenticator()
		if err != nil {
			return nil, fmt.Errorf("suite: development identity: %w", err)
		}
		s.Dev = dev
		id = &Identity{Creds: dev.Credentials, Authn: authn}
	}
	if id.Insecure {
		log.Warn("INSECURE: serving and dialing plaintext; peer services are NOT authenticated and anyone who can reach a port can claim to be any service. Development only.")
		return id, nil
	}
	if id.Creds == nil {
		return nil, errors.New("suite: service credentials are required unless plaintext is explicitly chosen")
	}
	s.creds = map[string]*identity.Credentials{}
	if id.Roots == nil {
		// Any service's credentials carry the CA bundle callers trust;
		// only those of a service running here are at hand.
		first := Names[0]
		if len(cfg.Services) > 0 {
			first = cfg.Services[0]
		}
		c, err := s.credsFor(id, first)
		if err != nil {
			return nil, err
		}
		id.Roots = c.Roots()
	}
	return id, nil
}

// Credentials returns the credentials of service in this suite (nil when
// insecure), e.g. for a test acting as that peer.
func (s *Suite) Credentials(service string) (*identity.Credentials, error) {
	if s.ident.Insecure {
		return nil, nil
	}
	return s.credsFor(s.ident, service)
}

// credsFor returns (and keeps) the credentials of service.
func (s *Suite) credsFor(id *Identity, service string) (*identity.Credentials, error) {
	s.credsMu.Lock()
	defer s.credsMu.Unlock()
	if c, ok := s.creds[service]; ok {
		return c, nil
	}
	c, err := id.Creds(service)
	if err != nil {
		return nil, fmt.Errorf("suite: credentials of %s: %w", service, err)
	}
	if c.Service() != service {
		return nil, fmt.Errorf("suite: the certificate given to %s names the %s service", service, c.Service())
	}
	s.creds[service] = c
	return c, nil
}

// Guard returns the access guard a server of service name uses in this
// suite: its credentials and the suite's caller authentication. A test
// that serves one service itself (with its own options) uses it.
func (s *Suite) Guard(name string, log *slog.Logger) (*identity.Guard, error) {
	g := &identity.Guard{Authn: s.ident.Authn, Log: log, Limit: identity.NewCallerLimiter(s.callerRate, log)}
	if !s.ident.Insecure {
		c, err := s.credsFor(s.ident, name)
		if err != nil {
			return nil, err
		}
		g.Creds = c
	}
	return g, nil
}

// CallerDialOptions are the dial options of a product or admin caller of
// this suite: TLS trusting the suite's CA (plaintext when insecure).
func (s *Suite) CallerDialOptions() []grpc.DialOption {
	var roots *x509.CertPool
	if !s.ident.Insecure {
		roots = s.ident.Roots
	}
	return append(identity.CallerDialOptions(roots), telemetry.DialOption(s.tp))
}

// PeerClients returns clients that call every service with an address as
// the service self, with self's certificate: how the services here reach
// each other, and how a test or the operator acts as one peer.
func (s *Suite) PeerClients(self string) (Clients, error) {
	var creds *identity.Credentials
	if !s.ident.Insecure {
		c, err := s.credsFor(s.ident, self)
		if err != nil {
			return Clients{}, err
		}
		creds = c
	}
	conns := map[string]*grpc.ClientConn{}
	for _, name := range Names {
		if s.Addr[name] == "" || name == self {
			continue
		}
		opts := append(identity.PeerDialOptions(self, creds, name),
			telemetry.DialOption(s.tp), grpc.WithChainUnaryInterceptor(deadline.UnaryClientInterceptor(s.internalCallTimeout, deadline.Exempt...), telemetry.UnaryClient(self)))
		c, err := serve.Dial(s.Addr[name], opts...)
		if err != nil {
			return Clients{}, err
		}
		s.conns = append(s.conns, c)
		conns[name] = c
	}
	return clientsOf(conns), nil
}

// clientsOf returns a client for every service with a connection.
func clientsOf(conns map[string]*grpc.ClientConn) Clients {
	var c Clients
	if cc := conns[Registry]; cc != nil {
		c.Registry = registryv1.NewRegistryServiceClient(cc)
	}
	if cc := conns[Policy]; cc != nil {
		c.Policy = policyv1.NewPolicyServiceClient(cc)
	}
	if cc := conns[Evidence]; cc != nil {
		c.Evidence = evidencev1.NewEvidenceServiceClient(cc)
	}
	if cc := conns[Adapter]; cc != nil {
		c.Adapter = adapterv1.NewAdapterServiceClient(cc)
	}
	if cc := conns[Orchestrator]; cc != nil {
		c.Orchestrator = orchestratorv1.NewOrchestratorServiceClient(cc)
	}
	return c
}

// As returns ctx carrying a development token for subject in groups, for
// calls through s.Clients. It panics when the suite has no development
// issuer (Config.Identity was given).
func (s *Suite) As(ctx context.Context, subject string, groups ...string) context.Context {
	if s.Dev == nil {
		panic("suite: As needs the development identity (leave Config.Identity nil)")
	}
	return s.Dev.Issuer.As(ctx, subject, groups...)
}

// NewClients returns clients for the five services reached over the given
// connections, e.g. to a `v0m3 dev` process or separate deployments.
func NewClients(registry, policy, evidence, adapter, orchestrator grpc.ClientConnInterface) Clients {
	return Clients{
		Registry:     registryv1.NewRegistryServiceClient(registry),
		Policy:       policyv1.NewPolicyServiceClient(policy),
		Evidence:     evidencev1.NewEvidenceServiceClient(evidence),
		Adapter:      adapterv1.NewAdapterServiceClient(adapter),
		Orchestrator: orchestratorv1.NewOrchestratorServiceClient(orchestrator),
	}
}

// DevReviewer is the development reviewer Connect and ApproveConnection act
// as: in the group the default policy lets review connections.
const DevReviewer = "reviewer@v0m3.dev"

// Connect creates a connection as ctx's caller and has the development
// reviewer approve it, for tests and demos whose subject is not the review
// itself. It needs the development identity (see As).
func (s *Suite) Connect(ctx context.Context, req *registryv1.CreateConnectionRequest) (*registryv1.Connection, error) {
	c, err := s.Registry.CreateConnection(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("create connection: %w", err)
	}
	return s.ApproveConnection(ctx, c)
}

// ApproveConnection has the development reviewer approve c at its current
// config revision, e.g. again after a change to what it runs or reaches.
func (s *Suite) ApproveConnection(ctx context.Context, c *registryv1.Connection) (*registryv1.Connection, error) {
	r, err := s.Registry.ReviewConnection(s.As(ctx, DevReviewer, "reviewers"), &registryv1.ReviewConnectionRequest{
		ConnectionId: c.GetId(), ConfigRevision: c.GetConfigRevision(), Approve: true, Note: "approved by the development reviewer",
	})
	if err != nil {
		return nil, fmt.Errorf("review connection %s: %w", c.GetId(), err)
	}
	return r, nil
}

// mcpTTL is the configured task token lifetime (zero: the default).
func mcpTTL(m *MCP) time.Duration {
	if m == nil {
		return 0
	}
	return m.TokenTTL
}

// approvalURL is the configured approval page ("" for none).
func approvalURL(m *MCP) string {
	if m == nil {
		return ""
	}
	return m.ApprovalURL
}

// listenMCP listens for the task MCP endpoint and returns the listener and
// the base URL clients reach it at.
func (s *Suite) listenMCP(m *MCP, tls bool) (net.Listener, string, error) {
	addr := m.Addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", fmt.Errorf("suite: listen for the task MCP endpoint on %s: %w", addr, err)
	}
	s.closers = append(s.closers, func() { _ = l.Close() })
	base := m.BaseURL
	if base == "" {
		scheme := "http"
		if tls {
			scheme = "https"
		}
		base = scheme + "://" + l.Addr().String()
	}
	return l, base, nil
}

// serveMCP serves the task MCP endpoint on l until the suite stops: TLS
// with the orchestrator's server certificate when it has credentials.
func (s *Suite) serveMCP(ctx context.Context, l net.Listener, h http.Handler, creds *identity.Credentials, log *slog.Logger) {
	srv := stranger.HTTPServer(h)
	if creds != nil {
		srv.TLSConfig = creds.ServerTLS()
	}
	s.stoppers = append(s.stoppers, func() { _ = srv.Close() })
	s.wg.Go(func() {
		var err error
		if creds != nil {
			err = srv.ServeTLS(l, "", "")
		} else {
			err = srv.Serve(l)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) && ctx.Err() == nil {
			log.Warn("task MCP endpoint stopped", "err", err)
		}
	})
	log.Info("serving task MCP endpoints", "addr", l.Addr().String(), "path", "/tasks/{task_id}/mcp")
}

// lateAudit is the evidence service's own audit log, bound once its
// server exists; a record before that waits in the recorder's queue.
type lateAudit struct {
	to atomic.Pointer[evidence.SelfAudit]
}

func (l *lateAudit) bind(a evidence.SelfAudit) { l.to.Store(&a) }

// AppendAuditRecord appends to the bound log, or is UNAVAILABLE before.
func (l *lateAudit) AppendAuditRecord(ctx context.Context, in *evidencev1.AppendAuditRecordRequest, opts ...grpc.CallOption) (*evidencev1.AuditRecord, error) {
	a := l.to.Load()
	if a == nil {
		return nil, apierror.New(codes.Unavailable, "DEPENDENCY_UNAVAILABLE", "the evidence service is starting", nil)
	}
	return a.AppendAuditRecord(ctx, in, opts...)
}
