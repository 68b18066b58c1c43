// Package adapter keeps V0M3's transports: an MCP client over stdio and
// streamable HTTP (the real go-sdk), discovery into registry snapshots, and
// execution of already authorized attempts under a mapping's limits, with
// delivery-stage evidence and a protocol trace. Nothing a server sends is
// trusted: limits are enforced while bytes arrive, before anything is
// returned or logged, and remote free text is carried only as untrusted
// detail. The adapter owns no canonical state.
package adapter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/grant"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/reach"
	"github.com/v0m3/v0m3/internal/retryqueue"
	"github.com/v0m3/v0m3/internal/review"
	"github.com/v0m3/v0m3/internal/telemetry"
	"github.com/v0m3/v0m3/internal/tracesend"
)

// Deps are the services the adapter calls.
type Deps struct {
	// Registry supplies connections and records snapshots. Required.
	Registry registryv1.RegistryServiceClient
	// Policy receives connection health reports; may be nil.
	Policy policyv1.PolicyServiceClient
	// Evidence receives protocol-layer trace events; may be nil.
	Evidence evidencev1.EvidenceServiceClient
	// TraceSpool keeps the protocol trace events waiting for evidence
	// across a restart (see RecoverTraces); nil keeps them in memory only.
	TraceSpool retryqueue.Spool
	// WorkDir is the adapter's data directory, the root of per-connection
	// working directories for local servers; "" means
	// os.TempDir()/v0m3-work. The adapter keeps it mode 0700.
	WorkDir string
	// Sandbox says how local servers are isolated; the zero value is the
	// default (see SandboxConfig).
	Sandbox SandboxConfig
	// Direct maps a direct (non-MCP) adapter name to its implementation,
	// registered by the composition root (e.g. the demo's fixture library
	// in `v0m3 dev`); nil means none, and a connection naming one is
	// refused with DIRECT_ADAPTER_UNKNOWN.
	Direct map[string]DirectSource
	// Fixtures, when set, records or replays discovery and calls (see
	// Fixtures); nil means live only.
	Fixtures *Fixtures
	// Sessions says how Execute's long-lived sessions are bounded; the
	// zero value is the default (see SessionConfig).
	Sessions SessionConfig

	// Reachability (internal/reach): what connections may reach.
	// Link-local and cloud metadata endpoints are refused whatever is set.

	// StdioRoots are the directories (or single executable files) under
	// which a local server's executable must lie, after symlinks are
	// resolved; WorkDir is never allowed. nil means the development
	// default, reach.DefaultStdioRoots(): this program's own executable,
	// the user cache directory's v0m3 folder (npm-installed servers) and
	// the system temp directory (test builds), each checked for ownership.
	// A non-nil empty list allows no local server. Flag: --stdio-roots.
	StdioRoots []string
	// CredentialRoots are the directories under which connections'
	// credentials are read: a connection's credential_ref (and OAuth
	// client_secret_ref) resolves only inside <root>/<connection id>/,
	// e.g. the connection's Secret mounted there; anything else is
	// refused (CREDENTIAL_REF_NOT_ALLOWED) before it is opened. nil means
	// DefaultCredentialRoot(WorkDir). A non-nil empty list reads no
	// credential. Roots overlapping WorkDir are dropped: local servers
	// write there. Flag: --credential-roots.
	CredentialRoots []string
	// AllowLoopback lets connections reach loopback addresses: for
	// development and tests. Refused when false. Flag: --allow-loopback.
	AllowLoopback bool
	// AllowPrivateNetworks lets connections reach private addresses
	// (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7), e.g. in-cluster
	// servers. Refused when false. Flag: --allow-private-networks.
	AllowPrivateNetworks bool

	// Credentials are the adapter's own service credentials: Execute
	// verifies the orchestrator's execution grants against their CA and
	// signs receipt attestations with them. Without them no grant can be
	// verified and Execute refuses every call (GRANT_UNVERIFIABLE), unless
	// InsecureUngranted is set.
	Credentials *identity.Credentials
	// InsecureUngranted lets an adapter without Credentials execute calls
	// that carry no verifiable grant. It is for plaintext development only
	// (--insecure-plaintext), where no peer is authenticated anyway;
	// NewServer logs it loudly. It has no effect when Credentials are set.
	InsecureUngranted bool
}

