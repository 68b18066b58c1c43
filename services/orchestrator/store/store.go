// Package store is the orchestrator's one Store contract (tasks,
// requests, their leases and fences, task events, the trace outbox, MCP
// tokens) and its two implementations, an embedded bbolt store and Redis,
// which pass one conformance suite (services/orchestrator/storetest). It
// keeps the lifecycle's indexes (open and recoverable requests) and its
// rules that must hold inside a transaction: one-time approval use, a
// stage that never moves backwards.
package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	"github.com/v0m3/v0m3/services/orchestrator/lifecycle"
)

// Store is the orchestrator's persistence contract: tasks, their offered
// catalogues, candidate requests with their attempts, and per-task events.
// Every method is atomic on its own; the read-modify-write methods run fn
// inside one transaction so concurrent callers never lose an update.
// Missing records fail with an error wrapping kv.ErrNotFound.
type Store interface {
	// TraceOutbox holds trace events until evidence takes them.
	TraceOutbox
	// CreateTask stores a new task; a task with the same id fails with
	// kv.ErrExists.
	CreateTask(ctx context.Context, t *orchestratorv1.Task) error
	// GetTask returns one task.
	GetTask(ctx context.Context, id string) (*orchestratorv1.Task, error)
	// UpdateTask applies fn to the stored task and saves the result in one
	// transaction. An error from fn aborts the update and is returned. fn
	// may run more than once (a retried transaction, or a group commit
	// rolled back for another's error): it must only change the task.
	UpdateTask(ctx context.Context, id string, fn func(*orchestratorv1.Task) error) (*orchestratorv1.Task, error)
	// UpdateTaskEmit is UpdateTask that also writes held in the same
	// transaction: its task events appended (as AppendEvent does each, in
	// order) and its trace events put in the trace outbox (as
	// PutTraceOutbox does). A state change and the events that tell of it
	// are durable together or not at all. It returns what was written.
	UpdateTaskEmit(ctx context.Context, id string, fn func(*orchestratorv1.Task) error, held Held) (*orchestratorv1.Task, Written, error)
	// ListTasks returns every task in the given state (every task when
	// state is unspecified), in no particular order.
	ListTasks(ctx context.Context, state orchestratorv1.TaskState) ([]*orchestratorv1.Task, error)

	// PutCatalogue records the catalogue offered to a task.
	PutCatalogue(ctx context.Context, c *orchestratorv1.OfferedCatalogue) error
	// GetCatalogue returns the catalogue offered to a task.
	GetCatalogue(ctx context.Context, taskID string) (*orchestratorv1.OfferedCatalogue, error)
	// CreateRequest stores r unless a request with the same task id and
	// provider call id exists, in which case it returns that one and
	// created is false. This is what makes resubmission idempotent.
	CreateRequest(ctx context.Context, r *orchestratorv1.ToolRequest) (got *orchestratorv1.ToolRequest, created bool, err error)
	// CreateRequestEmit is CreateRequest that also writes held in the same
	// transaction when it creates the request (as UpdateTaskEmit does);
	// when the request existed, held is not written. When it creates the
	// request it also reads the request's task and offered catalogue in
	// that transaction (see Creation). With a lease to take, it also
	// takes the new request's lease (AcquireLease with gen 0) with the
	// creation, so the request is never stored unowned, at no round trip
	// of its own (Creation.LeaseGeneration); no lease is taken when the
	// request existed.
	CreateRequestEmit(ctx context.Context, r *orchestratorv1.ToolRequest, held Held, lease LeaseTake) (Creation, error)
	// GetRequest returns one request.
	GetRequest(ctx context.Context, id string) (*orchestratorv1.ToolRequest, error)
	// UpdateRequest applies fn to the stored request and saves the result in
	// one transaction. An error from fn aborts the update and is returned.
	// fn may run more than once, as for UpdateTask. It writes no events
	// and is not fenced: the server changes requests only through
	// UpdateRequestEmit (Server.updateRequest); this, SaveAttempt and
	// UseApproval serve tools and tests.
	UpdateRequest(ctx context.Context, id string, fn func(*orchestratorv1.ToolRequest) error) (*orchestratorv1.ToolRequest, error)
	// UpdateRequestEmit is UpdateRequest that also writes held in the
	// same transaction, as UpdateTaskEmit does. It is the one way the
	// server changes a request (Server.updateRequest).
	UpdateRequestEmit(ctx context.Context, id string, fn func(*orchestratorv1.ToolRequest) error, held Held) (*orchestratorv1.ToolRequest, Written, error)
	// SaveAttempt inserts or updates (by attempt id) one attempt of a
	// request. The persisted stage never moves backwards.
	SaveAttempt(ctx context.Context, requestID string, a *orchestratorv1.Attempt) (*orchestratorv1.ToolRequest, error)
	// ListRequests returns a task's requests, oldest first.
	ListRequests(ctx context.Context, taskID string) ([]*orchestratorv1.ToolRequest, error)
	// ListOpenRequests returns every request with an attempt that has no
	// end time: an attempt a previous process started and never finished.
	// Recovery starts from these.
	ListOpenRequests(ctx context.Context) ([]*orchestratorv1.ToolRequest, error)
	// UseApproval marks a request's approval used by approver at the given
	// time and moves the request from AWAITING_APPROVAL to APPROVED, in one
	// transaction: an approval is used once. It fails with
	// ErrApprovalUsed when the approval was already used, ErrNotAwaiting
	// when the request is not awaiting approval (or has no approval).
	UseApproval(ctx context.Context, requestID, approver string, at *timestamppb.Timestamp) (*orchestratorv1.ToolRequest, error)
	// ListUnsettledRequests returns every request that is not in a
	// terminal state (requested, awaiting approval, approved), has an
	// attempt with no end time, or failed with an unknown outcome that
	// evidence may still settle (see recoverable). Continuous recovery
	// starts from these.
	ListUnsettledRequests(ctx context.Context) ([]*orchestratorv1.ToolRequest, error)

	// AcquireLease makes owner the one replica working on a request until
	// ttl from now, by the store's clock, and returns the lease's
	// generation, or 0 when owner does not hold it. With gen 0 it takes a
	// new lease: it succeeds when the request has no live lease of
	// another owner, and the new generation is greater than any the
	// request had. With the generation of owner's lease it renews that
	// lease, and fails when another lease was taken since (even one that
	// ended since). A lease is what keeps two replicas from acting on one
	// in-flight request; its generation fences the writes made under it
	// (see Fence).
	AcquireLease(ctx context.Context, requestID, owner string, gen int64, ttl time.Duration) (int64, error)
	// ReleaseLease ends owner's lease on a request; a lease another owner
	// holds is left as it is.
	ReleaseLease(ctx context.Context, requestID, owner string) error

	// AddAccessToken records one task-scoped MCP token (its digest, never
	// the token) with its task, dropping the task's tokens expired at
	// t.create_time and, beyond maxAccessTokens, the oldest.
	AddAccessToken(ctx context.Context, t *orchestratorv1.TaskAccessToken) error
	// ListAccessTokens returns the MCP tokens recorded for a task, oldest
	// first; none is an empty list, not an error.
	ListAccessTokens(ctx context.Context, taskID string) ([]*orchestratorv1.TaskAccessToken, error)

	// EmitHeld writes held, with no state change, in one transaction (as
	// UpdateTaskEmit does) and returns what was written.
	EmitHeld(ctx context.Context, held Held) (Written, error)
	// AppendEvent assigns e the task's next sequence number (starting at 1)
	// and stores it.
	AppendEvent(ctx context.Context, e *orchestratorv1.TaskEvent) (*orchestratorv1.TaskEvent, error)
	// ListEvents returns a task's events with a sequence greater than after,
	// in order.
	ListEvents(ctx context.Context, taskID string, after int64) ([]*orchestratorv1.TaskEvent, error)
}

