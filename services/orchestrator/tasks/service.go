package tasks

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/store"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// Store is what a task's life needs of the orchestrator's store
// (services/orchestrator/store implements it).
type Store interface {
	// CreateTask stores a new task; one with the same id fails with
	// store.ErrExists.
	CreateTask(ctx context.Context, t *orchestratorv1.Task) error
	// GetTask returns one task, or store.ErrNotFound.
	GetTask(ctx context.Context, id string) (*orchestratorv1.Task, error)
	// UpdateTask applies fn to the stored task and saves it atomically.
	UpdateTask(ctx context.Context, id string, fn func(*orchestratorv1.Task) error) (*orchestratorv1.Task, error)
	// ListTasks returns every task in state.
	ListTasks(ctx context.Context, state orchestratorv1.TaskState) ([]*orchestratorv1.Task, error)
	// PutCatalogue records the catalogue offered to a task.
	PutCatalogue(ctx context.Context, c *orchestratorv1.OfferedCatalogue) error
	// GetCatalogue returns a task's offered catalogue, or store.ErrNotFound.
	GetCatalogue(ctx context.Context, taskID string) (*orchestratorv1.OfferedCatalogue, error)
	// ListRequests returns a task's requests, oldest first.
	ListRequests(ctx context.Context, taskID string) ([]*orchestratorv1.ToolRequest, error)
}

// Requests is what ending a task needs back from the request side: the
// requests of a task are that side's, and only it changes them.
type Requests interface {
	// RefusePending refuses (reason, detail) every request of the task
	// that waits for a person: nobody can act on its approval any more.
	RefusePending(ctx context.Context, taskID, reason, detail string)
	// NoRequestInFlight fails REQUESTS_IN_FLIGHT while a request of the
	// task is being decided or executed.
	NoRequestInFlight(ctx context.Context, taskID string) error
}

// Reporter records what happened to a task: in its trace at evidence
// and in its task events (WatchTask). Both are logged, not returned, on
// failure: the change they tell of is already durable.
type Reporter interface {
	// Trace appends a product event to the task's trace.
	Trace(ctx context.Context, taskID string, ev *evidencev1.ProductEvent)
	// Emit appends a task event and wakes the task's watchers.
	Emit(ctx context.Context, taskID, requestID, typ, detail string)
}

// Deps are what a Service works with, all required except Log and Now
// (Policy and Registry only to compile catalogues).
type Deps struct {
	Store    Store
	Requests Requests
	Reporter Reporter
	// Internal logs a storage failure and turns it into the INTERNAL
	// error its caller answers, without the underlying detail.
	Internal func(ctx context.Context, what string, err error) error
	// Policy decides eligibility, registers a task's scope and mints its
	// handles.
	Policy policyv1.PolicyServiceClient
	// Registry answers the capability contracts a catalogue offers.
	Registry registryv1.RegistryServiceClient
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Log is where a Service logs; nil discards.
	Log *slog.Logger
}

// Service keeps tasks: it loads them, moves them through the table and
// ends them, telling the request side and the task's trace.
type Service struct {
	st       Store
	requests Requests
	report   Reporter
	internal func(ctx context.Context, what string, err error) error
	policy   policyv1.PolicyServiceClient
	registry registryv1.RegistryServiceClient
	now      func() time.Time
	log      *slog.Logger
}

// New returns a Service over d.
func New(d Deps) *Service {
	s := &Service{st: d.Store, requests: d.Requests, report: d.Reporter, internal: d.Internal, policy: d.Policy, registry: d.Registry, now: d.Now, log: d.Log}
	if s.now == nil {
		s.now = time.Now
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	return s
}

func (s *Service) timestamp() *timestamppb.Timestamp { return timestamppb.New(s.now()) }

// Load returns task id, or TASK_UNKNOWN.
func (s *Service) Load(ctx context.Context, id string) (*orchestratorv1.Task, error) {
	t, err := s.st.GetTask(ctx, id)
	if err != nil {
		return nil, s.Err(ctx, id, err)
	}
	return t, nil
}

// Err is the error a caller answers for err on task id: TASK_UNKNOWN
// when it does not exist, err itself when it already carries a reason,
// else an INTERNAL storage failure.
func (s *Service) Err(ctx context.Context, id string, err error) error {
	if errors.Is(err, store.ErrNotFound) {
		return apierror.New(codes.NotFound, "TASK_UNKNOWN", "task "+id+" does not exist", nil)
	}
	if apierror.Reason(err) != "" {
		return err
	}
	return s.internal(ctx, "load task", err)
}

// Catalogue returns the catalogue offered to task id, or
// CATALOGUE_UNKNOWN when it has none.
func (s *Service) Catalogue(ctx context.Context, id string) (*orchestratorv1.OfferedCatalogue, error) {
	cat, err := s.st.GetCatalogue(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, apierror.New(codes.NotFound, "CATALOGUE_UNKNOWN", "task "+id+" has no offered catalogue", nil)
	}
	if err != nil {
		return nil, s.internal(ctx, "get catalogue", err)
	}
	return cat, nil
}
