package faults_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/demo/scenario"
	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/failpoint"
	"github.com/v0m3/v0m3/internal/redistest"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	"github.com/v0m3/v0m3/services/adapter"
	"github.com/v0m3/v0m3/services/evidence"
	"github.com/v0m3/v0m3/services/orchestrator"
	"github.com/v0m3/v0m3/services/policy"
	"github.com/v0m3/v0m3/suite"
)

// step is a fail point in one service's process.
type step struct {
	service, point string
}

// Steps of each flow, in the order the flow reaches them.
var (
	previewSteps = []step{
		{suite.Orchestrator, orchestrator.FailPointSubmitReceived},
		{suite.Policy, policy.FailPointChargeAfter},
		{suite.Orchestrator, orchestrator.FailPointSubmitDecided},
		{suite.Orchestrator, orchestrator.FailPointApprovalUsed},
		{suite.Orchestrator, orchestrator.FailPointAttemptPrepared},
		{suite.Adapter, adapter.FailPointSend},
		{suite.Adapter, adapter.FailPointResult},
		{suite.Orchestrator, orchestrator.FailPointAttemptExecuted},
		{suite.Evidence, evidence.FailPointReceiptBefore},
		{suite.Evidence, evidence.FailPointReceiptAfter},
		{suite.Orchestrator, orchestrator.FailPointRequestCommitted},
		{suite.Evidence, evidence.FailPointTraceAfter},
	}
	retrieveSteps = []step{
		{suite.Orchestrator, orchestrator.FailPointSubmitReceived},
		{suite.Policy, policy.FailPointChargeBefore},
		{suite.Orchestrator, orchestrator.FailPointAttemptPrepared},
		{suite.Adapter, adapter.FailPointSend},
		{suite.Adapter, adapter.FailPointResult},
		{suite.Orchestrator, orchestrator.FailPointAttemptExecuted},
		{suite.Evidence, evidence.FailPointObservationAfter},
		{suite.Orchestrator, orchestrator.FailPointAttemptObserved},
		{suite.Orchestrator, orchestrator.FailPointRequestCommitted},
		{suite.Evidence, evidence.FailPointTraceBefore},
	}
)

// TestFaults crashes (SIGKILL) or freezes (SIGSTOP, then SIGCONT after the
// lease expired) one service process at each step of each flow, on the
// file store (a killed service restarted on its data) and on Redis (two
// orchestrator replicas: a killed replica stays dead and the other takes
// its requests over), while a client carries on as a real one would
// (retrying what failed on an unavailable service, with the same provider
// call id). After recovery the request must be settled as EXECUTED with
// exactly one effect, the acknowledged request must be the one the task
// lists, and the trace and task events must hold every stage.
func TestFaults(t *testing.T) {
	t.Parallel()
	for _, store := range []string{"file", "redis"} {
		for _, f := range []struct {
			flow  flow
			steps []step
		}{{previewFlow, previewSteps}, {retrieveFlow, retrieveSteps}} {
			for _, st := range f.steps {
				for _, action := range []string{failpoint.Kill, failpoint.Freeze} {
					t.Run(fmt.Sprintf("%s/%s/%s/%s", store, f.flow.name, st.point, action), func(t *testing.T) {
						t.Parallel()
						runCase(t, store, f.flow, st, action)
					})
				}
			}
		}
	}
}

// TestNoFault runs each flow on each store without a fault: the baseline
// the fault cases are held to.
func TestNoFault(t *testing.T) {
	t.Parallel()
	for _, store := range []string{"file", "redis"} {
		for _, f := range []flow{previewFlow, retrieveFlow} {
			t.Run(store+"/"+f.name, func(t *testing.T) {
				t.Parallel()
				runCase(t, store, f, step{}, "")
			})
		}
	}
}

