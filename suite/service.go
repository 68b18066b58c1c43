package suite

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"

	"github.com/v0m3/v0m3/internal/audit"
	"github.com/v0m3/v0m3/internal/authz"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/serve"
	"github.com/v0m3/v0m3/internal/telemetry"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/adapter"
	"github.com/v0m3/v0m3/services/evidence"
	"github.com/v0m3/v0m3/services/orchestrator"
	"github.com/v0m3/v0m3/services/orchestrator/taskmcp"
	"github.com/v0m3/v0m3/services/policy"
	"github.com/v0m3/v0m3/services/registry"
)

// service is one row of the suite's table (services, in suite.go).
type service struct {
	name string
	// calls are the services it calls; each must run here or have an
	// address (Config.Peers).
	calls []string
	// start opens the service's store, builds its server from w and
	// registers it on w.srv.
	start func(w *wiring) error
	// watchStore: NOT_SERVING while a shared store is unreachable (the
	// adapter keeps serving: its store holds only what waits for
	// evidence).
	watchStore bool
	// auditsItself: the evidence service appends its own audit records
	// in process instead of calling a peer.
	auditsItself bool
}

// wiring is what one service is built from: the suite's configuration,
// and the service's own gRPC server, peers, credentials and audit log.
type wiring struct {
	ctx  context.Context
	s    *Suite
	cfg  *Config
	name string
	log  *slog.Logger
	// srv is the service's gRPC server; start registers on srv.GRPC.
	srv   *serve.Server
	guard *identity.Guard
	// peers reach the other services as this one.
	peers Clients
	// creds are the service's own credentials (nil in plaintext
	// development): what it signs grants and attestations with.
	creds *identity.Credentials
	// selfAudit is the evidence service's own audit log, bound by
	// startEvidence once its server exists.
	selfAudit *lateAudit
}

// wire checks that svc's peers are reachable and makes its guard, peer
// clients, audit recorder and gRPC server.
func (s *Suite) wire(ctx context.Context, cfg *Config, svc service) (*wiring, error) {
	for _, dep := range svc.calls {
		if s.Addr[dep] == "" {
			return nil, fmt.Errorf("suite: %s needs the %s service: give its address (flag --%s-addr or env V0M3_%s_ADDR)", svc.name, dep, dep, strings.ToUpper(dep))
		}
	}
	log := cfg.Log.With("service", svc.name)
	guard, err := s.Guard(svc.name, log)
	if err != nil {
		return nil, err
	}
	peers, err := s.PeerClients(svc.name)
	if err != nil {
		return nil, err
	}
	w := &wiring{ctx: ctx, s: s, cfg: cfg, name: svc.name, log: log, guard: guard, peers: peers, creds: guard.Creds}
	// Privileged actions taken here are recorded in the evidence
	// service's audit log (no recorder without an evidence service).
	var auditTo audit.Appender
	switch {
	case svc.auditsItself:
		w.selfAudit = &lateAudit{}
		auditTo = w.selfAudit
	case peers.Evidence != nil:
		auditTo = peers.Evidence
	}
	// What waits for evidence is kept in the service's own store too, so
	// a crash or a stop during an evidence outage loses none of it.
	auditSpool, err := s.stores.Spool(svc.name, "audit")
	if err != nil {
		return nil, err
	}
	recorder := audit.New(auditTo, svc.name, auditSpool, log)
	if recorder != nil {
		s.flushers = append(s.flushers, recorder.Close)
		s.recoverSpooled(ctx, log, cfg.SpoolRescan, recorder.Recover)
	}
	w.srv = serve.New(svc.name, log, guard, telemetry.ServerOption(s.tp),
		grpc.ChainUnaryInterceptor(audit.UnaryServer(recorder)))
	return w, nil
}

func startRegistry(w *wiring) error {
	st, err := w.s.stores.Registry()
	if err != nil {
		return err
	}
	reg := registry.NewServer(st, w.log).WithAuthorizer(authz.Remote(w.peers.Policy))
	if err := reg.EnsureDefaults(w.ctx); err != nil {
		return fmt.Errorf("suite: registry default definitions: %w", err)
	}
	registryv1.RegisterRegistryServiceServer(w.srv.GRPC, reg)
	return nil
}

func startPolicy(w *wiring) error {
	st, err := w.s.stores.Policy()
	if err != nil {
		return err
	}
	p, err := policy.NewServer(st, policy.Deps{Registry: w.peers.Registry, PolicyFile: w.cfg.PolicyFile,
		TaskBudget: w.cfg.TaskBudget, RequesterBudget: w.cfg.RequesterBudget, Now: w.cfg.PolicyClock}, w.log)
	if err != nil {
		return err
	}
	w.s.stoppers = append(w.s.stoppers, p.Close)
	policyv1.RegisterPolicyServiceServer(w.srv.GRPC, p)
	return nil
}

