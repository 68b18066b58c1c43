// Package policy is the V0M3 policy service: Cedar authorization,
// eligibility (which capabilities one task may be offered, and why the others
// were not), opaque handles in place of raw targets (minted only within the
// source scope the orchestrator registered for the task), and atomic
// budgets.
//
// Nothing a remote server says about itself grants anything here: effect
// classes come from the registry's capability contracts, connections from
// the registry's mappings, and decisions from the local Cedar policy.
package policy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/capcache"
	"github.com/v0m3/v0m3/internal/groupsend"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// Defaults for budgets, polling and handle lifetimes.
const (
	// DefaultTaskCalls is a task's default call budget.
	DefaultTaskCalls = 50
	// DefaultTaskResponseBytes is a task's default response-byte budget.
	DefaultTaskResponseBytes = 8 << 20
	// DefaultTaskCostMicros is a task's default cost budget.
	DefaultTaskCostMicros = 1_000_000
	// DefaultRequesterCalls is a requester's default call budget.
	DefaultRequesterCalls = 500
	// DefaultRequesterResponseBytes is a requester's default response-byte budget.
	DefaultRequesterResponseBytes = 64 << 20
	// DefaultRequesterCostMicros is a requester's default cost budget.
	DefaultRequesterCostMicros = 10_000_000
	// DefaultRequesterPeriod is how long a requester's budget lasts before
	// a fresh one starts: a day, midnight to midnight UTC.
	DefaultRequesterPeriod = 24 * time.Hour
	// DefaultPollInterval is how often the policy file is checked for changes.
	DefaultPollInterval = time.Second
	// DefaultHandleTTL is a handle's lifetime when the request names none.
	DefaultHandleTTL = 15 * time.Minute
	// MaxHandleTTL is the longest lifetime a handle may have.
	MaxHandleTTL = 24 * time.Hour
)

// Expired handles are kept this long, so that a late use is told "expired"
// rather than "unknown", and swept this often.
const (
	handleRetention = 24 * time.Hour
	sweepInterval   = 10 * time.Minute
)

// Limits are the maxima of one budget. Zero fields take the defaults.
type Limits struct {
	// Calls is the maximum number of calls.
	Calls int64
	// ResponseBytes is the maximum number of response bytes.
	ResponseBytes int64
	// CostMicros is the maximum cost in micro-units.
	CostMicros int64
	// Period, for a requester's budget, is how long one lasts: each
	// period, aligned to the Unix epoch (a day runs midnight to midnight
	// UTC), starts a fresh budget. A task's budget lasts as long as the
	// task and has none.
	Period time.Duration
}

// withDefaults fills zero fields from d.
func (l Limits) withDefaults(d Limits) Limits {
	if l.Period <= 0 {
		l.Period = d.Period
	}
	if l.Calls <= 0 {
		l.Calls = d.Calls
	}
	if l.ResponseBytes <= 0 {
		l.ResponseBytes = d.ResponseBytes
	}
	if l.CostMicros <= 0 {
		l.CostMicros = d.CostMicros
	}
	return l
}

// Deps are the policy service's dependencies and settings.
type Deps struct {
	// Registry is the registry service; required.
	Registry registryv1.RegistryServiceClient
	// PolicyFile is a Cedar policy file; "" uses the built-in default policy.
	// The file is re-read when its modification time or size changes.
	PolicyFile string
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// PollInterval is how often PolicyFile is checked; 0 means one second.
	PollInterval time.Duration
	// TaskBudget limits each task; zero fields take the defaults
	// (50 calls, 8 MiB, 1,000,000 micros).
	TaskBudget Limits
	// RequesterBudget limits each requester per period; zero fields take
	// the defaults (500 calls, 64 MiB, 10,000,000 micros a day).
	RequesterBudget Limits
}

// Server implements policyv1.PolicyServiceServer.
type Server struct {
	policyv1.UnimplementedPolicyServiceServer

	store Store
	deps  Deps
	log   *slog.Logger
	// charges applies concurrent charges together (see newStoreCharges).
	charges *groupsend.Sender[*pendingCharge]
	// caps holds capability contracts by revision (see capabilityAt).
	caps capcache.Cache
	// mappings holds what never changes of a mapping (see mappingFacts).
	mappings mappingCache
	// scopes holds task scopes read from the store (see taskScope); shared,
	// so never modified.
	scopes *lru.Cache[string, *policyv1.TaskScope]
	// bindings holds handle bindings read from the store (see binding);
	// shared, so never modified.
	bindings *lru.Cache[string, *policyv1.HandleBinding]

	// policy is the revision in force; replaced whole on reload.
	policy atomic.Pointer[compiled]

	// reloadMu serializes reloads and guards the file-watch state below.
	reloadMu   sync.Mutex
	seen       fileStamp
	pending    fileStamp
	statFailed bool

	cancel    context.CancelFunc
	done      chan struct{}
	closeOnce sync.Once
}

