package registry_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/identity/identitytest"
	"github.com/v0m3/v0m3/internal/store"
	"github.com/v0m3/v0m3/internal/testkit"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/registry"
)

// running is one registry server on a real bbolt file, reached over an
// in-memory gRPC connection.
type running struct {
	client registryv1.RegistryServiceClient
	path   string
	stop   func()
	// base is the last event sequence once the server started: the
	// default definitions' events on a new store.
	base int64
	// st is the server's store, for reading what a test must see was (or
	// was not) written.
	st registry.Store
}

// start serves a registry on a fresh database file in t.TempDir().
func start(t *testing.T) *running {
	t.Helper()
	return startAt(t, filepath.Join(t.TempDir(), "registry.db"))
}

// startAt serves a registry on the database file at path. stop closes the
// server and the file; it also runs at cleanup.
func startAt(t *testing.T, path string) *running {
	t.Helper()
	return startWith(t, path, func(s *registry.Server) *registry.Server { return s })
}

// startWith is startAt with the server configured by configure.
func startWith(t *testing.T, path string, configure func(*registry.Server) *registry.Server) *running {
	t.Helper()
	db, err := store.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	// Without a named caller, an integrator of the platform team calls.
	opts := identitytest.ServerOptions(identity.Caller{ID: "integrator", Groups: []string{"platform"}, Kind: identity.KindUser})
	st := registry.NewBoltStore(db)
	reg := configure(registry.NewServer(st, log).WithAuthorizer(allowAll))
	if err := reg.EnsureDefaults(t.Context()); err != nil {
		t.Fatal(err)
	}
	var base int64
	if evs, err := st.ListEvents(t.Context(), 0, 1000); err != nil {
		t.Fatal(err)
	} else if len(evs) > 0 {
		base = evs[len(evs)-1].GetSequence()
	}
	g := testkit.Serve(t, func(g *grpc.Server) { registryv1.RegisterRegistryServiceServer(g, reg) }, opts...)
	conn := g.Dial(t)
	var once sync.Once
	stop := func() {
		once.Do(func() {
			g.Stop()
			if err := db.Close(); err != nil {
				t.Errorf("close db: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return &running{client: registryv1.NewRegistryServiceClient(conn), path: path, stop: stop, base: base, st: st}
}

func mustStruct(t *testing.T, m map[string]any) *structpb.Struct {
	t.Helper()
	s, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// searchSchema is the fixture search tool's input schema.
func searchSchema(t *testing.T) *structpb.Struct {
	return mustStruct(t, map[string]any{
		"type": "object",
		"properties": map[string]any{
			"query":     map[string]any{"type": "string"},
			"source_id": map[string]any{"type": "string"},
		},
		"required": []any{"query"},
	})
}

// structuredSearchSchema is the search schema after the drift from a query
// string to a structured object.
func structuredSearchSchema(t *testing.T) *structpb.Struct {
	return mustStruct(t, map[string]any{
		"type": "object",
		"properties": map[string]any{
			"query":     map[string]any{"type": "object", "properties": map[string]any{"text": map[string]any{"type": "string"}}},
			"source_id": map[string]any{"type": "string"},
		},
		"required": []any{"query"},
	})
}

func searchTool(t *testing.T) *registryv1.ToolIdentity {
	return &registryv1.ToolIdentity{
		Name:        "search",
		Title:       "Search",
		Description: "Search the synthetic source library.",
		InputSchema: searchSchema(t),
	}
}

func createHTTP(t *testing.T, c registryv1.RegistryServiceClient) *registryv1.Connection {
	t.Helper()
	conn, err := c.CreateConnection(t.Context(), &registryv1.CreateConnectionRequest{
		DisplayName: "V0M3 Sources",
		Owner:       "platform",
		Transport: &registryv1.Transport{Kind: &registryv1.Transport_StreamableHttp{
			StreamableHttp: &registryv1.StreamableHTTPTransport{Url: "http://sources.mcp.svc:8080/mcp"}}},
		CredentialScope:   "read-only access to the synthetic library",
		CredentialRef:     "file:/var/run/secrets/v0m3/sources/token",
		CredentialVersion: "1",
	})
	if err != nil {
		t.Fatalf("CreateConnection: %v", err)
	}
	return conn
}

func record(t *testing.T, c registryv1.RegistryServiceClient, conn *registryv1.Connection, tools ...*registryv1.ToolIdentity) *registryv1.DiscoverySnapshot {
	t.Helper()
	snap, err := c.RecordSnapshot(t.Context(), &registryv1.RecordSnapshotRequest{Snapshot: &registryv1.DiscoverySnapshot{
		ConnectionId:    conn.GetId(),
		ConfigRevision:  conn.GetConfigRevision(),
		ServerInfo:      &registryv1.ServerInfo{Name: "V0M3 Sources", Version: "1.0.0"},
		ProtocolVersion: "2025-06-18",
		Tools:           tools,
	}})
	if err != nil {
		t.Fatalf("RecordSnapshot: %v", err)
	}
	return snap
}

// proposal is a valid retrieve_authorized_source proposal onto the search
// tool of snap.
func proposal(snap *registryv1.DiscoverySnapshot) *registryv1.ProposeMappingRequest {
	return &registryv1.ProposeMappingRequest{
		Capability:   "retrieve_authorized_source",
		ConnectionId: snap.GetConnectionId(),
		SnapshotId:   snap.GetId(),
		Target:       &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: "search"},
		ArgumentMap: []*registryv1.ArgumentBinding{
			{RemoteField: "query", ProductField: "query"},
			{RemoteField: "source_id", ProductField: "source", FromHandle: true},
		},
		Limits: &registryv1.Limits{MaxResponseBytes: 65536, MaxItems: 10, AllowedMediaTypes: []string{"text/plain"}},
	}
}

func propose(t *testing.T, c registryv1.RegistryServiceClient, req *registryv1.ProposeMappingRequest) *registryv1.Mapping {
	t.Helper()
	m, err := c.ProposeMapping(t.Context(), req)
	if err != nil {
		t.Fatalf("ProposeMapping: %v", err)
	}
	return m
}

func approve(t *testing.T, c registryv1.RegistryServiceClient, m *registryv1.Mapping) *registryv1.Mapping {
	t.Helper()
	out, err := c.ReviewMapping(identitytest.As(t.Context(), "reviewer", "reviewers"), &registryv1.ReviewMappingRequest{
		MappingId: m.GetId(), Revision: m.GetRevision(), Approve: true, Note: "checked fixtures"})
	if err != nil {
		t.Fatalf("ReviewMapping: %v", err)
	}
	return out
}

// activeSetup creates a connection, records a snapshot with the search tool
// and activates a retrieve_authorized_source mapping onto it.
func activeSetup(t *testing.T, c registryv1.RegistryServiceClient) (*registryv1.Connection, *registryv1.DiscoverySnapshot, *registryv1.Mapping) {
	t.Helper()
	conn := createHTTP(t, c)
	snap := record(t, c, conn, searchTool(t))
	m := approve(t, c, propose(t, c, proposal(snap)))
	conn, err := c.GetConnection(t.Context(), &registryv1.GetConnectionRequest{Id: conn.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	return conn, snap, m
}

// wantErr fails unless err has the code and reason.
func wantErr(t *testing.T, err error, code codes.Code, reason string) {
	t.Helper()
	if !apierror.Is(err, code, reason) {
		t.Fatalf("error = %v (reason %q), want %v %s", err, apierror.Reason(err), code, reason)
	}
}

// allowAll grants every action: these tests are about the registry's own
// rules; who may act is the policy service's, tested with the real policy
// end to end.
func allowAll(context.Context, *policyv1.AuthorizeActionRequest) (*policyv1.AuthorizeResponse, error) {
	return &policyv1.AuthorizeResponse{Decision: policyv1.Decision_DECISION_ALLOW}, nil
}

// wantRevisedEvent reads the connection's first CONFIG_REVISED event and
// checks that its detail says what happened to the mappings.
func wantRevisedEvent(t *testing.T, c registryv1.RegistryServiceClient, connID, want string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	stream, err := c.WatchEvents(ctx, &registryv1.WatchEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			t.Fatalf("no CONFIG_REVISED event for %s: %v", connID, err)
		}
		if ev.GetType() != registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_CONFIG_REVISED || ev.GetConnectionId() != connID {
			continue
		}
		if !strings.Contains(ev.GetDetail(), want) {
			t.Errorf("CONFIG_REVISED detail %q does not say %q", ev.GetDetail(), want)
		}
		return
	}
}
