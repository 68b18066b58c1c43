// Package lifecycle is the life of one tool request as data: the request
// states, the delivery stages and outcomes of its attempts, the events
// that move them, and one transition table that says, for each state and
// event, the next state, the stages and outcomes allowed there, and (in a
// second table) what may follow a failed attempt by the capability's
// retry rule. The orchestrator's execution path and its recovery (resume,
// retry, sweep, settle) change a request or an attempt only through Move
// and MoveAttempt, so an illegal transition is refused here, in one place,
// whichever path asked for it.
//
// It holds no I/O and no clock: callers persist what it sets.
package lifecycle

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// State is a request state, recorded on the request.
type State = orchestratorv1.RequestState

// Request states, in the design's vocabulary. The stages before a request
// exists (discovered, registered, eligible, offered) belong to the
// catalogue, not to a request record.
const (
	// None is a request not yet recorded.
	None             = orchestratorv1.RequestState_REQUEST_STATE_UNSPECIFIED
	Requested        = orchestratorv1.RequestState_REQUEST_STATE_REQUESTED
	AwaitingApproval = orchestratorv1.RequestState_REQUEST_STATE_AWAITING_APPROVAL
	Approved         = orchestratorv1.RequestState_REQUEST_STATE_APPROVED
	Executed         = orchestratorv1.RequestState_REQUEST_STATE_EXECUTED
	Failed           = orchestratorv1.RequestState_REQUEST_STATE_FAILED
	Refused          = orchestratorv1.RequestState_REQUEST_STATE_REFUSED
	Denied           = orchestratorv1.RequestState_REQUEST_STATE_DENIED
)

// Stage is an attempt's delivery stage; it never moves backwards.
type Stage = adapterv1.DeliveryStage

// Delivery stages, recorded per attempt.
const (
	Prepared        = adapterv1.DeliveryStage_DELIVERY_STAGE_PREPARED
	Sent            = adapterv1.DeliveryStage_DELIVERY_STAGE_SENT
	Acknowledged    = adapterv1.DeliveryStage_DELIVERY_STAGE_ACKNOWLEDGED
	ResultObserved  = adapterv1.DeliveryStage_DELIVERY_STAGE_RESULT_OBSERVED
	ReceiptVerified = adapterv1.DeliveryStage_DELIVERY_STAGE_RECEIPT_VERIFIED
	Committed       = adapterv1.DeliveryStage_DELIVERY_STAGE_COMMITTED
	// Keep asks MoveAttempt to leave the stage where it is.
	Keep = adapterv1.DeliveryStage_DELIVERY_STAGE_UNSPECIFIED
)

// Outcome is what an attempt, and a request that ended, came to.
type Outcome = adapterv1.Outcome

// Outcomes. NoOutcome is an attempt the adapter has not answered yet.
const (
	NoOutcome      = adapterv1.Outcome_OUTCOME_UNSPECIFIED
	OK             = adapterv1.Outcome_OUTCOME_OK
	InvalidRequest = adapterv1.Outcome_OUTCOME_INVALID_REQUEST
	Forbidden      = adapterv1.Outcome_OUTCOME_FORBIDDEN
	Unavailable    = adapterv1.Outcome_OUTCOME_UNAVAILABLE
	RateLimited    = adapterv1.Outcome_OUTCOME_RATE_LIMITED
	Interrupted    = adapterv1.Outcome_OUTCOME_INTERRUPTED
	Unknown        = adapterv1.Outcome_OUTCOME_UNKNOWN
)

// Event is what happens to a request or its attempt.
type Event int