// NewServer returns a policy server. It fails when the policy (file or
// built-in) does not parse; the error names the line and column. Call Close
// to stop the background policy watcher and handle sweeper.
func NewServer(st Store, deps Deps, log *slog.Logger) (*Server, error) {
	if st == nil {
		return nil, errors.New("policy: store is required")
	}
	if deps.Registry == nil {
		return nil, errors.New("policy: registry client is required")
	}
	if log == nil {
		log = slog.Default()
	}
	if deps.Now == nil {
		deps.Now = time.Now
	}
	if deps.PollInterval <= 0 {
		deps.PollInterval = DefaultPollInterval
	}
	deps.TaskBudget = deps.TaskBudget.withDefaults(Limits{Calls: DefaultTaskCalls, ResponseBytes: DefaultTaskResponseBytes, CostMicros: DefaultTaskCostMicros})
	deps.RequesterBudget = deps.RequesterBudget.withDefaults(Limits{Calls: DefaultRequesterCalls, ResponseBytes: DefaultRequesterResponseBytes,
		CostMicros: DefaultRequesterCostMicros, Period: DefaultRequesterPeriod})

	scopes, err := lru.New[string, *policyv1.TaskScope](maxTaskScopeEntries)
	if err != nil {
		return nil, fmt.Errorf("policy: task scope cache: %w", err)
	}
	bindings, err := lru.New[string, *policyv1.HandleBinding](maxBindingEntries)
	if err != nil {
		return nil, fmt.Errorf("policy: handle binding cache: %w", err)
	}
	s := &Server{store: st, deps: deps, log: log.With("service", "policy"), charges: newStoreCharges(st), scopes: scopes, bindings: bindings}
	if deps.PolicyFile == "" {
		c, err := compile(defaultPolicyName, defaultPolicy, deps.Now())
		if err != nil {
			return nil, fmt.Errorf("policy: built-in policy: %w", err)
		}
		s.policy.Store(c)
		s.log.Info("policy loaded", "source", c.source, "policy_revision", c.revision, "policy_ids", c.ids)
	} else if err := s.Reload(context.Background()); err != nil {
		return nil, err
	}

	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.done = make(chan struct{})
	go s.background(ctx)
	return s, nil
}

// Close stops the background goroutine and waits for it to end. It does
// not close the store, which the caller owns.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		s.cancel()
		<-s.done
	})
}

// background polls the policy file and sweeps long-expired handles, old
// charge records and long-ended requester budgets.
func (s *Server) background(ctx context.Context) {
	defer close(s.done)
	poll := time.NewTicker(s.deps.PollInterval)
	defer poll.Stop()
	sweep := time.NewTicker(sweepInterval)
	defer sweep.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-poll.C:
			if s.deps.PolicyFile != "" {
				s.pollPolicy(ctx)
			}
		case <-sweep.C:
			n, err := s.store.DeleteExpiredHandles(ctx, s.now().Add(-handleRetention))
			if err != nil {
				s.log.Warn("sweeping expired handles failed", "error", err)
			} else if n > 0 {
				s.log.Info("swept expired handles", "count", n)
			}
			if n, err = s.store.ForgetBefore(ctx, s.now().Add(-ChargeRetention)); err != nil {
				s.log.Warn("sweeping old charge records and ended requester budgets failed", "error", err)
			} else if n > 0 {
				s.log.Info("swept old charge records and ended requester budgets", "count", n)
			}
		}
	}
}

func (s *Server) now() time.Time { return s.deps.Now() }

// GetPolicyRevision returns the policy revision in force.
func (s *Server) GetPolicyRevision(context.Context, *policyv1.GetPolicyRevisionRequest) (*policyv1.PolicyRevision, error) {
	c := s.policy.Load()
	return &policyv1.PolicyRevision{
		Revision:  c.revision,
		LoadTime:  timestamppb.New(c.loadTime),
		PolicyIds: append([]string(nil), c.ids...),
	}, nil
}

// storeError is the error a client sees when the store failed at op: the
// call's own end (cancelled, out of time) when its context ended,
// UNAVAILABLE STORE_UNAVAILABLE with a RetryInfo when the store could not
// be reached, INTERNAL otherwise (apierror.Store decides). The store's
// error is logged, never returned.
func (s *Server) storeError(ctx context.Context, err error, op string) error {
	switch ctx.Err() {
	case context.Canceled:
		return apierror.New(codes.Canceled, "CANCELLED", "the call was cancelled", nil)
	case context.DeadlineExceeded:
		return apierror.New(codes.DeadlineExceeded, "DEADLINE_EXCEEDED", "the call ran out of time", nil)
	}
	s.log.ErrorContext(ctx, "policy store failure", "op", op, "err", err)
	return apierror.Store(apierror.ReasonStoreFailure, "policy could not "+op, err)
}

// readThrough returns the record under key from c, or reads it with read
// and keeps it. Only for records that never change once stored; a record
// not found is not kept, since it may be stored later.
func readThrough[V any](ctx context.Context, c *lru.Cache[string, V], key string, read func(context.Context, string) (V, error)) (V, error) {
	if v, ok := c.Get(key); ok {
		return v, nil
	}
	v, err := read(ctx, key)
	if err != nil {
		return v, err
	}
	c.Add(key, v)
	return v, nil
}
