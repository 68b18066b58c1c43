package lifecycle

import (
	"errors"
	"testing"

	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

var (
	allStates   = []State{None, Requested, AwaitingApproval, Approved, Executed, Failed, Refused, Denied}
	allEvents   = []Event{Receive, AskApproval, Approve, Deny, Refuse, Prepare, Report, Doubt, Interrupt, VerifyReceipt, EndAttempt, Commit, Fail, SettleExecuted, SettleNotExecuted}
	allOutcomes = []Outcome{NoOutcome, OK, InvalidRequest, Forbidden, Unavailable, RateLimited, Interrupted, Unknown}
)

// TestRequestTransitions walks the request's life as the execution path
// and recovery drive it, and checks every (state, event) pair outside the
// table is refused with nothing changed.
func TestRequestTransitions(t *testing.T) {
	legal := map[State]map[Event]State{
		None:             {Receive: Requested},
		Requested:        {AskApproval: AwaitingApproval, Refuse: Refused, Commit: Executed, Fail: Failed},
		AwaitingApproval: {Approve: Approved, Deny: Denied, Refuse: Refused},
		Approved:         {Refuse: Refused, Commit: Executed, Fail: Failed},
		Failed:           {SettleExecuted: Executed, SettleNotExecuted: Failed},
	}
	attemptEvents := map[Event]bool{Prepare: true, Report: true, Doubt: true, Interrupt: true, VerifyReceipt: true, EndAttempt: true}
	for _, from := range allStates {
		for _, e := range allEvents {
			tr, err := Next(from, e)
			want, ok := legal[from][e]
			inFlight := from == Requested || from == Approved
			switch {
			case ok:
				if err != nil || tr.To != want {
					t.Errorf("Next(%s, %s) = %v, %v; want %s", stateName(from), e, stateName(tr.To), err, stateName(want))
				}
			case attemptEvents[e] && inFlight:
				if err != nil || tr.To != from || !tr.Attempt {
					t.Errorf("Next(%s, %s) = %+v, %v; want an attempt event that keeps the state", stateName(from), e, tr, err)
				}
			default:
				if !errors.Is(err, ErrIllegal) {
					t.Errorf("Next(%s, %s) = %+v, %v; want ErrIllegal", stateName(from), e, tr, err)
				}
			}
			// Move agrees with Next, and changes nothing when it refuses.
			if !attemptEvents[e] {
				r := &orchestratorv1.ToolRequest{State: from, Outcome: Unknown}
				outcome := NoOutcome
				switch e {
				case Commit, SettleExecuted:
					outcome = OK
				case Fail:
					outcome = Unknown
				case SettleNotExecuted:
					outcome = Interrupted
				}
				err := Move(r, e, outcome)
				switch {
				case ok && (err != nil || r.GetState() != want):
					t.Errorf("Move(%s, %s) = %v, state %s; want %s", stateName(from), e, err, stateName(r.GetState()), stateName(want))
				case !ok && (!errors.Is(err, ErrIllegal) || r.GetState() != from || r.GetOutcome() != Unknown):
					t.Errorf("Move(%s, %s) = %v, request %v; want ErrIllegal and no change", stateName(from), e, err, r)
				}
			}
		}
	}
}

// TestOutcomesAllowed checks the outcomes each ending may record: a
// commit only ok, a failure any answer but none, a settlement only from
// unknown.
func TestOutcomesAllowed(t *testing.T) {
	for _, tc := range []struct {
		from    State
		before  Outcome
		event   Event
		allowed []Outcome
	}{
		{Requested, NoOutcome, Commit, []Outcome{OK}},
		{Approved, NoOutcome, Fail, []Outcome{OK, InvalidRequest, Forbidden, Unavailable, RateLimited, Interrupted, Unknown}},
		{Failed, Unknown, SettleExecuted, []Outcome{OK}},
		{Failed, Unknown, SettleNotExecuted, []Outcome{Interrupted}},
		{Failed, Interrupted, SettleNotExecuted, nil},
		{Failed, OK, SettleExecuted, nil},
		{Requested, NoOutcome, Refuse, []Outcome{NoOutcome}},
	} {
		for _, o := range allOutcomes {
			r := &orchestratorv1.ToolRequest{State: tc.from, Outcome: tc.before}
			err := Move(r, tc.event, o)
			want := false
			for _, a := range tc.allowed {
				want = want || a == o
			}
			if (err == nil) != want {
				t.Errorf("Move(%s with %s, %s, %s) = %v; want allowed %v", stateName(tc.from), outcomeName(tc.before), tc.event, outcomeName(o), err, want)
			}
		}
	}
}

// TestAttemptStages checks an attempt's stages move only forward, only
// to the stages an event may set: the adapter reports up to
// result_observed, the orchestrator verifies receipts and commits.
func TestAttemptStages(t *testing.T) {
	att := &orchestratorv1.Attempt{Id: "att_1"}
	steps := []struct {
		event   Event
		stage   Stage
		outcome Outcome
		ok      bool
		want    Stage
	}{
		{Prepare, Sent, NoOutcome, false, Keep},
		{Prepare, Prepared, NoOutcome, true, Prepared},
		{Report, ReceiptVerified, OK, false, Prepared},
		{Report, Committed, OK, false, Prepared},
		{Report, Acknowledged, Unknown, true, Acknowledged},
		{Report, Sent, Unknown, true, Acknowledged},  // never backwards
		{Commit, Committed, OK, false, Acknowledged}, // an unknown is not committed
		{Report, Keep, NoOutcome, false, Acknowledged},
		{VerifyReceipt, ReceiptVerified, OK, true, ReceiptVerified},
		{Commit, ReceiptVerified, OK, false, ReceiptVerified},
		{Commit, Committed, OK, true, Committed},
	}
	for i, s := range steps {
		err := MoveAttempt(Requested, att, s.event, s.stage, s.outcome)
		if (err == nil) != s.ok || att.GetStage() != s.want {
			t.Fatalf("step %d: MoveAttempt(%s, %s, %s) = %v, stage %s; want ok %v, stage %s",
				i, s.event, stageName(s.stage), outcomeName(s.outcome), err, stageName(att.GetStage()), s.ok, stageName(s.want))
		}
	}
	// No attempt moves once its request ended, nor while it awaits a
	// person.
	for _, st := range []State{None, AwaitingApproval, Executed, Failed, Refused, Denied} {
		for _, e := range []Event{Prepare, Report, EndAttempt, Interrupt} {
			if err := MoveAttempt(st, &orchestratorv1.Attempt{}, e, Prepared, NoOutcome); !errors.Is(err, ErrIllegal) {
				t.Errorf("MoveAttempt(%s, %s) = %v; want ErrIllegal", stateName(st), e, err)
			}
		}
	}
	// An attempt is ended for another only after a failure, and recovery
	// rewrites only an outcome it has no answer for.
	for _, o := range allOutcomes {
		err := MoveAttempt(Approved, &orchestratorv1.Attempt{Outcome: o}, EndAttempt, Keep, NoOutcome)
		if want := o != OK && o != NoOutcome; (err == nil) != want {
			t.Errorf("EndAttempt after %s = %v; want allowed %v", outcomeName(o), err, want)
		}
		err = MoveAttempt(Approved, &orchestratorv1.Attempt{Outcome: o}, Interrupt, Keep, Unknown)
		if want := o == OK || o == NoOutcome; (err == nil) != want {
			t.Errorf("Interrupt after %s = %v; want allowed %v", outcomeName(o), err, want)
		}
	}
}

// TestRetryRule checks, per retry rule and effect class, what follows
// each outcome the adapter can answer: unknown is never retried blindly
// for an effect, and a bounded read's disconnect is retried.
func TestRetryRule(t *testing.T) {
	type want map[Outcome]Decision
	rules := map[registryv1.RetryRule]want{
		registryv1.RetryRule_RETRY_RULE_RETRY:         {Interrupted: Retry, Unavailable: Retry},
		registryv1.RetryRule_RETRY_RULE_CHECK_RECEIPT: {Unavailable: Retry, Unknown: CheckEvidence, Interrupted: CheckEvidence},
		registryv1.RetryRule_RETRY_RULE_NEVER_BLIND:   {},
		registryv1.RetryRule_RETRY_RULE_UNSPECIFIED:   {},
	}
	for rule, w := range rules {
		for _, o := range allOutcomes {
			if got := AfterFailure(rule, o); got != w[o] {
				t.Errorf("AfterFailure(%s, %s) = %s; want %s", rule, outcomeName(o), got, w[o])
			}
		}
	}
	effects := []registryv1.EffectClass{
		registryv1.EffectClass_EFFECT_CLASS_RETRIEVAL, registryv1.EffectClass_EFFECT_CLASS_LOCAL_TRANSFORMATION,
		registryv1.EffectClass_EFFECT_CLASS_EXTERNAL_EFFECT,
	}
	for _, effect := range effects {
		retrieval := effect == registryv1.EffectClass_EFFECT_CLASS_RETRIEVAL
		for _, answered := range allOutcomes {
			for _, code := range []string{"", CodeMalformedResult} {
				o := Classify(effect, answered, code)
				switch {
				case retrieval && o == Unknown:
					t.Errorf("Classify(%s, %s, %q) = unknown; a read's disconnect is interrupted", effect, outcomeName(answered), code)
				case !retrieval && answered == Unknown && o != Unknown:
					t.Errorf("Classify(%s, unknown) = %s; an effect's unknown stays unknown", effect, outcomeName(o))
				case !retrieval && answered == InvalidRequest && code == CodeMalformedResult && o != Unknown:
					t.Errorf("Classify(%s, invalid_request, MALFORMED_RESULT) = %s; want unknown", effect, outcomeName(o))
				case answered == NoOutcome && o != Unknown && o != Interrupted:
					t.Errorf("Classify(%s, none) = %s; no answer is no evidence", effect, outcomeName(o))
				}
				// Whatever the rule, an effect whose outcome is
				// unknown is never attempted again without evidence.
				for rule := range rules {
					if !retrieval && o == Unknown && AfterFailure(rule, o) == Retry {
						t.Errorf("%s: unknown outcome retried blindly under %s", effect, rule)
					}
				}
			}
		}
	}
	// A read's interrupted attempt is retried under RETRY.
	if o := Classify(registryv1.EffectClass_EFFECT_CLASS_RETRIEVAL, Unknown, ""); AfterFailure(registryv1.RetryRule_RETRY_RULE_RETRY, o) != Retry {
		t.Errorf("a bounded read's disconnect (%s) is not retried", outcomeName(o))
	}
}

// TestTableWellFormed checks every row is reachable by Next and attempt
// rows keep the request's state.
func TestTableWellFormed(t *testing.T) {
	for _, tr := range Table() {
		got, err := Next(tr.From, tr.Event)
		if err != nil || got.To != tr.To {
			t.Errorf("row %s x %s not found by Next: %v", stateName(tr.From), tr.Event, err)
		}
		if tr.Attempt && tr.To != tr.From {
			t.Errorf("attempt event %s moves the request from %s to %s", tr.Event, stateName(tr.From), stateName(tr.To))
		}
	}
}
