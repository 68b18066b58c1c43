package orchestrator

import (
	"github.com/redis/go-redis/v9"

	"github.com/v0m3/v0m3/internal/store"
	"github.com/v0m3/v0m3/services/orchestrator/lifecycle"
	ostore "github.com/v0m3/v0m3/services/orchestrator/store"
)

// The orchestrator's store contract and its two implementations live in
// package store (services/orchestrator/store); these names keep the
// server's and its callers' spelling.
type (
	// Store is ostore.Store.
	Store = ostore.Store
	// Held is ostore.Held.
	Held = ostore.Held
	// TaskChange is ostore.TaskChange.
	TaskChange = ostore.TaskChange
	// Fence is ostore.Fence.
	Fence = ostore.Fence
	// Creation is ostore.Creation.
	Creation = ostore.Creation
	// LeaseTake is ostore.LeaseTake.
	LeaseTake = ostore.LeaseTake
	// Written is ostore.Written.
	Written = ostore.Written
	// OutboxEntry is ostore.OutboxEntry.
	OutboxEntry = ostore.OutboxEntry
	// OutboxClaim is ostore.OutboxClaim.
	OutboxClaim = ostore.OutboxClaim
	// TraceOutbox is ostore.TraceOutbox.
	TraceOutbox = ostore.TraceOutbox
	// EventFollower is ostore.EventFollower.
	EventFollower = ostore.EventFollower
)

// Errors of the store, as ostore names them.
var (
	// ErrFenced is ostore.ErrFenced.
	ErrFenced = ostore.ErrFenced
	// ErrApprovalUsed is ostore.ErrApprovalUsed.
	ErrApprovalUsed = ostore.ErrApprovalUsed
	// ErrNotAwaiting is ostore.ErrNotAwaiting.
	ErrNotAwaiting = ostore.ErrNotAwaiting
)

// NewBoltStore is ostore.NewBoltStore: the embedded store on db.
func NewBoltStore(db *store.DB) Store { return ostore.NewBoltStore(db) }

// NewRedisStore is ostore.NewRedisStore: the Redis store under prefix.
func NewRedisStore(c redis.UniversalClient, prefix string) Store {
	return ostore.NewRedisStore(c, prefix)
}

// The lifecycle's predicates and its attempt merge, under the names the
// server and its tests use.
var (
	unsettled          = lifecycle.Unsettled
	openAttempt        = lifecycle.OpenAttempt
	awaitingSettlement = lifecycle.AwaitingSettlement
	recoverable        = lifecycle.Recoverable
	lastAttempt        = lifecycle.LastAttempt
	mergeAttempt       = lifecycle.MergeAttempt
)
