package testkit

import (
	"context"
	"crypto/x509"
	"log/slog"
	"net"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/serve"
)

// Server is one service's gRPC server on an in-memory listener
// (bufconn): real gRPC framing, codecs, interceptors and status details,
// and no port to collide on.
type Server struct {
	// GRPC is the server, its services registered.
	GRPC *grpc.Server
	lis  *bufconn.Listener

	mu    sync.Mutex
	conns []*grpc.ClientConn
	once  sync.Once
}

// Serve starts a server with opts (identitytest.ServerOptions to name
// the caller of a unit test's calls), registers its services with
// register, and serves them until Stop or the test's cleanup.
func Serve(t testing.TB, register func(*grpc.Server), opts ...grpc.ServerOption) *Server {
	t.Helper()
	return serveOn(t, grpc.NewServer(opts...), register)
}

func serveOn(t testing.TB, g *grpc.Server, register func(*grpc.Server)) *Server {
	t.Helper()
	register(g)
	s := &Server{GRPC: g, lis: bufconn.Listen(1 << 20)}
	go func() { _ = g.Serve(s.lis) }()
	t.Cleanup(s.Stop)
	return s
}

// Dial returns a connection to s, closed by Stop. It is plaintext unless
// opts set transport credentials.
func (s *Server) Dial(t testing.TB, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	opts = append([]grpc.DialOption{
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return s.lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
	}, opts...)
	// localhost: the name a development certificate carries, which a
	// product caller's TLS checks as it would a real address's.
	conn, err := grpc.NewClient("passthrough:///localhost", opts...)
	if err != nil {
		t.Fatalf("dial the test server: %v", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.conns = append(s.conns, conn)
	return conn
}

// Stop closes every connection Dial returned and stops the server, once;
// it also runs at the test's cleanup. A test stops a server to start
// another on the same store, as a restart.
func (s *Server) Stop() {
	s.once.Do(func() {
		s.mu.Lock()
		conns := s.conns
		s.mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
		s.GRPC.Stop()
	})
}

// Guarded is one service served as the suite serves it (serve.New): the
// real guard and access table, mutual TLS with the service's certificate
// from a fresh development CA, and that setup's development issuer's
// tokens for people. Connections are in memory (bufconn).
type Guarded struct {
	*Server
	// Dev is the development setup: its CA issues every certificate,
	// its issuer every token.
	Dev *identity.Dev
	// Service is the name the server's certificate carries.
	Service string
}

// ServeGuarded serves service, its API registered by register, behind
// the guard. configure, when given, changes the guard (rate limits,
// further authenticators, a refusal log) before it serves.
func ServeGuarded(t testing.TB, service string, register func(*grpc.Server), configure ...func(*identity.Guard)) *Guarded {
	t.Helper()
	dev, err := identity.NewDev(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	creds, err := dev.Credentials(service)
	if err != nil {
		t.Fatal(err)
	}
	authn, err := dev.Authenticator()
	if err != nil {
		t.Fatal(err)
	}
	guard := &identity.Guard{Creds: creds, Authn: identity.Chain{authn}}
	for _, c := range configure {
		c(guard)
	}
	srv := serve.New(service, slog.New(slog.DiscardHandler), guard)
	return &Guarded{Server: serveOn(t, srv.GRPC, register), Dev: dev, Service: service}
}

// Peer returns a connection calling as the peer service, presenting its
// certificate from the same CA.
func (g *Guarded) Peer(t testing.TB, service string) *grpc.ClientConn {
	t.Helper()
	creds, err := g.Dev.Credentials(service)
	if err != nil {
		t.Fatal(err)
	}
	return g.Dial(t, identity.PeerDialOptions(service, creds, g.Service)...)
}

// Caller returns the connection of a product or admin caller: TLS
// trusting the CA, no client certificate. Name the person of each call
// with As.
func (g *Guarded) Caller(t testing.TB) *grpc.ClientConn {
	t.Helper()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(g.Dev.CA.CertPEM())
	return g.Dial(t, identity.CallerDialOptions(roots)...)
}

// As returns ctx carrying a development token for subject in groups.
func (g *Guarded) As(ctx context.Context, subject string, groups ...string) context.Context {
	return g.Dev.Issuer.As(ctx, subject, groups...)
}