// reachPolicy is the policy deps configure for an adapter working in
// workDir.
func (d Deps) reachPolicy(workDir string) reach.Policy {
	roots := d.StdioRoots
	if roots == nil {
		roots = reach.DefaultStdioRoots()
	}
	return reach.Policy{
		StdioRoots:    roots,
		DenyDirs:      []string{workDir},
		AllowLoopback: d.AllowLoopback,
		AllowPrivate:  d.AllowPrivateNetworks,
	}
}

// Server implements adapterv1.AdapterServiceServer.
//
// Execute keeps long-lived sessions (see pool): one per connection at its
// current configuration, shared by concurrent calls up to a bound, so a
// call costs one request, not a connect, an initialize and (for a local
// server) a process start. What per-call sessions gave stays: a mapping's
// limits are exact for the one call they were authorized for (the meter
// bounds every message by the largest limit in flight and checks each
// call's response against its own limit); a session that broke, was cut
// at the bound or was abandoned mid-response serves no further call; a
// config revision (credential rotation included) takes effect at the next
// call while calls in flight finish on the old session; and a server that
// changes its lists is rediscovered at once. Discover and Health still
// open a fresh session each: they describe and probe the server as a new
// client finds it.
type Server struct {
	adapterv1.UnimplementedAdapterServiceServer
	deps          Deps
	log           *slog.Logger
	workDir       string
	reach         reach.Policy
	sandbox       *sandboxer
	httpTransport *http.Transport
	direct        map[string]DirectSource
	fixtures      *Fixtures
	// credRoots are where connections' credentials may be read.
	credRoots credentialRoots

	// grants remembers the execution grants already used.
	grants *grant.Ledger
	// traces delivers protocol events, concurrent calls' together;
	// those evidence cannot take now wait in it (retryqueue).
	traces *retryqueue.Queue[*evidencev1.TraceEvent]

	// pool keeps Execute's sessions.
	pool *pool
	// readings keeps the connections last read and found usable, for
	// Execute (see executeConnection).
	readings readings

	// oauth keeps each OAuth connection's authorizer (see oauth.go).
	oauth authorizers
	// legacy remembers the servers that do not take server/discover.
	legacy legacyServers

	// procStarts counts local server processes started, procLive those
	// not yet reaped.
	procStarts, procLive atomic.Int64

	mu     sync.Mutex
	live   map[*session]struct{}
	closed bool
}

// NewServer returns an adapter server.
func NewServer(deps Deps, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	wd := deps.WorkDir
	if wd == "" {
		wd = filepath.Join(os.TempDir(), "v0m3-work")
	}
	policy := deps.reachPolicy(wd)
	credRoots := deps.credentialRoots(wd, log)
	ht := http.DefaultTransport.(*http.Transport).Clone()
	ht.Proxy = nil // the adapter reaches servers directly, never via an environment proxy
	// Every connection is decided at dial time, after DNS resolution: a
	// name that resolves (or is rebound) to a refused address gets no
	// packet.
	ht.DialContext = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, Control: policy.Control}).DialContext
	ht.ResponseHeaderTimeout = 0
	ht.MaxResponseHeaderBytes = 64 << 10
	direct := maps.Clone(deps.Direct)
	fx := deps.Fixtures
	if fx != nil && fx.Mode == FixturesOff {
		fx = nil
	}
	if deps.Credentials == nil {
		if deps.InsecureUngranted {
			log.Warn("INSECURE: the adapter has no certificate and executes calls without a verified execution grant; anyone who reaches its port can run any connection. Development only.")
		} else {
			log.Warn("the adapter has no certificate: it cannot verify execution grants and refuses every Execute")
		}
	}
	s := &Server{deps: deps, log: log, workDir: wd, reach: policy, sandbox: newSandboxer(deps.Sandbox, wd, log), httpTransport: ht, live: map[*session]struct{}{}, direct: direct, fixtures: fx, credRoots: credRoots,
		grants: grant.NewLedger()}
	s.pool = newPool(s, deps.Sessions)
	if deps.Evidence != nil {
		send := tracesend.New(deps.Evidence)
		s.traces = retryqueue.New(log, retryqueue.Options[*evidencev1.TraceEvent]{
			What: "protocol trace event", Spool: deps.TraceSpool,
			Waiting: telemetry.EvidenceBacklog.WithLabelValues("adapter", "protocol_trace_event"),
			Lost:    telemetry.EvidenceLost.WithLabelValues("adapter", "protocol_trace_event"),
			Encode:  func(ev *evidencev1.TraceEvent) ([]byte, error) { return proto.Marshal(ev) },
			Decode: func(b []byte) (*evidencev1.TraceEvent, error) {
				ev := &evidencev1.TraceEvent{}
				return ev, proto.Unmarshal(b, ev)
			},
			Send: func(ctx context.Context, ev *evidencev1.TraceEvent) error {
				return send.Send(ctx, []*evidencev1.TraceEvent{ev})
			},
			Describe: func(ev *evidencev1.TraceEvent) []any {
				return []any{"task_id", ev.GetTaskId(), "attempt_id", ev.GetProtocol().GetRequestId()}
			},
		})
	}
	return s
}