func runCase(t *testing.T, store string, f flow, st step, action string) {
	start := time.Now()
	storeURL, replicas := "", 1
	if store == "redis" {
		addr, _ := redistest.Start(t)
		storeURL, replicas = "redis://"+addr+"/0?prefix="+redistest.Prefix(t), 2
	}
	c := newCluster(t, storeURL, replicas)
	r := f.setup(t, c)
	target := st.service
	if target == suite.Orchestrator {
		target = "orchestrator-a"
	}
	recovered := make(chan struct{})
	if st.point != "" {
		// Armed only now: setting up went through the same steps.
		c.restart(target, failpoint.Spec(st.point, action))
		go c.supervise(target, action, store == "redis", recovered)
	} else {
		close(recovered)
	}
	defer func() {
		if t.Failed() {
			t.Logf("logs:\n%s", c.logs())
		}
	}()

	deadline := time.Now().Add(2 * time.Minute)
	var ack *orchestratorv1.ToolRequest
	err := retry(deadline, func(ctx context.Context) error {
		got, err := c.orchestrator().SubmitToolRequest(c.As(ctx, scenario.Alice.ID, scenario.Alice.Groups...), &orchestratorv1.SubmitToolRequestRequest{
			TaskId: r.taskID, ProviderCallId: callID, Capability: r.capability, Arguments: r.args, DocumentDigest: r.digest,
		})
		if err == nil {
			ack = got
		}
		return err
	})
	if err != nil {
		t.Fatalf("submit: %v", err)
	}
	get := func() *orchestratorv1.ToolRequest {
		var got *orchestratorv1.ToolRequest
		if err := retry(deadline, func(ctx context.Context) error {
			var err error
			got, err = c.orchestrator().GetRequest(c.As(ctx, scenario.Alice.ID, scenario.Alice.Groups...), &orchestratorv1.GetRequestRequest{Id: ack.GetId()})
			return err
		}); err != nil {
			t.Fatalf("get request %s: %v", ack.GetId(), err)
		}
		return got
	}
	if r.approval {
		// A request stopped before its decision is decided again by
		// recovery; the approver acts once it awaits approval.
		testkit.EventuallyWithin(t, time.Until(deadline), "the request awaits approval", func() bool {
			return get().GetState() != orchestratorv1.RequestState_REQUEST_STATE_REQUESTED
		})
		if s := get().GetState(); s != orchestratorv1.RequestState_REQUEST_STATE_AWAITING_APPROVAL {
			t.Fatalf("before approval the request is %v; want AWAITING_APPROVAL", s)
		}
		tries := 0
		err := retry(deadline, func(ctx context.Context) error {
			tries++
			_, err := c.orchestrator().Approve(c.As(ctx, approver.ID, approver.Groups...), &orchestratorv1.ApproveRequest{RequestId: ack.GetId(), DocumentDigest: r.digest})
			return err
		})
		// A retried approval whose first try was used reports so.
		if err != nil && !(tries > 1 && (apierror.Is(err, codes.FailedPrecondition, "APPROVAL_ALREADY_USED") || apierror.Is(err, codes.FailedPrecondition, "REQUEST_NOT_AWAITING_APPROVAL"))) {
			t.Fatalf("approve (try %d): %v", tries, err)
		}
	}
	var final *orchestratorv1.ToolRequest
	stuck := ""
	if !testkit.Within(time.Until(deadline), func() bool { final = get(); return settled(final) }) {
		stuck = fmt.Sprintf("the request is stuck in %v / %v with attempts %v", final.GetState(), final.GetOutcome(), final.GetAttempts())
	}
	if st.point != "" {
		select {
		case <-recovered:
		case <-time.After(2 * time.Minute):
			t.Fatal("the faulted process never recovered")
		}
		if !c.hit(target) {
			t.Fatalf("fail point %s in %s was never reached: the case tests nothing", st.point, target)
		}
	}

	var violations []string
	violate := func(format string, args ...any) { violations = append(violations, fmt.Sprintf(format, args...)) }
	if stuck != "" {
		violate("%s", stuck)
	}
	// No lost acknowledged request: the acknowledged id is the one
	// request of its provider call the task lists.
	list, err := c.orchestrator().ListRequests(testkit.As(c, scenario.Alice), &orchestratorv1.ListRequestsRequest{TaskId: r.taskID})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, q := range list.GetRequests() {
		if q.GetProviderCallId() == callID {
			ids = append(ids, q.GetId())
		}
	}
	if !slices.Equal(ids, []string{ack.GetId()}) {
		violate("requests of %s: %v; want exactly the acknowledged %s", callID, ids, ack.GetId())
	}
	// Every request ends in a true state, with no duplicate effect: EXECUTED
	// with exactly one render and artifact (a bounded read: one call per
	// attempt at most), or FAILED with a definite outcome other than OK
	// and nothing rendered (the dependency was down when the attempts
	// were made; nothing happened and the request says so).
	calls, artifacts := r.effects(t)
	switch final.GetState() {
	case orchestratorv1.RequestState_REQUEST_STATE_EXECUTED:
		if r.approval {
			if calls != 1 || artifacts != 1 {
				violate("renders %d, artifacts %d for an executed request; want exactly 1 each", calls, artifacts)
			}
			if final.GetArtifactDigest() == "" || final.GetReceiptId() == "" {
				violate("executed without receipt or artifact: %v", final)
			}
		} else if calls < 1 || calls > len(final.GetAttempts()) {
			violate("tool calls %d for %d attempts; want 1..attempts", calls, len(final.GetAttempts()))
		}
	case orchestratorv1.RequestState_REQUEST_STATE_FAILED:
		if final.GetOutcome() == adapterv1.Outcome_OUTCOME_OK {
			violate(violationFailedOK+" (attempts %v): an effect or read that succeeded is recorded as failed", final.GetAttempts())
		}
		if r.approval && (calls != 0 || artifacts != 0) {
			violate("request FAILED / %v but the renderer rendered %d times, %d artifacts", final.GetOutcome(), calls, artifacts)
		}
		if calls > len(final.GetAttempts()) {
			violate("tool calls %d for %d attempts", calls, len(final.GetAttempts()))
		}
	default:
		violate("request settled as %v / %v with attempts %v; want EXECUTED or FAILED", final.GetState(), final.GetOutcome(), final.GetAttempts())
	}
	// No lost trace event: the outbox delivers each stage's events, in
	// order, without a gap in the task's sequence.
	want := r.kinds
	if final.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
		want = want[:slices.Index(want, executed)+1]
	}
	var kinds []evidencev1.ProductEventKind
	seqErr := ""
	for traceBy := time.Now().Add(30 * time.Second); ; {
		tr, err := c.clients.Evidence.GetTrace(testkit.As(c, scenario.Auditor), &evidencev1.GetTraceRequest{TaskId: r.taskID})
		if err == nil {
			seqErr = ""
			for i, e := range tr.GetEvents() {
				if e.GetSequence() != int64(i+1) {
					seqErr = fmt.Sprintf("event %d has sequence %d", i, e.GetSequence())
				}
			}
			kinds = productKinds(tr, ack.GetId())
			if seqErr == "" && isSubsequence(want, kinds) {
				break
			}
		}
		if time.Now().After(traceBy) {
			violate(violationTrace+" %s; product events of the request %v; want %v in order (err %v)", seqErr, kinds, want, err)
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	events := taskEvents(t, c, r.taskID, ack.GetId(), endEvents(final))
	wantEvents := r.events
	if final.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
		wantEvents = nil
	}
	if !isSubsequence(wantEvents, events) {
		violate(violationTaskEvents+" %v; want %v in order, then one of %v", events, wantEvents, endEvents(final))
	}
	if len(violations) > 0 {
		t.Error(strings.Join(violations, "\n"))
	}
	t.Logf("%s: %v after %d attempts; effects %d/%d; product events %v; task events %v; %s",
		t.Name(), final.GetState(), len(final.GetAttempts()), calls, artifacts, kinds, events, time.Since(start).Round(time.Millisecond))
}

