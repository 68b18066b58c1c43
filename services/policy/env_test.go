package policy

import (
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/v0m3/v0m3/internal/fieldbehavior/fieldbehaviortest"
	"github.com/v0m3/v0m3/internal/redistest"
	"github.com/v0m3/v0m3/internal/store"
	"github.com/v0m3/v0m3/internal/testkit"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// options configure a test environment.
type options struct {
	policyFile string
	task       Limits
	requester  Limits
	// redisAddr, when set, puts the server on a Redis store at this
	// address (see redistest.Start) instead of a bbolt file.
	redisAddr string
	// wrap, when set, wraps the store the server is given.
	wrap func(Store) Store
}

// env is a policy server on a real bbolt file, served over gRPC (bufconn),
// talking to a fake registry over gRPC.
type env struct {
	t      *testing.T
	opts   options
	reg    *fakeRegistry
	regCli registryv1.RegistryServiceClient
	clock  *testkit.Clock
	logs   *testkit.SyncBuffer
	dbPath string
	// redisPrefix keeps a Redis-backed env on the same keys across reopen.
	redisPrefix string

	db     *store.DB
	srv    *Server
	served *testkit.Server
	client policyv1.PolicyServiceClient
}

// newEnv starts a fake registry with the standard fixture and a policy
// server in front of a fresh database.
func newEnv(t *testing.T, opts options) *env {
	t.Helper()
	e := &env{
		t:      t,
		opts:   opts,
		reg:    newFakeRegistry(),
		clock:  testkit.NewClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)),
		logs:   &testkit.SyncBuffer{},
		dbPath: filepath.Join(t.TempDir(), "policy.db"),
	}
	standardFixture(e.reg)

	reg := testkit.Serve(t, func(g *grpc.Server) { registryv1.RegisterRegistryServiceServer(g, e.reg) }, grpc.UnaryInterceptor(fieldbehaviortest.UnaryServer()))
	e.regCli = registryv1.NewRegistryServiceClient(reg.Dial(t))

	if err := e.start(); err != nil {
		t.Fatalf("start policy server: %v", err)
	}
	t.Cleanup(e.stop)
	return e
}

// start opens the database and serves a new policy server on it.
func (e *env) start() error {
	var (
		st Store
		db *store.DB
	)
	if e.opts.redisAddr != "" {
		if e.redisPrefix == "" {
			e.redisPrefix = redistest.Prefix(e.t)
		}
		st = NewRedisStore(redistest.Client(e.t, e.opts.redisAddr), e.redisPrefix)
	} else {
		var err error
		if db, err = store.Open(e.dbPath); err != nil {
			return err
		}
		st = NewBoltStore(db)
	}
	if e.opts.wrap != nil {
		st = e.opts.wrap(st)
	}
	log := slog.New(slog.NewJSONHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv, err := NewServer(st, Deps{
		Registry:        e.regCli,
		PolicyFile:      e.opts.policyFile,
		Now:             e.clock.Now,
		TaskBudget:      e.opts.task,
		RequesterBudget: e.opts.requester,
	}, log)
	if err != nil {
		if db != nil {
			_ = db.Close()
		}
		return err
	}
	e.served = testkit.Serve(e.t, func(g *grpc.Server) { policyv1.RegisterPolicyServiceServer(g, srv) }, grpc.UnaryInterceptor(fieldbehaviortest.UnaryServer()))
	e.db, e.srv = db, srv
	e.client = policyv1.NewPolicyServiceClient(e.served.Dial(e.t))
	return nil
}

// stop closes the client, server and database.
func (e *env) stop() {
	if e.srv == nil {
		return
	}
	e.served.Stop()
	e.srv.Close()
	if e.db != nil {
		_ = e.db.Close()
	}
	e.srv = nil
}

// reopen restarts the policy server on the same database file.
func (e *env) reopen() {
	e.t.Helper()
	e.stop()
	if err := e.start(); err != nil {
		e.t.Fatalf("reopen: %v", err)
	}
}

// Standard fixture names.
const (
	capRetrieve = "retrieve_authorized_source"
	capPreview  = "render_preview"
	capDeliver  = "deliver_approved_artifact"
	capLinks    = "check_links"
	capSearch   = "search_sources"
	capArchive  = "fetch_archive"
	capSummary  = "summarize_remote"

	connOK       = "conn_ok"
	connDegraded = "conn_degraded"
	connRetired  = "conn_retired"

	mapRetrieve = "map_retrieve"
)

// standardFixture registers one capability per eligibility outcome.
func standardFixture(r *fakeRegistry) {
	r.addCapability(capRetrieve, registryv1.EffectClass_EFFECT_CLASS_RETRIEVAL)
	r.addCapability(capPreview, registryv1.EffectClass_EFFECT_CLASS_LOCAL_TRANSFORMATION)
	r.addCapability(capDeliver, registryv1.EffectClass_EFFECT_CLASS_EXTERNAL_EFFECT)
	r.addCapability(capLinks, registryv1.EffectClass_EFFECT_CLASS_RETRIEVAL)
	r.addCapability(capSearch, registryv1.EffectClass_EFFECT_CLASS_RETRIEVAL)
	r.addCapability(capArchive, registryv1.EffectClass_EFFECT_CLASS_RETRIEVAL)
	r.addCapability(capSummary, registryv1.EffectClass_EFFECT_CLASS_RETRIEVAL)

	r.addConnection(connOK, registryv1.ConnectionState_CONNECTION_STATE_ACTIVE)
	r.addConnection(connDegraded, registryv1.ConnectionState_CONNECTION_STATE_ACTIVE)
	r.addConnection(connRetired, registryv1.ConnectionState_CONNECTION_STATE_RETIRED)

	active := registryv1.MappingState_MAPPING_STATE_ACTIVE
	r.putMapping(mapRetrieve, capRetrieve, connOK, 2, active)
	r.putMapping("map_preview", capPreview, connOK, 1, active)
	r.putMapping("map_deliver", capDeliver, connOK, 1, active)
	r.putMapping("map_links", capLinks, connOK, 2, registryv1.MappingState_MAPPING_STATE_REVIEW_REQUIRED)
	r.putMapping("map_search", capSearch, connDegraded, 1, active)
	r.putMapping("map_archive", capArchive, connRetired, 1, active)
	// summarize_remote has no mapping at all.
}

func alice() *policyv1.Principal { return &policyv1.Principal{Id: "alice"} }
func bob() *policyv1.Principal   { return &policyv1.Principal{Id: "bob", Groups: []string{"authors"}} }
func carol() *policyv1.Principal {
	return &policyv1.Principal{Id: "carol", Groups: []string{"publishers"}}
}
