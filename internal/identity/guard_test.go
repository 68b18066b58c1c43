package identity_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/testkit"
	_ "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	_ "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	_ "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	_ "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// echoRegistry answers GetConnection with the caller it was admitted as
// (owner = caller id, display name = peer service) and is otherwise
// unimplemented: an admitted call to another method answers UNIMPLEMENTED,
// a refused one never reaches it.
type echoRegistry struct {
	registryv1.UnimplementedRegistryServiceServer
}

func (echoRegistry) GetConnection(ctx context.Context, _ *registryv1.GetConnectionRequest) (*registryv1.Connection, error) {
	c, _ := identity.CallerFrom(ctx)
	return &registryv1.Connection{Owner: c.ID, DisplayName: identity.PeerFrom(ctx), CredentialScope: strings.Join(c.Groups, ",")}, nil
}

type guarded struct {
	*testkit.Guarded
	dev *identity.Dev
}

// serveGuarded serves the registry API behind the guard with the registry
// service's certificate from a fresh development CA.
func serveGuarded(t *testing.T) *guarded {
	t.Helper()
	return serveGuardedWith(t, identity.RateLimits{}, echoRegistry{})
}

// serveGuardedWith is serveGuarded with the guard's rate limits and the
// registry API's implementation given, and authenticators tried after
// the development issuer's.
func serveGuardedWith(t *testing.T, limits identity.RateLimits, impl registryv1.RegistryServiceServer, extra ...identity.Authenticator) *guarded {
	t.Helper()
	g := testkit.ServeGuarded(t, identity.Registry, func(s *grpc.Server) { registryv1.RegisterRegistryServiceServer(s, impl) }, func(g *identity.Guard) {
		g.Authn = append(g.Authn.(identity.Chain), extra...)
		g.Limit = identity.NewCallerLimiter(limits, nil)
	})
	return &guarded{Guarded: g, dev: g.Dev}
}

// asPeer returns a registry client calling as service, with a certificate
// from dev's CA.
func (g *guarded) asPeer(t *testing.T, service string, dev *identity.Dev) registryv1.RegistryServiceClient {
	t.Helper()
	creds, err := dev.Credentials(service)
	if err != nil {
		t.Fatal(err)
	}
	return registryv1.NewRegistryServiceClient(g.Dial(t, identity.PeerDialOptions(service, creds, identity.Registry)...))
}

// asCaller returns a registry client with no client certificate.
func (g *guarded) asCaller(t *testing.T) registryv1.RegistryServiceClient {
	t.Helper()
	return registryv1.NewRegistryServiceClient(g.Caller(t))
}

