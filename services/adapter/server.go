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
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/services/internal/apierror"
)

// Deps are the services the adapter calls.
type Deps struct {
	// Registry supplies connections and records snapshots. Required.
	Registry registryv1.RegistryServiceClient
	// Policy receives connection health reports; may be nil.
	Policy policyv1.PolicyServiceClient
	// Evidence receives protocol-layer trace events; may be nil.
	Evidence evidencev1.EvidenceServiceClient
	// WorkDir is the root of per-connection working directories for local
	// servers; "" means os.TempDir()/v0m3-work.
	WorkDir string
}

// Server implements adapterv1.AdapterServiceServer. Each Discover, Execute
// or Health call opens its own MCP session (connect, initialize, act,
// close), which keeps limits exact per call and leaves no session state
// behind.
type Server struct {
	adapterv1.UnimplementedAdapterServiceServer
	deps          Deps
	log           *slog.Logger
	workDir       string
	httpTransport *http.Transport
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
	ht := http.DefaultTransport.(*http.Transport).Clone()
	ht.Proxy = nil // the adapter reaches servers directly, never via an environment proxy
	ht.ResponseHeaderTimeout = 0
	ht.MaxResponseHeaderBytes = 64 << 10
	return &Server{deps: deps, log: log, workDir: wd, httpTransport: ht}
}

// Close releases idle HTTP connections. Sessions are per call, so nothing
// else stays open.
func (s *Server) Close() error {
	s.httpTransport.CloseIdleConnections()
	return nil
}

// connection fetches a connection and refuses a retired one.
func (s *Server) connection(ctx context.Context, id string) (*registryv1.Connection, error) {
	conn, err := s.deps.Registry.GetConnection(ctx, &registryv1.GetConnectionRequest{Id: id})
	if err != nil {
		return nil, apierror.Propagate(err, "get connection")
	}
	if conn.GetState() == registryv1.ConnectionState_CONNECTION_STATE_RETIRED {
		return nil, apierror.New(codes.FailedPrecondition, "CONNECTION_RETIRED",
			fmt.Sprintf("connection %s is retired; it is kept for history and never used again", id),
			map[string]string{"connection_id": id})
	}
	return conn, nil
}

// session is one MCP client session over a metered transport.
type session struct {
	cs      *mcp.ClientSession
	m       *meter
	release func()
}

// openSession connects to conn's server and initializes a session whose
// inbound messages are limited to limit bytes each.
func (s *Server) openSession(ctx context.Context, conn *registryv1.Connection, limit int64) (*session, error) {
	d, err := s.dialerFor(conn)
	if err != nil {
		return nil, err
	}
	m := newMeter(limit)
	t, release, err := d.open(ctx, m)
	if err != nil {
		return &session{m: m}, err
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "v0m3-adapter", Version: "1"}, &mcp.ClientOptions{
		Capabilities: &mcp.ClientCapabilities{}, // no roots, sampling or elicitation offered to servers
		Logger:       slog.New(slog.DiscardHandler),
	})
	cs, err := client.Connect(ctx, t, nil)
	if err != nil {
		release()
		return &session{m: m}, err
	}
	return &session{cs: cs, m: m, release: release}, nil
}

// close ends the session and then the transport (killing a local server
// that does not exit), bounded in time.
func (ss *session) close() {
	done := make(chan struct{})
	go func() {
		_ = ss.cs.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
	}
	ss.release()
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
		s.log.Warn("report connection health", "connection_id", connectionID, "error", err)
	}
}

func serverInfo(cs *mcp.ClientSession) *registryv1.ServerInfo {
	init := cs.InitializeResult()
	if init == nil || init.ServerInfo == nil {
		return &registryv1.ServerInfo{}
	}
	return &registryv1.ServerInfo{
		Name:    truncate(init.ServerInfo.Name, 256),
		Version: truncate(init.ServerInfo.Version, 256),
		Title:   truncate(init.ServerInfo.Title, 256),
	}
}