// Held is what tells of one state change: the task events and the trace
// events a store writes in the same transaction as the change, so a
// process killed right after it cannot lose them.
type Held struct {
	Events []*orchestratorv1.TaskEvent
	Traces []*evidencev1.TraceEvent
	// Fence is the lease the transaction is made under.
	Fence Fence
	// Claim is who delivers the trace events put in the outbox.
	Claim OutboxClaim
	// Delivered are outbox entries their calls delivered, deleted in the
	// same transaction (as DeleteTraceOutbox would): the deletes ride a
	// write the replica makes anyway instead of a store write of their
	// own.
	Delivered []OutboxEntry
	// Task, when set, changes a task in the same transaction: what a
	// call's end sums up on its task rides the request's commit instead
	// of a commit of its own. It is secondary to the write it rides: a
	// missing task, or an error from its Fn, leaves the task as it was
	// and does not fail the write (Written.TaskErr says why). UpdateTaskEmit,
	// which changes a task itself, refuses it.
	Task *TaskChange
}

// TaskChange applies Fn to the task ID (see Held.Task). Fn may run more
// than once, as UpdateTask's may.
type TaskChange struct {
	ID string
	Fn func(*orchestratorv1.Task) error
}

// apply applies c to t, read from the store with readErr (a missing task
// is kv.ErrNotFound), and returns why the task is left as it was, nil
// when t is to be written.
func (c *TaskChange) apply(t *orchestratorv1.Task, readErr error) error {
	err := readErr
	if err == nil {
		err = c.Fn(t)
	}
	if err != nil {
		return fmt.Errorf("task %s: %w", c.ID, err)
	}
	return nil
}

// errTaskChangeHeld is UpdateTaskEmit's refusal of a Held.Task.
var errTaskChangeHeld = errors.New("UpdateTaskEmit changes a task itself: held.Task must be nil")

// Fence names the lease a write is made under. A store refuses the write
// with ErrFenced, in the write's own transaction, when a lease of a newer
// generation was taken on the request since: the writer was frozen or cut
// off long enough for another replica to take the request over, and what
// it still holds must not be written after its successor's account. The
// zero Fence writes unconditionally (a write under no lease, such as an
// approver's denial).
type Fence struct {
	RequestID  string
	Generation int64
}