func startEvidence(w *wiring) error {
	st, err := w.s.stores.Evidence()
	if err != nil {
		return err
	}
	assetDir := w.cfg.AssetDir
	if assetDir == "" {
		assetDir = filepath.Join(w.cfg.DataDir, "assets")
	}
	assets, err := evidence.NewDirAssetStore(assetDir)
	if err != nil {
		return err
	}
	e := evidence.NewServer(st, w.log).WithAuthorizer(authz.Remote(w.peers.Policy)).WithAssets(assets).
		WithMaxInlineBytes(w.cfg.EvidenceMaxInlineBytes).WithCredentials(w.creds)
	if w.cfg.RetentionAge > 0 {
		every := w.cfg.RetentionInterval
		if every <= 0 {
			every = time.Hour
		}
		w.s.wg.Go(func() { e.RunRetention(w.ctx, w.cfg.RetentionAge, every) })
	}
	w.selfAudit.bind(e.SelfAudit())
	evidencev1.RegisterEvidenceServiceServer(w.srv.GRPC, e)
	return nil
}

func startAdapter(w *wiring) error {
	traceSpool, err := w.s.stores.Spool(w.name, "protocol-trace")
	if err != nil {
		return err
	}
	cfg, reach := w.cfg, w.cfg.Reach
	a := adapter.NewServer(adapter.Deps{
		Registry: w.peers.Registry, Policy: w.peers.Policy, Evidence: w.peers.Evidence, TraceSpool: traceSpool,
		WorkDir: filepath.Join(cfg.DataDir, "work"), Direct: cfg.Direct, Fixtures: cfg.Fixtures, Sessions: cfg.AdapterSessions,
		StdioRoots: reach.StdioRoots, CredentialRoots: reach.CredentialRoots, AllowLoopback: reach.AllowLoopback, AllowPrivateNetworks: reach.AllowPrivateNetworks,
		// Plaintext is the explicit development flag; only there does the
		// adapter run calls it cannot verify a grant for.
		Credentials: w.creds, InsecureUngranted: w.s.ident.Insecure,
	}, w.log)
	w.s.stoppers = append(w.s.stoppers, func() { _ = a.Close() })
	w.s.flushers = append(w.s.flushers, a.FlushTraces)
	w.s.recoverSpooled(w.ctx, w.log, cfg.SpoolRescan, a.RecoverTraces)
	adapterv1.RegisterAdapterServiceServer(w.srv.GRPC, a)
	return nil
}

func startOrchestrator(w *wiring) error {
	st, err := w.s.stores.Orchestrator()
	if err != nil {
		return err
	}
	cfg := w.cfg
	var mcpLis net.Listener
	var mcpBase string
	if cfg.MCP != nil {
		if mcpLis, mcpBase, err = w.s.listenMCP(cfg.MCP, w.creds != nil); err != nil {
			return err
		}
	}
	o := orchestrator.NewServer(st, orchestrator.Deps{
		MCPBaseURL: mcpBase, MCPTokenTTL: mcpTTL(cfg.MCP), ApprovalURL: approvalURL(cfg.MCP),
		Registry: w.peers.Registry, Policy: w.peers.Policy, Adapter: w.peers.Adapter, Evidence: w.peers.Evidence,
		AssetThreshold: cfg.AssetThreshold, Credentials: w.creds,
		ReplicaID: cfg.Replica.ID, LeaseTTL: cfg.Replica.LeaseTTL, RecoveryInterval: cfg.Replica.RecoveryInterval,
		FailPoint: cfg.Replica.FailPoint, InternalCallTimeout: cfg.InternalCallTimeout,
	}, w.log)
	w.s.stoppers = append(w.s.stoppers, o.Close)
	telemetry.ObserveWaiting(orchestrator.WaitingRequests(st))
	orchestratorv1.RegisterOrchestratorServiceServer(w.srv.GRPC, o)
	if mcpLis != nil {
		w.s.serveMCP(w.ctx, mcpLis, taskmcp.Handler(o.MCPBackend(), taskmcp.Options{
			AllowedHosts: cfg.MCP.AllowedHosts, Limit: w.guard.Limit,
			Credentials: w.creds, ApprovalURL: approvalURL(cfg.MCP), Log: w.log,
		}), w.creds, w.log)
		w.s.MCPURL = mcpBase
	}
	return nil
}