// Events. Those marked "attempt" change the open attempt and leave the
// request's state as it is; the rest change the request (Commit, Fail and
// the settlements change both).
const (
	// Receive records a candidate request.
	Receive Event = iota + 1
	// AskApproval parks a decided request for a person.
	AskApproval
	// Approve uses the approval, once.
	Approve
	// Deny is a person's refusal.
	Deny
	// Refuse ends a request nothing was attempted for: a check failed, a
	// budget is spent, an approval no longer holds or expired, the task
	// ended.
	Refuse
	// Prepare opens an attempt (attempt), persisted before anything is
	// sent.
	Prepare
	// Report records the adapter's answer (attempt): the stage it reached
	// and the outcome.
	Report
	// Doubt turns an OK answer of an effect that came without receipt
	// evidence into unknown (attempt).
	Doubt
	// Interrupt ends, in recovery, an attempt a stopped process left
	// open, by the strongest evidence persisted (attempt).
	Interrupt
	// VerifyReceipt records that an effect's receipt is in evidence
	// (attempt).
	VerifyReceipt
	// EndAttempt ends a failed attempt that another follows: a retry the
	// retry rule allows, or a config revision followed (attempt).
	EndAttempt
	// Commit makes the request executed with its attempt committed.
	Commit
	// Fail ends the request with its last attempt's outcome.
	Fail
	// SettleExecuted settles an unknown outcome, by evidence, as executed.
	SettleExecuted
	// SettleNotExecuted settles an unknown outcome, by evidence, as not
	// executed.
	SettleNotExecuted
)

var eventNames = map[Event]string{
	Receive: "receive", AskApproval: "ask_approval", Approve: "approve", Deny: "deny", Refuse: "refuse",
	Prepare: "prepare", Report: "report", Doubt: "doubt", Interrupt: "interrupt", VerifyReceipt: "verify_receipt",
	EndAttempt: "end_attempt", Commit: "commit", Fail: "fail", SettleExecuted: "settle_executed", SettleNotExecuted: "settle_not_executed",
}

// String is the event's name in errors and the table's report.
func (e Event) String() string {
	if n, ok := eventNames[e]; ok {
		return n
	}
	return fmt.Sprintf("event(%d)", int(e))
}

// Transition is one row of the table.
type Transition struct {
	From  State
	Event Event
	To    State
	// Stages are the delivery stages the event may move the attempt to
	// (forward only; Keep when listed lets it stay); nil when the event
	// leaves the stage as it is.
	Stages []Stage
	// Outcomes are the outcomes the event may record: on the attempt,
	// and for an event that ends the request (Commit, Fail, the
	// settlements) on the request too; nil when it records none.
	Outcomes []Outcome
	// Before, when set, is the outcomes the attempt must have for the
	// event to apply; for a request that ended (a settlement), the
	// request's own outcome too.
	Before []Outcome
	// Attempt says the event changes the open attempt; the request's
	// state stays (To == From).
	Attempt bool
}

// Outcome sets used by the table.
var (
	answers  = []Outcome{OK, InvalidRequest, Forbidden, Unavailable, RateLimited, Interrupted, Unknown}
	failures = []Outcome{InvalidRequest, Forbidden, Unavailable, RateLimited, Interrupted, Unknown}
	// The adapter reports how far a call got, up to its result; receipt
	// and commit are the orchestrator's own evidence.
	reported = []Stage{Keep, Prepared, Sent, Acknowledged, ResultObserved}
)

// table is the request lifecycle: every legal (state, event) pair.
// Anything not listed is refused. Attempts are made only while a request
// is requested (no approval needed) or approved; a request that ended
// (executed, failed, refused, denied) changes only by settling an unknown
// outcome with evidence.
var table = func() []Transition {
	t := []Transition{
		{From: None, Event: Receive, To: Requested},
		{From: Requested, Event: AskApproval, To: AwaitingApproval},
		{From: AwaitingApproval, Event: Approve, To: Approved},
		{From: AwaitingApproval, Event: Deny, To: Denied},
		{From: Requested, Event: Refuse, To: Refused},
		{From: AwaitingApproval, Event: Refuse, To: Refused},
		{From: Approved, Event: Refuse, To: Refused},
		{From: Failed, Event: SettleExecuted, To: Executed, Before: []Outcome{Unknown}, Outcomes: []Outcome{OK}, Stages: []Stage{Keep, ReceiptVerified}},
		{From: Failed, Event: SettleNotExecuted, To: Failed, Before: []Outcome{Unknown}, Outcomes: []Outcome{Interrupted}},
	}
	for _, s := range []State{Requested, Approved} {
		t = append(t,
			Transition{From: s, Event: Prepare, To: s, Attempt: true, Stages: []Stage{Prepared}},
			Transition{From: s, Event: Report, To: s, Attempt: true, Stages: reported, Outcomes: answers},
			Transition{From: s, Event: Doubt, To: s, Attempt: true, Before: []Outcome{OK}, Outcomes: []Outcome{Unknown}},
			Transition{From: s, Event: Interrupt, To: s, Attempt: true, Before: []Outcome{NoOutcome, OK}, Outcomes: []Outcome{Unknown, Interrupted}},
			Transition{From: s, Event: VerifyReceipt, To: s, Attempt: true, Stages: []Stage{ReceiptVerified}, Outcomes: []Outcome{OK}},
			Transition{From: s, Event: EndAttempt, To: s, Attempt: true, Before: failures},
			Transition{From: s, Event: Commit, To: Executed, Stages: []Stage{Committed}, Outcomes: []Outcome{OK}, Before: []Outcome{OK}},
			Transition{From: s, Event: Fail, To: Failed, Outcomes: answers},
		)
	}
	return t
}()