// FlushTraces is called when the service stops, while evidence still
// serves: it appends the protocol trace events still waiting for
// evidence, until ctx ends; the rest stay in the TraceSpool for the next
// start (without one, they are logged as lost).
func (s *Server) FlushTraces(ctx context.Context) {
	if s.traces != nil {
		s.traces.Close(ctx)
	}
}

// RecoverTraces queues the protocol trace events the TraceSpool kept
// across a restart (of this adapter or another replica) to be appended;
// call it once the service starts.
func (s *Server) RecoverTraces(ctx context.Context) error {
	if s.traces == nil {
		return nil
	}
	return s.traces.Recover(ctx)
}

// Close shuts the adapter down cleanly: it refuses new sessions, closes
// every open one (a local server gets its stdin closed, then is killed
// after a grace period) and releases idle HTTP connections. Calls in
// flight end with the outcome their transport's closing implies.
func (s *Server) Close() error {
	s.pool.shutdown()
	s.mu.Lock()
	s.closed = true
	open := make([]*session, 0, len(s.live))
	for ss := range s.live {
		open = append(open, ss)
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, ss := range open {
		wg.Go(ss.close)
	}
	wg.Wait()
	s.httpTransport.CloseIdleConnections()
	return nil
}

// connection fetches a connection and refuses a retired one and one a
// reviewer has not approved at its current configuration. Discover,
// Execute and Health call it before they start, dial or send anything.
func (s *Server) connection(ctx context.Context, id string) (*registryv1.Connection, error) {
	conn, err := s.deps.Registry.GetConnection(ctx, &registryv1.GetConnectionRequest{Id: id})
	if err != nil {
		s.readings.forget(id)
		return nil, apierror.Propagate(err, "get connection")
	}
	if conn.GetState() == registryv1.ConnectionState_CONNECTION_STATE_RETIRED {
		s.readings.forget(id)
		s.pool.drop(id)
		s.oauth.drop(id)
		return nil, apierror.New(codes.FailedPrecondition, "CONNECTION_RETIRED",
			fmt.Sprintf("connection %s is retired; it is kept for history and never used again", id),
			map[string]string{"connection_id": id})
	}
	if err := review.Approved(conn); err != nil {
		s.readings.forget(id)
		s.pool.drop(id)
		s.oauth.drop(id)
		s.log.InfoContext(ctx, "refused to use an unreviewed connection", "connection_id", id,
			"config_revision", conn.GetConfigRevision(), "review_state", conn.GetReviewState().String())
		return nil, err
	}
	s.readings.put(conn)
	return conn, nil
}

// session is one MCP client session over a metered transport.
type session struct {
	cs      *mcp.ClientSession
	m       *meter
	creds   *credentials
	release func()
	once    sync.Once
	srv     *Server
	// listChanged counts tools/list_changed, resources/list_changed and
	// prompts/list_changed notifications the server sent during the
	// session.
	listChanged atomic.Int64
	// info is the server's scrubbed self-description, computed once.
	info func() *registryv1.ServerInfo
	// connectionID is the connection the session serves, for logs.
	connectionID string
	// calls are the calls in flight, for what the server says during
	// them besides their responses.
	calls callStates
}

// Connect retry: a connection that fails before anything was sent is
// retried with exponential backoff while the caller's deadline allows.
const (
	connectAttempts = 3
	connectBackoff  = 200 * time.Millisecond
)

// closeGrace is how long closing a session waits for calls still in
// flight on it before it ends the transport under them.
const closeGrace = time.Second

// errAdapterClosed is returned once Close was called.
var errAdapterClosed = errors.New("adapter is shutting down")

// openSession connects to conn's server and initializes a session whose
// inbound messages are limited to limit bytes each. A failed connect is
// retried with backoff (nothing was sent, so a retry repeats nothing);
// a limit hit, an unresolvable credential or the caller's deadline ends
// the retries. The returned session is non-nil even on error, so the
// caller can consult its meter. onListChanged, when not nil, is called
// (on the client library's goroutine: it must not block) whenever the
// server says one of its lists changed.
func (s *Server) openSession(ctx context.Context, conn *registryv1.Connection, limit int64, onListChanged func()) (*session, error) {
	var (
		ss  *session
		err error
	)
	creds := s.newCredentials(conn)
	backoff := connectBackoff
	for attempt := 1; ; attempt++ {
		ss, err = s.connectOnce(ctx, conn, limit, creds, onListChanged)
		if err == nil || attempt == connectAttempts || !retryable(err, ss.m) {
			return ss, err
		}
		s.log.Info("connect failed; retrying", "connection_id", conn.GetId(), "attempt", attempt, "backoff", backoff, "error", logText(err))
		select {
		case <-ctx.Done():
			return ss, err
		case <-time.After(backoff):
		}
		backoff *= 2
	}
}

func retryable(err error, m *meter) bool {
	if isCredentialError(err) || authFailure(err, m) != nil || isLimitError(err, m) || refusal(err, m) != nil || errors.Is(err, errAdapterClosed) || isSandboxSetup(err) ||
		unsupportedVersion(err) != nil {
		return false
	}
	_, isStatus := status.FromError(err)
	return !isStatus
}

func (s *Server) connectOnce(ctx context.Context, conn *registryv1.Connection, limit int64, creds *credentials, onListChanged func()) (*session, error) {
	m := newMeter(limit)
	ss := &session{m: m, creds: creds, srv: s, connectionID: conn.GetId()}
	ss.info = sync.OnceValue(func() *registryv1.ServerInfo { return serverInfoOf(ss) })
	d, err := s.dialerFor(conn, creds, onListChanged != nil)
	if err != nil {
		return ss, err
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return ss, errAdapterClosed
	}
	t, release, err := d.open(ctx, m)
	if err != nil {
		return ss, err
	}
	if sd, ok := d.(*stdioDialer); ok && sd.sandbox != nil {
		s.recordSandbox(ctx, conn, sd.sandbox)
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "v0m3-adapter", Version: "1"}, &mcp.ClientOptions{
		// No roots or sampling are offered to servers. Elicitation is
		// offered so that a server that asks for user input hears
		// "declined" at once instead of waiting, or, where the call's
		// mapping allows it, its form's defaults (see session.elicit).
		Capabilities:       &mcp.ClientCapabilities{},
		ElicitationHandler: ss.elicit,
		// input_required results are handled by session.inputRequired.
		MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true},
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			ss.progressed(req.Params)
		},
		Logger: slog.New(slog.DiscardHandler),
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			ss.changed(onListChanged)
		},
		ResourceListChangedHandler: func(context.Context, *mcp.ResourceListChangedRequest) {
			ss.changed(onListChanged)
		},
		PromptListChangedHandler: func(context.Context, *mcp.PromptListChangedRequest) {
			ss.changed(onListChanged)
		},
	})
	client.AddSendingMiddleware(ss.inputRequired)
	// The initialize result may describe the server at length: it may be
	// as large as a discovery message, whatever the session's floor.
	init := m.register("initialize", "", discoveryMessageLimit)
	opts := s.legacy.sessionOptions(conn, time.Now())
	cs, err := client.Connect(ctx, t, opts)
	m.unregister(init)
	if err != nil {
		release()
		return ss, creds.err(err)
	}
	if opts == nil && s.legacy.observe(conn, cs.InitializeResult().ProtocolVersion, time.Now()) {
		s.log.Debug("the server did not take server/discover; its next sessions start with initialize",
			"connection_id", conn.GetId(), "protocol_version", truncate(cs.InitializeResult().ProtocolVersion, maxVersionBytes))
	}
	ss.cs, ss.release = cs, release
	m.endOnIdleFlood(func() { _ = cs.Close() })
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		go ss.close()
		return ss, errAdapterClosed
	}
	s.live[ss] = struct{}{}
	return ss, nil
}

