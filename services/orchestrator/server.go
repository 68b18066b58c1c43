// Package orchestrator is the product-facing API of V0M3. It owns tasks,
// offered catalogues, candidate requests, intents, attempts and approvals,
// and it is the only caller of the adapter's Execute: calling a remote
// server is the last step after every product decision, never the
// definition of one.
//
// A task's life is package tasks: its state table, starting it (the
// idempotent start, its catalogue), ending it and loading it; the
// server's task methods delegate to a tasks.Service and give it back
// what only the request side can do (see taskSide).
//
// One request's life is the table in package lifecycle, and each stage
// of it has a file of its own: submit.go receives the candidate,
// prepare.go decides it (checks, authorization, charge, or refusal),
// approve.go parks it for a person and uses the approval, attempt.go
// makes the attempts (retry.go: what may follow a failed one),
// observe.go turns a read's result into observations, commit.go commits
// an effect on its receipt or fails the request, settle.go settles an
// unknown outcome by evidence, and resume.go recovers what a stopped
// replica left.
package orchestrator

import (
	"context"
	"errors"
	"fmt"
	ostore "github.com/v0m3/v0m3/services/orchestrator/store"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/authz"
	"github.com/v0m3/v0m3/internal/capcache"
	"github.com/v0m3/v0m3/internal/deadline"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/ids"
	"github.com/v0m3/v0m3/internal/store"
	"github.com/v0m3/v0m3/internal/tracesend"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	leases "github.com/v0m3/v0m3/services/orchestrator/lease"
	"github.com/v0m3/v0m3/services/orchestrator/lifecycle"
	"github.com/v0m3/v0m3/services/orchestrator/outbox"
	"github.com/v0m3/v0m3/services/orchestrator/tasks"
)

// Deps are the services the orchestrator calls, through their gRPC clients.
type Deps struct {
	// Registry answers which capability, mapping and connection are current.
	Registry registryv1.RegistryServiceClient
	// Policy decides eligibility, authorization, handles and budgets.
	Policy policyv1.PolicyServiceClient
	// Adapter performs the remote call of an authorized attempt.
	Adapter adapterv1.AdapterServiceClient
	// Evidence records observations and the product trace.
	Evidence evidencev1.EvidenceServiceClient
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// ApprovalTTL is how long an approval may be given after it was asked
	// for; zero means DefaultApprovalTTL.
	ApprovalTTL time.Duration
	// AttemptTimeout bounds one adapter call; zero means
	// DefaultAttemptTimeout. A call cut off by it has an unknown outcome.
	AttemptTimeout time.Duration
	// InternalCallTimeout is the bound the process puts on each internal
	// call (see internal/deadline; zero means its default). The
	// work a request needs after its caller stopped waiting is bounded
	// from it and AttemptTimeout (see workTimeout).
	InternalCallTimeout time.Duration
	// AssetThreshold is the content size above which a retrieval whose
	// mapping allows asset references stores its content as an evidence
	// asset; zero means DefaultAssetThreshold.
	AssetThreshold int64
	// Credentials are the orchestrator's own service credentials: it signs
	// the execution grant of every adapter call with them, and verifies
	// the adapter's receipt attestations against their CA. nil is
	// plaintext development mode: calls carry no grant (only an adapter
	// started for plaintext accepts them) and a receipt read back from
	// evidence is never trusted, so recovery asks the server's status.
	Credentials *identity.Credentials
	// ReplicaID names this replica as the owner of the requests it works
	// on; "" means a new random id. Replicas sharing a store need
	// distinct ids.
	ReplicaID string
	// LeaseTTL is how long a replica's claim on an in-flight request lasts
	// without renewal; zero means DefaultLeaseTTL.
	LeaseTTL time.Duration
	// RecoveryInterval is how often unsettled requests nobody owns are
	// looked for and recovered; zero means DefaultRecoveryInterval.
	RecoveryInterval time.Duration
	// MCPBaseURL is the base URL under which this orchestrator's task MCP
	// endpoints are reached (see MCPBackend), e.g. "https://v0m3.example";
	// "" means no endpoint is served and MCP access is refused.
	MCPBaseURL string
	// MCPTokenTTL is how long a task MCP token lasts; zero means
	// DefaultMCPTokenTTL.
	MCPTokenTTL time.Duration
	// ApprovalURL is the page where a person approves a request, with
	// "{request_id}" in it, e.g. "https://console.example/approvals/{request_id}".
	// When set, a task MCP client on a protocol version with
	// input_required (2026-07-28) that accepts URL-mode elicitation is
	// asked through it to have the request approved; "" means the call
	// answers with the pending text only.
	ApprovalURL string
	// FailPoint, for tests only, is asked at each fail point (the
	// FailPoint* constants); an error stops the call there as if this
	// replica's process died. nil in production.
	FailPoint func(point string) error
}