// ErrFenced is the error of a write whose Fence is stale.
var ErrFenced = errors.New("another replica took the request over: write fenced")

// fenced reports whether f is stale against current, the request's
// newest lease generation, 0 when the store knows none: a generation is
// kept while its request is leased (see leaseGenerationTTL), so a write
// under one the store forgot is older than that.
func (f Fence) fenced(current int64) bool {
	return f.Generation != 0 && (current == 0 || current > f.Generation)
}

// leaseGenerationTTL is how long the Redis store keeps a request's lease
// generation after its lease was last taken or renewed (at least three
// lease ttls; the embedded store keeps them less, see
// boltGenerationKeep): a live lease keeps it, and a store does not hold a
// record for every request ever leased. Generations come from one counter
// per store, so a lease taken after the record ended still gets a newer
// one.
const leaseGenerationTTL = 24 * time.Hour

// generationTTL is how long the Redis store keeps a generation taken or
// renewed with lease ttl.
func generationTTL(ttl time.Duration) time.Duration { return max(leaseGenerationTTL, 3*ttl) }

// Creation is what CreateRequestEmit found or did.
type Creation struct {
	// Request is the request stored: the new one when Created, else the
	// one of the same task and provider call id that existed.
	Request *orchestratorv1.ToolRequest
	Created bool
	// Written is what was stored of the Held (nothing when the request
	// existed).
	Written Written
	// Task and Catalogue are, when the request was created, its task and
	// the catalogue offered to it, read in the creating transaction: a
	// change to the task that committed first is seen here, and one that
	// commits later finds the request stored. The task is as it was
	// before a task change held with the creation. Task is nil when the
	// task does not exist, Catalogue when none was recorded.
	Task      *orchestratorv1.Task
	Catalogue *orchestratorv1.OfferedCatalogue
	// LeaseGeneration is the generation of the lease taken with the
	// creation; 0 when none was asked for or the request existed.
	LeaseGeneration int64
}

// LeaseTake asks CreateRequestEmit to take the new request's lease for
// Owner, for TTL (see AcquireLease). The zero LeaseTake takes none.
type LeaseTake struct {
	Owner string
	TTL   time.Duration
}

// Written is what a transaction stored of its Held: the task events with
// their sequences, and the trace events as outbox entries, in order.
type Written struct {
	Events []*orchestratorv1.TaskEvent
	Outbox []OutboxEntry
	// TaskErr is why Held.Task was not applied, nil when it was (or
	// there was none).
	TaskErr error
}

// Errors of Store.UseApproval.
var (
	// ErrApprovalUsed means the approval was used already.
	ErrApprovalUsed = errors.New("approval already used")
	// ErrNotAwaiting means the request is not awaiting approval.
	ErrNotAwaiting = errors.New("request not awaiting approval")
)

// UseApproval is the one-time-use rule both stores apply inside their
// request transaction: an approval already used fails ErrApprovalUsed, a
// request not awaiting approval fails ErrNotAwaiting.
func UseApproval(approver string, at *timestamppb.Timestamp) func(*orchestratorv1.ToolRequest) error {
	return func(r *orchestratorv1.ToolRequest) error {
		a := r.GetApproval()
		switch {
		case a.GetUseTime() != nil:
			return ErrApprovalUsed
		case a == nil || r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_AWAITING_APPROVAL:
			return ErrNotAwaiting
		}
		if err := lifecycle.Move(r, lifecycle.Approve, lifecycle.NoOutcome); err != nil {
			return err
		}
		a.Approver, a.UseTime = approver, at
		r.UpdateTime = at
		return nil
	}
}

// maxAccessTokens bounds the MCP tokens kept per task: minting more drops
// the oldest, so a requester minting in a loop cannot grow the record.
const maxAccessTokens = 16

// addAccessToken is the rule both stores apply inside their transaction:
// tokens expired when t was minted go, t is appended, and only the newest
// maxAccessTokens stay.
func addAccessToken(list *orchestratorv1.TaskAccessTokens, t *orchestratorv1.TaskAccessToken) {
	now := t.GetCreateTime().AsTime()
	kept := list.GetTokens()[:0]
	for _, old := range list.GetTokens() {
		if old.GetExpireTime().AsTime().After(now) {
			kept = append(kept, old)
		}
	}
	kept = append(kept, t)
	if len(kept) > maxAccessTokens {
		kept = kept[len(kept)-maxAccessTokens:]
	}
	list.Tokens = kept
}

// The lifecycle's predicates the stores index requests by, and its
// attempt merge.
var (
	openAttempt  = lifecycle.OpenAttempt
	recoverable  = lifecycle.Recoverable
	mergeAttempt = lifecycle.MergeAttempt
)

// EventFollower is implemented by a Store shared between processes: it
// tells of the events every replica stores, which the in-process notifier
// cannot see. The server follows it for as long as it runs and wakes its
// WatchTask streams.
type EventFollower interface {
	// FollowEvents sends the task id of each event any replica appends,
	// until ctx ends (then the channel closes). It returns once following
	// has begun.
	FollowEvents(ctx context.Context) (<-chan string, error)
}