// TestGuardAdmitsOnlyTheTable: peers by certificate for the RPCs the table
// names them for, callers by verified token; everyone else is refused
// before the handler with a reason.
func TestGuardAdmitsOnlyTheTable(t *testing.T) {
	t.Parallel()
	g := serveGuarded(t)
	ctx := context.Background()
	expired, err := g.dev.Issuer.Mint("alice", nil, -time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := identity.NewDev(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}

	// The adapter records snapshots; admitted, the handler answers.
	_, err = g.asPeer(t, identity.Adapter, g.dev).RecordSnapshot(ctx, &registryv1.RecordSnapshotRequest{Snapshot: &registryv1.DiscoverySnapshot{}})
	if apierror.Code(err) != codes.Unimplemented {
		t.Errorf("adapter RecordSnapshot: %v, want admitted (UNIMPLEMENTED from the handler)", err)
	}
	// The orchestrator may not.
	_, err = g.asPeer(t, identity.Orchestrator, g.dev).RecordSnapshot(ctx, &registryv1.RecordSnapshotRequest{})
	if !apierror.Is(err, codes.PermissionDenied, "PEER_NOT_ALLOWED") {
		t.Errorf("orchestrator RecordSnapshot: %v, want PEER_NOT_ALLOWED", err)
	}
	// A caller without a certificate may not call a peer-only RPC, even
	// with a valid token.
	_, err = g.asCaller(t).RecordSnapshot(g.dev.Issuer.As(ctx, "mallory", "platform"), &registryv1.RecordSnapshotRequest{})
	if !apierror.Is(err, codes.PermissionDenied, "PEER_NOT_ALLOWED") {
		t.Errorf("caller RecordSnapshot: %v, want PEER_NOT_ALLOWED", err)
	}
	// A certificate from another CA does not even complete the handshake.
	_, err = g.asPeer(t, identity.Adapter, stranger).RecordSnapshot(ctx, &registryv1.RecordSnapshotRequest{})
	if apierror.Code(err) != codes.Unavailable {
		t.Errorf("foreign CA: %v, want the handshake refused (UNAVAILABLE)", err)
	}

	caller := g.asCaller(t)
	for _, tc := range []struct {
		name   string
		ctx    context.Context
		code   codes.Code
		reason string
	}{
		{"no token", ctx, codes.Unauthenticated, "CREDENTIALS_MISSING"},
		{"expired token", identity.WithBearer(ctx, expired), codes.Unauthenticated, "TOKEN_EXPIRED"},
		{"token of another issuer", stranger.Issuer.As(ctx, "alice"), codes.Unauthenticated, "TOKEN_SIGNATURE_INVALID"},
		{"not bearer", metadataCtx(ctx, "authorization", "Basic YWxpY2U6cHc="), codes.Unauthenticated, "CREDENTIALS_MISSING"},
	} {
		_, err := caller.GetConnection(tc.ctx, &registryv1.GetConnectionRequest{Id: "conn_x"})
		if !apierror.Is(err, tc.code, tc.reason) {
			t.Errorf("%s: %v, want %s %s", tc.name, err, tc.code, tc.reason)
		}
	}
	// A valid token: the handler sees who the token names, not a peer.
	got, err := caller.GetConnection(g.dev.Issuer.As(ctx, "alice", "authors"), &registryv1.GetConnectionRequest{Id: "conn_x"})
	if err != nil || got.GetOwner() != "alice" || got.GetDisplayName() != "" || got.GetCredentialScope() != "authors" {
		t.Errorf("token caller: %v, %v", got, err)
	}
	// A peer the table admits is the service itself.
	got, err = g.asPeer(t, identity.Operator, g.dev).GetConnection(ctx, &registryv1.GetConnectionRequest{Id: "conn_x"})
	if err != nil || got.GetOwner() != identity.Operator || got.GetDisplayName() != identity.Operator {
		t.Errorf("operator peer: %v, %v", got, err)
	}
}

// TestGuardSaysWhenATokenCannotBeChecked: when what checks a token is down
// (here the OIDC issuer's key set cannot be fetched), the caller hears
// UNAVAILABLE, to try again, not UNAUTHENTICATED, which says the token
// is bad; a token the issuer that is up refuses is still refused.
func TestGuardSaysWhenATokenCannotBeChecked(t *testing.T) {
	t.Parallel()
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "down", http.StatusBadGateway)
	}))
	t.Cleanup(down.Close)
	oidc, err := identity.NewJWT(context.Background(), identity.JWTConfig{Issuer: testIssuer, Audience: testAudience, JWKSURL: down.URL})
	if err != nil {
		t.Fatal(err)
	}
	g := serveGuardedWith(t, identity.RateLimits{}, echoRegistry{}, oidc)
	ctx := context.Background()
	tok := newSigner(t, "k1").sign(t, claims(time.Now(), nil))
	_, err = g.asCaller(t).GetConnection(identity.WithBearer(ctx, tok), &registryv1.GetConnectionRequest{Id: "conn_x"})
	if !apierror.Is(err, codes.Unavailable, "ISSUER_KEYS_UNAVAILABLE") {
		t.Fatalf("a token while the issuer's keys cannot be fetched: %v, want UNAVAILABLE ISSUER_KEYS_UNAVAILABLE", err)
	}
	if _, err := g.asCaller(t).GetConnection(g.dev.Issuer.As(ctx, "alice"), &registryv1.GetConnectionRequest{Id: "conn_x"}); err != nil {
		t.Fatalf("a token of the issuer that is up: %v", err)
	}
}