// Server implements orchestratorv1.OrchestratorServiceServer.
type Server struct {
	orchestratorv1.UnimplementedOrchestratorServiceServer

	st    ostore.Store
	deps  Deps
	log   *slog.Logger
	now   func() time.Time
	notes *notifier
	// authz asks policy about callers' actions on tasks and requests.
	authz authz.Decider
	// caps holds capability contracts by revision (see prepare).
	caps capcache.Cache

	approvalTTL    time.Duration
	attemptTimeout time.Duration
	// workTimeout bounds the detached work on one request (see detach).
	workTimeout time.Duration

	// replica owns the leases this server takes (see own), which leases
	// manages; it also knows the requests a call of this server works
	// on, so its own recovery never joins in.
	replica          string
	leaseTTL         time.Duration
	recoveryInterval time.Duration
	leases           *leases.Manager
	// settles spaces the automatic checks of unknown outcomes.
	settles settleSchedule
	// unrecorded holds read results whose observation evidence could not
	// record yet (see recordResult).
	unrecorded unrecordedResults
	// outboxPending is set while trace events may wait in the outbox:
	// new ones then queue behind them (see appendTraces).
	outboxPending atomic.Bool
	// direct holds the keys of outbox entries a live call wrote with its
	// state change and delivers itself at its next checkpoint; the outbox
	// loop stops before them so they are not sent twice.
	direct sync.Map
	// sweep deletes the entries calls delivered, off their path.
	sweep *outbox.Sweeper
	// traces carries concurrent deliveries of trace events to evidence
	// in shared round trips (see deliverTraces).
	traces *tracesend.Sender
	// watchPoll is how often a WatchTask stream reads the store unwoken.
	watchPoll time.Duration
	// tasks keeps the tasks' life: loading, ending, stopping a start.
	tasks *tasks.Service
	// actors keeps tasks as read to decide who may act on them (see
	// openTaskToAct).
	actors *lru.Cache[string, *orchestratorv1.Task]

	// ctx ends when Close is called; background work and watch streams
	// stop with it.
	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// NewServer returns an orchestrator over st. When deps.Registry is set it
// also starts a background watch of registry events that marks tasks
// CONNECTION_UNAVAILABLE when their connection is retired, and a
// continuous recovery of unsettled requests no replica owns (see
// recoverLoop); Close stops both.
func NewServer(st ostore.Store, deps Deps, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	now := deps.Now
	if now == nil {
		now = time.Now
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{st: st, deps: deps, log: log, now: now, notes: newNotifier(), ctx: ctx, cancel: cancel,
		approvalTTL: deps.ApprovalTTL, attemptTimeout: deps.AttemptTimeout,
		replica: deps.ReplicaID, leaseTTL: deps.LeaseTTL, recoveryInterval: deps.RecoveryInterval,
		watchPoll: watchPoll}
	if s.replica == "" {
		s.replica = ids.New("orch")
	}
	if deps.Evidence != nil {
		s.traces = tracesend.New(deps.Evidence)
	}
	s.tasks = tasks.New(tasks.Deps{Store: st, Requests: taskSide{s}, Reporter: taskSide{s}, Internal: s.internal, Policy: deps.Policy, Registry: deps.Registry, Now: now, Log: log})
	s.actors, _ = lru.New[string, *orchestratorv1.Task](maxActorTasks) // fails only for a size below 1
	if s.leaseTTL <= 0 {
		s.leaseTTL = DefaultLeaseTTL
	}
	s.leases = leases.NewManager(ctx, st, s.replica, s.leaseTTL, log)
	s.sweep = outbox.NewSweeper(s.claimTTL(), func(ctx context.Context, entries []ostore.OutboxEntry) error {
		return s.deleteDelivered(ctx, entries, len(entries))
	}, s.undirect)
	if s.recoveryInterval <= 0 {
		s.recoveryInterval = DefaultRecoveryInterval
	}
	s.authz = authz.Remote(deps.Policy)
	if s.approvalTTL <= 0 {
		s.approvalTTL = DefaultApprovalTTL
	}
	if s.attemptTimeout <= 0 {
		s.attemptTimeout = DefaultAttemptTimeout
	}
	internal := deps.InternalCallTimeout
	if internal <= 0 {
		internal = deadline.DefaultInternalCallTimeout
	}
	// Every attempt one execution may make, and the internal calls around
	// them, each at its own bound.
	s.workTimeout = time.Duration(1+maxAutomaticRetries+maxRevisionFollows)*s.attemptTimeout + workInternalCalls*internal
	if deps.Registry != nil {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.recoverLoop(ctx)
		}()
	}
	if f, ok := st.(ostore.EventFollower); ok {
		s.wg.Go(func() { s.followEvents(ctx, f) })
	}
	if deps.Registry != nil {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.watchRegistry(ctx)
		}()
	}
	return s
}

