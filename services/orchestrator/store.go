package orchestrator

import (
	"github.com/v0m3/v0m3/services/orchestrator/lifecycle"
)

// The orchestrator's store contract and its two implementations live in
// package store (services/orchestrator/store), imported here as ostore.

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