// changed counts a list change and tells onListChanged, if set.
func (ss *session) changed(onListChanged func()) {
	ss.listChanged.Add(1)
	if onListChanged != nil {
		onListChanged()
	}
}

// close ends the session and then the transport (killing a local server
// that does not exit), bounded in time. It is safe to call more than once.
func (ss *session) close() {
	ss.once.Do(func() {
		done := make(chan struct{})
		go func() {
			_ = ss.cs.Close()
			close(done)
		}()
		// A session closes at once unless a call is still in flight on
		// it (the client library waits for it). It gets a grace period,
		// then its transport ends (a local server's stdin closes, and it
		// is killed if it does not exit), which ends the call too.
		select {
		case <-done:
		case <-time.After(closeGrace):
		}
		ss.release()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
		}
		ss.srv.mu.Lock()
		delete(ss.srv.live, ss)
		ss.srv.mu.Unlock()
	})
}

// recordSandbox records on the connection the sandbox constraints applied
// to its local server, when they differ from what is recorded, through the
// registry's ReportSandbox (the adapter's own RPC, which writes nothing
// else and creates no config revision). It is a compare-and-set on the
// revision just read, so a concurrent reconfiguration wins and the next
// start records again. A failure is logged, not returned: the constraints
// were applied either way.
func (s *Server) recordSandbox(ctx context.Context, conn *registryv1.Connection, sb *registryv1.SandboxConstraints) {
	if proto.Equal(conn.GetSandbox(), sb) {
		return
	}
	if sb.GetNetwork() != registryv1.NetworkIsolation_NETWORK_ISOLATION_ENFORCED {
		s.log.Warn("network isolation not enforced for a local server: the kernel refused a new network namespace",
			"connection_id", conn.GetId())
	}
	if sb.GetIdentity().GetKind() != registryv1.IdentityKind_IDENTITY_KIND_DEDICATED_UID {
		s.log.Warn("a local server shares the adapter's host uid: it may signal the adapter and other servers and reach the adapter's data directory",
			"connection_id", conn.GetId(), "identity", sb.GetIdentity().GetKind().String(), "process_limit", sb.GetProcessLimit().String())
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := s.deps.Registry.ReportSandbox(ctx, &registryv1.ReportSandboxRequest{
		ConnectionId:   conn.GetId(),
		ConfigRevision: conn.GetConfigRevision(),
		Sandbox:        sb,
	}); err != nil {
		s.log.Warn("record sandbox constraints", "connection_id", conn.GetId(), "error", logText(err))
		return
	}
	conn.Sandbox = sb
}

// reportHealth tells policy how a connection looked, when policy is set.
// A failure to report is logged, not returned.
func (s *Server) reportHealth(ctx context.Context, connectionID string, healthy bool, detail string) {
	if s.deps.Policy == nil {
		return
	}
	state := policyv1.HealthState_HEALTH_STATE_HEALTHY
	if !healthy {
		state = policyv1.HealthState_HEALTH_STATE_DEGRADED
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := s.deps.Policy.ReportConnectionHealth(ctx, &policyv1.ReportConnectionHealthRequest{
		ConnectionId: connectionID, State: state, Detail: detail,
	}); err != nil {
		s.log.Warn("report connection health", "connection_id", connectionID, "error", logText(err))
	}
}

// serverInfo is what the server said of itself when the session started.
func serverInfo(ss *session) *registryv1.ServerInfo {
	if ss.info != nil {
		return proto.CloneOf(ss.info())
	}
	return serverInfoOf(ss)
}

func serverInfoOf(ss *session) *registryv1.ServerInfo {
	init := ss.initializeResult()
	if init == nil || init.ServerInfo == nil {
		return &registryv1.ServerInfo{}
	}
	return &registryv1.ServerInfo{
		Name:    truncate(init.ServerInfo.Name, 256),
		Version: truncate(init.ServerInfo.Version, 256),
		Title:   truncate(init.ServerInfo.Title, 256),
	}
}

// replaying reports whether the adapter answers only from fixtures.
func (s *Server) replaying() bool { return s.fixtures != nil && s.fixtures.Mode == FixturesReplay }

// recording reports whether the adapter writes fixtures of live calls.
func (s *Server) recording() bool { return s.fixtures != nil && s.fixtures.Mode == FixturesRecord }