// Close stops background work and ends open WatchTask streams. The
// results held until evidence records them die with the process: their
// requests' leases are released, so another replica recovers them at
// once. It is safe to call more than once.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		s.cancel()
		s.wg.Wait()
		s.sweep.Close()
		for _, r := range s.unrecorded.held() {
			s.unrecorded.drop(r.requestID)
		}
	})
}

func (s *Server) timestamp() *timestamppb.Timestamp { return timestamppb.New(s.now()) }

// StartTask plans a task, persists it, compiles its offered catalogue and
// returns both.
func (s *Server) StartTask(ctx context.Context, req *orchestratorv1.StartTaskRequest) (*orchestratorv1.StartTaskResponse, error) {
	if req.GetMcpAccess() && s.deps.MCPBaseURL == "" {
		return nil, errMCPDisabled()
	}
	requester, actor, err := s.requesterOf(ctx, req.GetOnBehalfOf())
	if err != nil {
		return nil, err
	}
	for _, sc := range []struct {
		field, what string
		refs        []*orchestratorv1.SourceRef
	}{{"source_scope", "source", req.GetSourceScope()}, {"artifact_scope", "artifact", req.GetArtifactScope()}, {"destination_scope", "destination", req.GetDestinationScope()}} {
		if err := checkScope(sc.field, sc.what, sc.refs); err != nil {
			return nil, err
		}
	}
	id := ids.New("task")
	if rid := req.GetRequestId(); rid != "" {
		if err := tasks.CheckRequestID(rid); err != nil {
			return nil, err
		}
		id = tasks.IdempotentID(requester.GetId(), actor, rid)
		if exists, err := s.tasks.Exists(ctx, id); exists {
			return s.replayStart(ctx, req, id, requester, actor)
		} else if err != nil {
			return nil, s.internal(ctx, "load task", err)
		}
	}
	// The request is checked before the registry is asked anything, and a
	// refused profile leaves nothing behind: no task, no registration.
	profile, err := s.profileOf(ctx, req)
	if err != nil {
		return nil, err
	}
	// What the task is scoped to is what its requester (and actor) may
	// read or reach: a refused entry leaves nothing behind either.
	if err := s.authorizeScope(ctx, req, profile, requester, actor); err != nil {
		return nil, err
	}
	needed := plan(profile, req.GetEvidencePresent())

	now := s.timestamp()
	task := &orchestratorv1.Task{
		Id:                 id,
		RequestId:          req.GetRequestId(),
		Requester:          requester,
		Actor:              actor,
		Purpose:            req.GetPurpose(),
		SourceScope:        req.GetSourceScope(),
		ArtifactScope:      req.GetArtifactScope(),
		DestinationScope:   req.GetDestinationScope(),
		EvidencePresent:    req.GetEvidencePresent(),
		NeededCapabilities: needed,
		Profile:            profile.GetName(),
		ProfileRevision:    profile.GetRevision(),
		PolicyPurpose:      profilePurpose(profile),
		Checkpoint:         "task started; nothing executed",
		CreateTime:         now,
		UpdateTime:         now,
	}
	//lint:ignore SA1019 a task records the deprecated kind as it was given.
	task.Kind = req.GetKind()
	if err := s.tasks.Create(ctx, task); err != nil {
		if req.GetRequestId() != "" && errors.Is(err, store.ErrExists) {
			// Another call with the same request id created it first.
			return s.replayStart(ctx, req, id, requester, actor)
		}
		return nil, s.internal(ctx, "persist task", err)
	}
	if err := s.failAt(ctx, FailPointTaskCreated); err != nil {
		return nil, err
	}
	// The catalogue is stored within StartRetryWait of the task, or not
	// at all: past StartAbandoned a retry ends a task still without one.
	ctx, cancel := context.WithTimeout(ctx, tasks.StartRetryWait)
	defer cancel()
	s.log.InfoContext(ctx, "task started", "task", task.GetId(), "profile", task.GetProfile(), "profile_revision", task.GetProfileRevision(), "requester", task.GetRequester().GetId(), "actor", actor, "needed", needed)
	startedBy := task.GetRequester().GetId()
	if actor != "" {
		startedBy = fmt.Sprintf("%s for %s", actor, startedBy)
	}
	s.trace(ctx, task.GetId(), &evidencev1.ProductEvent{
		Kind:      evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_TASK_STARTED,
		Requester: task.GetRequester().GetId(),
		Actor:     actor,
		Detail: fmt.Sprintf("task %s (profile %s r%d, purpose %s) started by %s; plan needs %s", task.GetId(), task.GetProfile(), task.GetProfileRevision(),
			purposeOf(task), startedBy, listOrNone(needed)),
	})
	s.emit(ctx, task.GetId(), "", "task.started", "plan needs "+listOrNone(needed))

	cat, err := s.tasks.Offer(ctx, task, profile.GetDefaultBudget())
	if err != nil {
		return nil, err
	}
	out := &orchestratorv1.StartTaskResponse{Task: task, Catalogue: cat}
	if req.GetMcpAccess() {
		if out.McpEndpoint, err = s.mintMCPToken(ctx, task); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// GetTask returns one task.
func (s *Server) GetTask(ctx context.Context, req *orchestratorv1.GetTaskRequest) (*orchestratorv1.Task, error) {
	if req.GetId() == "" {
		return nil, missing("id")
	}
	return s.openTask(ctx, req.GetId(), authz.TaskRead)
}

// GetCatalogue returns a task's offered catalogue.
func (s *Server) GetCatalogue(ctx context.Context, req *orchestratorv1.GetCatalogueRequest) (*orchestratorv1.OfferedCatalogue, error) {
	if req.GetTaskId() == "" {
		return nil, missing("task_id")
	}
	if _, err := s.openTask(ctx, req.GetTaskId(), authz.TaskRead); err != nil {
		return nil, err
	}
	return s.tasks.Catalogue(ctx, req.GetTaskId())
}

// GetRequest returns one candidate request with its attempts.
func (s *Server) GetRequest(ctx context.Context, req *orchestratorv1.GetRequestRequest) (*orchestratorv1.ToolRequest, error) {
	if req.GetId() == "" {
		return nil, missing("id")
	}
	r, _, err := s.openRequest(ctx, req.GetId(), authz.TaskRead)
	return r, err
}

// CancelTask cancels an active task. Requests waiting for approval are
// refused with TASK_CANCELLED. Cancelling a cancelled task returns it.
func (s *Server) CancelTask(ctx context.Context, req *orchestratorv1.CancelTaskRequest) (*orchestratorv1.Task, error) {
	if req.GetId() == "" {
		return nil, missing("id")
	}
	if _, err := s.openTask(ctx, req.GetId(), taskWrite); err != nil {
		return nil, err
	}
	return s.tasks.Cancel(ctx, req.GetId(), req.GetReason())
}

// CompleteTask marks an active task completed; a completed task accepts
// no request afterwards (TASK_NOT_ACTIVE, metadata state "completed").
// It is refused with REQUESTS_IN_FLIGHT while a request of the task is
// being decided or executed (state REQUESTED or APPROVED): the product
// waits for those to end (WatchTask) or cancels the task instead.
// Requests waiting for a person are refused with TASK_COMPLETED: nobody
// can act on their approval any more. Completing a completed task
// returns it.
func (s *Server) CompleteTask(ctx context.Context, req *orchestratorv1.CompleteTaskRequest) (*orchestratorv1.Task, error) {
	if req.GetId() == "" {
		return nil, missing("id")
	}
	cur, err := s.openTask(ctx, req.GetId(), taskWrite)
	if err != nil {
		return nil, err
	}
	return s.tasks.Complete(ctx, cur, req.GetReason())
}

// noRequestInFlight fails REQUESTS_IN_FLIGHT when a request of the task
// is being decided or executed (REQUESTED or APPROVED). A request with an
// open attempt is in flight until recovery settles it. One without, last
// changed more than two attempt timeouts ago, is not: the process deciding
// it is gone (it crashed before its first attempt), and nothing was sent
// for it, so it must not keep the task open forever.
func (s *Server) noRequestInFlight(ctx context.Context, taskID string) error {
	rs, err := s.st.ListRequests(ctx, taskID)
	if err != nil {
		return s.internal(ctx, "list requests", err)
	}
	stale := s.now().Add(-2 * s.attemptTimeout)
	var busy []string
	for _, r := range rs {
		if st := r.GetState(); st != orchestratorv1.RequestState_REQUEST_STATE_REQUESTED && st != orchestratorv1.RequestState_REQUEST_STATE_APPROVED {
			continue
		}
		open := slices.ContainsFunc(r.GetAttempts(), func(a *orchestratorv1.Attempt) bool { return a.GetEndTime() == nil })
		if !open && r.GetUpdateTime().AsTime().Before(stale) {
			continue
		}
		busy = append(busy, r.GetId())
	}
	if len(busy) == 0 {
		return nil
	}
	return apierror.New(codes.FailedPrecondition, "REQUESTS_IN_FLIGHT",
		fmt.Sprintf("task %s has %d request(s) still being decided or executed (%s); wait for them to end (WatchTask) or cancel the task", taskID, len(busy), strings.Join(busy, ", ")),
		map[string]string{"task_id": taskID, "request_ids": strings.Join(busy, ",")})
}

// refusePending refuses every request of a task that is waiting for a
// human: the task it belonged to can no longer act on an approval.
func (s *Server) refusePending(ctx context.Context, taskID, reason, detail string) {
	rs, err := s.st.ListRequests(ctx, taskID)
	if err != nil {
		s.log.WarnContext(ctx, "list requests to refuse", "task", taskID, "err", err)
		return
	}
	for _, r := range rs {
		if r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_AWAITING_APPROVAL {
			continue
		}
		_, err := s.updateRequest(ctx, r.GetId(), func(r *orchestratorv1.ToolRequest) error {
			if r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_AWAITING_APPROVAL {
				return errStateChanged
			}
			if err := lifecycle.Move(r, lifecycle.Refuse, lifecycle.NoOutcome); err != nil {
				return err
			}
			r.RefusalReason, r.RefusalDetail = reason, detail
			r.RefusalCode = codeName(codes.FailedPrecondition)
			r.UpdateTime = s.timestamp()
			return nil
		}, func(ctx context.Context) {
			s.trace(ctx, taskID, &evidencev1.ProductEvent{
				Kind: evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_REQUEST_REFUSED, Capability: r.GetCapability(),
				RequestId: r.GetId(), IntentId: r.GetIntentId(), Reason: reason, Detail: detail,
			})
			s.emit(ctx, taskID, r.GetId(), "request.refused", reason+": "+detail)
		})
		if err != nil && !errors.Is(err, errStateChanged) {
			s.log.WarnContext(ctx, "refuse pending request", "request", r.GetId(), "err", err)
		}
	}
}

// errStateChanged aborts an update whose precondition no longer holds.
var errStateChanged = errors.New("state changed concurrently")

// loadTask returns task id, or TASK_UNKNOWN (see tasks.Service.Load).
func (s *Server) loadTask(ctx context.Context, id string) (*orchestratorv1.Task, error) {
	return s.tasks.Load(ctx, id)
}

// taskErr is the error answered for err on task id (see tasks.Service.Err).
func (s *Server) taskErr(ctx context.Context, id string, err error) error {
	return s.tasks.Err(ctx, id, err)
}

func (s *Server) loadRequest(ctx context.Context, id string) (*orchestratorv1.ToolRequest, error) {
	r, err := s.st.GetRequest(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, apierror.New(codes.NotFound, "REQUEST_UNKNOWN", "request "+id+" does not exist", nil)
	}
	if err != nil {
		return nil, s.internal(ctx, "load request", err)
	}
	return r, nil
}

// internal logs a storage failure and returns an INTERNAL error without
// the underlying detail.
func (s *Server) internal(ctx context.Context, what string, err error) error {
	if apierror.Reason(err) == reasonLeaseLost {
		return err // a fenced write, logged (see fenced)
	}
	s.log.ErrorContext(ctx, what, "err", err)
	return apierror.Store(apierror.ReasonStoreFailure, "the orchestrator could not "+what, err)
}

func missing(field string) error {
	return apierror.InvalidArgument(apierror.ReasonFieldRequired, field+" is required",
		apierror.FieldViolation{Field: field, Description: "required"})
}

// checkScope refuses a scope entry without a URI or listed twice; what
// names the entries in the message, e.g. "source".
func checkScope(field, what string, refs []*orchestratorv1.SourceRef) error {
	seen := map[string]bool{}
	for i, ref := range refs {
		at := fmt.Sprintf("%s[%d].uri", field, i)
		if ref.GetUri() == "" {
			return apierror.InvalidArgument(apierror.ReasonFieldRequired, at+" is required",
				apierror.FieldViolation{Field: at, Description: "required"})
		}
		if seen[ref.GetUri()] {
			return apierror.InvalidArgument(apierror.ReasonFieldInvalid, fmt.Sprintf("%s lists the same %s twice", field, what),
				apierror.FieldViolation{Field: at, Description: "duplicate " + what})
		}
		seen[ref.GetUri()] = true
	}
	return nil
}
