package lifecycle

import (
	"google.golang.org/protobuf/proto"

	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
)

// Unsettled reports whether r still needs work or a decision: it is in a
// non-terminal state (requested, awaiting approval, approved) or has an
// attempt that was never ended.
func Unsettled(r *orchestratorv1.ToolRequest) bool {
	switch r.GetState() {
	case Requested, AwaitingApproval, Approved:
		return true
	}
	return OpenAttempt(r) != nil
}

// OpenAttempt returns r's attempt with no end time, or nil.
func OpenAttempt(r *orchestratorv1.ToolRequest) *orchestratorv1.Attempt {
	var open *orchestratorv1.Attempt
	for _, a := range r.GetAttempts() {
		if a.GetEndTime() == nil {
			open = a
		}
	}
	return open
}

// AwaitingSettlement reports whether r ended with an unknown outcome that
// evidence may still settle (the table's SettleExecuted and
// SettleNotExecuted rows).
func AwaitingSettlement(r *orchestratorv1.ToolRequest) bool {
	return r.GetState() == Failed && r.GetOutcome() == Unknown && LastAttempt(r) != nil
}

// Recoverable reports whether recovery has anything to do for r: it is
// unsettled, or its unknown outcome awaits evidence. The stores index
// requests by it.
func Recoverable(r *orchestratorv1.ToolRequest) bool {
	return Unsettled(r) || AwaitingSettlement(r)
}

// LastAttempt returns r's newest attempt, or nil.
func LastAttempt(r *orchestratorv1.ToolRequest) *orchestratorv1.Attempt {
	if n := len(r.GetAttempts()); n > 0 {
		return r.GetAttempts()[n-1]
	}
	return nil
}

// MergeAttempt inserts a copy of a into r or replaces the attempt with the
// same id, keeping the furthest stage ever persisted: a stage never moves
// backwards, whichever write lands last.
func MergeAttempt(r *orchestratorv1.ToolRequest, a *orchestratorv1.Attempt) {
	a = proto.CloneOf(a)
	for i, old := range r.Attempts {
		if old.GetId() == a.GetId() {
			a.Stage = max(a.GetStage(), old.GetStage())
			r.Attempts[i] = a
			return
		}
	}
	r.Attempts = append(r.Attempts, a)
}