// supervise waits for target's fail point and recovers from it as an
// operator's platform would: a killed process is restarted on its data,
// except an orchestrator replica beside another on Redis, which stays
// dead (the other takes over); a frozen one continues after freezeFor.
func (c *cluster) supervise(target, action string, replicated bool, recovered chan<- struct{}) {
	defer close(recovered)
	if !testkit.Within(3*time.Minute, func() bool { return c.hit(target) }) {
		return // the test reports the point was never reached
	}
	switch action {
	case failpoint.Kill:
		select {
		case <-c.exited(target):
		case <-time.After(time.Minute):
			c.t.Errorf("%s was not killed at its fail point", target)
			return
		}
		if replicated && target == "orchestrator-a" {
			c.markDead(target)
			return
		}
		if err := c.launch(target, ""); err != nil {
			c.t.Error(err)
		}
	case failpoint.Freeze:
		time.Sleep(freezeFor)
		c.signal(target, syscall.SIGCONT)
	}
}

// endEvents are the task events that may tell of r's settled state: an
// executed request's is request.settled when its outcome was unknown
// first.
func endEvents(r *orchestratorv1.ToolRequest) []string {
	switch r.GetState() {
	case orchestratorv1.RequestState_REQUEST_STATE_EXECUTED:
		return []string{"request.executed", "request.settled"}
	case orchestratorv1.RequestState_REQUEST_STATE_FAILED:
		return []string{"request.failed", "request.settled"}
	case orchestratorv1.RequestState_REQUEST_STATE_DENIED:
		return []string{"request.denied"}
	}
	return []string{"request.refused"}
}

// taskEvents are the types of request id's task events, replayed by
// WatchTask up to one of the events until (a request whose outcome was
// unknown fails before it is settled as executed).
func taskEvents(t *testing.T, c *cluster, taskID, id string, until []string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(testkit.As(c, scenario.Alice), 30*time.Second)
	defer cancel()
	stream, err := c.orchestrator().WatchTask(ctx, &orchestratorv1.WatchTaskRequest{TaskId: taskID})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for {
		ev, err := stream.Recv()
		if err != nil {
			t.Logf("watch after %v: %v", out, err)
			return out
		}
		if ev.GetRequestId() == id {
			out = append(out, ev.GetType())
			if slices.Contains(until, ev.GetType()) {
				return out
			}
		}
	}
}

// Prefixes of the violations a case can show.
const (
	violationTrace      = "trace:"
	violationTaskEvents = "task events"
	violationFailedOK   = "request FAILED with outcome OK"
)