// index is table by (state, event), built once.
var index = func() map[State]map[Event]Transition {
	m := map[State]map[Event]Transition{}
	for _, t := range table {
		if m[t.From] == nil {
			m[t.From] = map[Event]Transition{}
		}
		if _, dup := m[t.From][t.Event]; dup {
			panic(fmt.Sprintf("lifecycle: two rows for %s x %s", stateName(t.From), t.Event))
		}
		m[t.From][t.Event] = t
	}
	return m
}()

// Table returns a copy of the transition table, in order.
func Table() []Transition { return slices.Clone(table) }

// ErrIllegal is the error of every transition the table refuses.
var ErrIllegal = errors.New("illegal lifecycle transition")

func illegal(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrIllegal}, args...)...)
}

// Next returns the table's transition for event in state, or an error
// wrapping ErrIllegal when there is none.
func Next(state State, event Event) (Transition, error) {
	t, ok := index[state][event]
	if !ok {
		return Transition{}, illegal("%s in state %s", event, stateName(state))
	}
	return t, nil
}

// Move applies request event e to r: its state becomes the transition's
// To and, for an event that records an outcome, its outcome becomes
// outcome. Nothing changes when the table refuses.
func Move(r *orchestratorv1.ToolRequest, e Event, outcome Outcome) error {
	t, err := Next(r.GetState(), e)
	if err != nil {
		return err
	}
	if t.Attempt {
		return illegal("%s changes an attempt, not a request", e)
	}
	if t.Outcomes != nil && !slices.Contains(t.Outcomes, outcome) {
		return illegal("%s from %s with outcome %s", e, stateName(r.GetState()), outcomeName(outcome))
	}
	if t.Outcomes == nil && outcome != NoOutcome {
		return illegal("%s records no outcome (asked %s)", e, outcomeName(outcome))
	}
	// A settlement rewrites the request's own unknown outcome.
	if t.From == Failed && t.Before != nil && !slices.Contains(t.Before, r.GetOutcome()) {
		return illegal("%s of a request whose outcome is %s", e, outcomeName(r.GetOutcome()))
	}
	r.State = t.To
	if t.Outcomes != nil {
		r.Outcome = outcome
	}
	return nil
}

// MoveAttempt applies event e to attempt a of a request in state: the
// stage moves forward to stage (never backwards: a stage already passed
// stays) when the event sets one, and the outcome becomes outcome when it
// records one. Commit, Fail and the settlements are checked here for
// their attempt and by Move for their request. Nothing changes when the
// table refuses.
func MoveAttempt(state State, a *orchestratorv1.Attempt, e Event, stage Stage, outcome Outcome) error {
	t, err := Next(state, e)
	if err != nil {
		return err
	}
	if t.Before != nil && !slices.Contains(t.Before, a.GetOutcome()) {
		return illegal("%s of attempt %s whose outcome is %s", e, a.GetId(), outcomeName(a.GetOutcome()))
	}
	switch {
	case t.Stages == nil && stage != Keep:
		return illegal("%s sets no stage (asked %s)", e, stageName(stage))
	case t.Stages != nil && !slices.Contains(t.Stages, stage):
		return illegal("%s to stage %s", e, stageName(stage))
	}
	switch {
	case t.Outcomes == nil && outcome != NoOutcome:
		return illegal("%s records no outcome (asked %s)", e, outcomeName(outcome))
	case t.Outcomes != nil && !slices.Contains(t.Outcomes, outcome):
		return illegal("%s with outcome %s", e, outcomeName(outcome))
	}
	if stage != Keep {
		a.Stage = max(a.GetStage(), stage)
	}
	if t.Outcomes != nil {
		a.Outcome = outcome
	}
	return nil
}