// TestAccessTableCoversEveryRPC: every RPC of every V0M3 service has an
// entry (so none is open or closed by accident) and every entry names a
// real RPC and known services.
func TestAccessTableCoversEveryRPC(t *testing.T) {
	t.Parallel()
	var methods []string
	protoregistry.GlobalFiles.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		if !strings.HasPrefix(string(fd.Package()), "v0m3.") {
			return true
		}
		for i := range fd.Services().Len() {
			sd := fd.Services().Get(i)
			for j := range sd.Methods().Len() {
				full := "/" + string(sd.FullName()) + "/" + string(sd.Methods().Get(j).Name())
				methods = append(methods, full)
				a, ok := identity.AccessFor(full)
				if !ok {
					t.Errorf("%s has no entry in the access table", full)
					continue
				}
				if a.Anyone {
					t.Errorf("%s is open to anyone", full)
				}
				if len(a.Peers) == 0 && !a.Callers {
					t.Errorf("%s admits nobody", full)
				}
				for _, p := range a.Peers {
					if !slices.Contains(identity.Services, p) {
						t.Errorf("%s names unknown peer %q", full, p)
					}
				}
			}
		}
		return true
	})
	if len(methods) < 40 {
		t.Fatalf("found only %d V0M3 RPCs; are the protos registered?", len(methods))
	}
	for _, m := range identity.TableMethods() {
		if !slices.Contains(methods, m) {
			t.Errorf("the access table names %s, which no service has", m)
		}
	}
}

// TestGuardLogsAFloodOfRefusalsBriefly: requests with garbage tokens, which
// anyone can send, are each refused, but logged at most in a burst and
// then a few a second; the next line logged says how many were not.
func TestGuardLogsAFloodOfRefusalsBriefly(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	dev, err := identity.NewDev(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	authn, err := dev.Authenticator()
	if err != nil {
		t.Fatal(err)
	}
	g := &identity.Guard{Authn: authn, Log: log}
	now := time.Now()
	g.SetRefusalLogClock(func() time.Time { return now })
	unary := g.Unary()
	info := &grpc.UnaryServerInfo{FullMethod: registryv1.RegistryService_GetConnection_FullMethodName}
	handled := false
	handler := func(context.Context, any) (any, error) { handled = true; return nil, nil }
	garbage := func() error {
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer not-a-token"))
		_, err := unary(ctx, nil, info, handler)
		return err
	}
	const flood = 200
	for range flood {
		if err := garbage(); !apierror.Is(err, codes.Unauthenticated, "TOKEN_MALFORMED") {
			t.Fatalf("a garbage token: %v, want UNAUTHENTICATED TOKEN_MALFORMED", err)
		}
	}
	if handled {
		t.Fatal("a request with a garbage token reached the handler")
	}
	lines := func() []map[string]any {
		var out []map[string]any
		for _, l := range bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n")) {
			var m map[string]any
			if err := json.Unmarshal(l, &m); err != nil {
				t.Fatalf("log line %q: %v", l, err)
			}
			out = append(out, m)
		}
		return out
	}
	got := lines()
	if len(got) == 0 || len(got) >= flood {
		t.Fatalf("%d refusals logged %d lines, want a burst of a few", flood, len(got))
	}
	if got[0]["msg"] != "rpc refused" || got[0]["reason"] != "TOKEN_MALFORMED" {
		t.Fatalf("first refusal logged as %v", got[0])
	}
	// A second later the flood's size is told in the next line.
	now = now.Add(time.Second)
	if err := garbage(); err == nil {
		t.Fatal("a garbage token was admitted")
	}
	got = lines()
	last := got[len(got)-1]
	if want := float64(flood - (len(got) - 1)); last["unlogged_before"] != want {
		t.Fatalf("the line after the flood: %v, want unlogged_before %v", last, want)
	}
	if strings.Contains(buf.String(), "not-a-token") {
		t.Fatal("the log holds a presented token")
	}
}

// TestGuardLogsWhyATokenWasNotChecked: when the API server cannot review
// a token, the service's log says why (the caller only that it may try
// again).
func TestGuardLogsWhyATokenWasNotChecked(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	g := &identity.Guard{Authn: &identity.TokenReview{Client: &failingReviewer{}}, Log: slog.New(slog.NewJSONHandler(&buf, nil))}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer eyJhbGciOiJSUzI1NiJ9.e30.c2ln"))
	_, err := g.Unary()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: registryv1.RegistryService_GetConnection_FullMethodName},
		func(context.Context, any) (any, error) { return nil, nil })
	if !apierror.Is(err, codes.Unavailable, "TOKEN_REVIEW_UNAVAILABLE") || strings.Contains(err.Error(), "10.0.0.1") {
		t.Fatalf("API server unreachable: %v, want UNAVAILABLE TOKEN_REVIEW_UNAVAILABLE without the client's error", err)
	}
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("log %q: %v", buf.String(), err)
	}
	if cause, _ := line["cause"].(string); !strings.Contains(cause, "connection refused") {
		t.Fatalf("the refusal logged as %v, want the API server client's error as its cause", line)
	}
}