// Classify is the outcome an attempt of a capability of effect class
// effect records for the adapter's answer (outcome, with its safe code):
// the strongest evidence reached, which is what the table's retry rule
// then reads.
//   - An effect answered with a result that breaks the tool's own output
//     schema (MALFORMED_RESULT) may have happened: unknown.
//   - A bounded read has no effect to duplicate: its unknown is
//     interrupted, which another attempt may follow.
//   - An answer outside the vocabulary says nothing: unknown.
func Classify(effect registryv1.EffectClass, outcome Outcome, safeCode string) Outcome {
	retrieval := effect == registryv1.EffectClass_EFFECT_CLASS_RETRIEVAL
	if !slices.Contains(answers, outcome) {
		outcome = Unknown
	}
	if outcome == InvalidRequest && safeCode == CodeMalformedResult && !retrieval {
		outcome = Unknown
	}
	if outcome == Unknown && retrieval {
		outcome = Interrupted
	}
	return outcome
}

// CodeMalformedResult is the adapter's code for a result it could not
// accept as the tool's answer (see adapter.CodeMalformedResult).
const CodeMalformedResult = "MALFORMED_RESULT"

// Decision is what may follow a failed attempt.
type Decision int

const (
	// Stop ends the request failed with the attempt's outcome.
	Stop Decision = iota
	// Retry makes another attempt (bounded by MaxAutomaticRetries).
	Retry
	// CheckEvidence looks for evidence of the effect (a receipt under
	// the intent, the server's status for the request id) first: found,
	// it settles the request; a definite "not found" allows another
	// attempt; anything else stops.
	CheckEvidence
)

var decisionNames = map[Decision]string{Stop: "stop", Retry: "retry", CheckEvidence: "check_evidence"}

// String is the decision's name.
func (d Decision) String() string { return decisionNames[d] }

// retryTable is each retry rule's decision after a failed attempt, by
// its outcome; an outcome not listed stops. Answers (invalid request,
// forbidden, rate limited) are never retried automatically. Unknown is
// never retried blindly: CHECK_RECEIPT asks for evidence first, and
// NEVER_BLIND (and a rule not declared) waits for a person. A read's
// unknown was classified interrupted (see Classify), so RETRY never meets
// one for a retrieval, and stops on one of any other effect.
var retryTable = map[registryv1.RetryRule]map[Outcome]Decision{
	registryv1.RetryRule_RETRY_RULE_RETRY:         {Interrupted: Retry, Unavailable: Retry},
	registryv1.RetryRule_RETRY_RULE_CHECK_RECEIPT: {Unavailable: Retry, Unknown: CheckEvidence, Interrupted: CheckEvidence},
	registryv1.RetryRule_RETRY_RULE_NEVER_BLIND:   {},
}

// MaxAutomaticRetries is how many further attempts one execution may make
// on its own, when the retry rule allows any.
const MaxAutomaticRetries = 1

// AfterFailure is the retry rule's decision for a failed attempt with
// outcome.
func AfterFailure(rule registryv1.RetryRule, outcome Outcome) Decision {
	return retryTable[rule][outcome]
}

func stateName(s State) string {
	if s == None {
		return "none"
	}
	return strings.ToLower(strings.TrimPrefix(s.String(), "REQUEST_STATE_"))
}

func stageName(s Stage) string {
	if s == Keep {
		return "kept"
	}
	return strings.ToLower(strings.TrimPrefix(s.String(), "DELIVERY_STAGE_"))
}

func outcomeName(o Outcome) string {
	return strings.ToLower(strings.TrimPrefix(o.String(), "OUTCOME_"))
}
