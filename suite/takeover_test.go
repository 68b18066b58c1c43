package suite_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/demo/scenario"
	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/redistest"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/orchestrator"
	"github.com/v0m3/v0m3/suite"
)

// Ownership timings of the replicas in these tests: short, so a takeover
// happens within the test, and far above the scheduling noise of a loaded
// machine for what they bound (a renewal every third of the TTL).
const (
	testLeaseTTL         = 2 * time.Second
	testRecoveryInterval = 100 * time.Millisecond
)

// failPoints stops an orchestrator replica at armed fail points, once each.
type failPoints struct {
	mu sync.Mutex
	at map[string]func() error
	// passes counts the replica's completed recovery passes.
	passes atomic.Int64
}

func (f *failPoints) arm(point string, action func() error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.at == nil {
		f.at = map[string]func() error{}
	}
	f.at[point] = action
}

func (f *failPoints) hit(point string) error {
	if point == orchestrator.FailPointRecoveryPassed {
		f.passes.Add(1)
		return nil
	}
	f.mu.Lock()
	action := f.at[point]
	delete(f.at, point)
	f.mu.Unlock()
	if action == nil {
		return nil
	}
	return action()
}

// errKilled is what an armed fail point returns to stop its replica.
var errKilled = errors.New("replica killed by the test")

// replicaEnv is one Redis deployment shared by orchestrator replicas, each
// a complete suite (as separate processes would be), with the fixture MCP
// server whose tool calls are counted.
type replicaEnv struct {
	t        *testing.T
	store    string
	calls    string
	taskID   string
	handle   string
	replicas []*suite.Suite
}

func newReplicaEnv(t *testing.T) *replicaEnv {
	t.Helper()
	calls := filepath.Join(t.TempDir(), "calls.jsonl")
	url := startFixture(t, calls)
	addr, _ := redistest.Start(t)
	e := &replicaEnv{t: t, store: redisURL(addr, redistest.Prefix(t)), calls: calls}
	a := e.start(nil)
	conn, err := a.Connect(testkit.As(a, scenario.Integrator), &registryv1.CreateConnectionRequest{
		DisplayName: "V0M3 Sources", Owner: "platform-team", Transport: scenario.HTTPFixture(url),
	})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := a.Adapter.Discover(testkit.As(a, scenario.Integrator), &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	m, err := a.Registry.ProposeMapping(testkit.As(a, scenario.Integrator), &registryv1.ProposeMappingRequest{
		Capability: scenario.Retrieve, ConnectionId: conn.GetId(), SnapshotId: snap.GetId(),
		Target: &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: "search"},
		ArgumentMap: []*registryv1.ArgumentBinding{
			{RemoteField: "query", ProductField: "query"},
			{RemoteField: "uri", ProductField: "source", FromHandle: true},
		},
		Limits: &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 5, AllowedMediaTypes: []string{"text/markdown", "text/plain"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Registry.ReviewMapping(testkit.As(a, scenario.Reviewer), &registryv1.ReviewMappingRequest{
		MappingId: m.GetId(), Revision: m.GetRevision(), Approve: true,
	}); err != nil {
		t.Fatal(err)
	}
	task, err := a.Orchestrator.StartTask(testkit.As(a, scenario.Alice), &orchestratorv1.StartTaskRequest{
		Profile:     "source_review",
		Purpose:     "review the sources of the API migration article",
		SourceScope: []*orchestratorv1.SourceRef{{Uri: scenario.MigrationFAQURI, Title: "Migration FAQ"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	e.taskID = task.GetTask().GetId()
	e.handle = scenario.FindHandle(scenario.FindOffered(task.GetCatalogue(), scenario.Retrieve), "Migration FAQ")
	if e.handle == "" {
		t.Fatalf("no handle offered: %v", task.GetCatalogue())
	}
	return e
}

// start starts one more replica; fp, when set, is its fail points.
func (e *replicaEnv) start(fp *failPoints) *suite.Suite {
	e.t.Helper()
	r := suite.Replica{LeaseTTL: testLeaseTTL, RecoveryInterval: testRecoveryInterval}
	if fp != nil {
		r.FailPoint = fp.hit
	}
	s, err := suite.Start(context.Background(), suite.Config{DataDir: e.t.TempDir(), Store: e.store, Replica: r})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(s.Close)
	e.replicas = append(e.replicas, s)
	return s
}

func (e *replicaEnv) submit(s *suite.Suite, callID string) (*orchestratorv1.ToolRequest, error) {
	return s.Orchestrator.SubmitToolRequest(testkit.As(s, scenario.Alice), &orchestratorv1.SubmitToolRequestRequest{
		TaskId: e.taskID, ProviderCallId: callID, Capability: scenario.Retrieve,
		Arguments: scenario.MustStruct(map[string]any{"source": e.handle, "query": "migration"}),
	})
}

// requestOf finds the task's request for a provider call through s.
func (e *replicaEnv) requestOf(s *suite.Suite, callID string) *orchestratorv1.ToolRequest {
	e.t.Helper()
	list, err := s.Orchestrator.ListRequests(testkit.As(s, scenario.Alice), &orchestratorv1.ListRequestsRequest{TaskId: e.taskID})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, r := range list.GetRequests() {
		if r.GetProviderCallId() == callID {
			return r
		}
	}
	return nil
}

func (e *replicaEnv) events(s *suite.Suite, requestID string) []*orchestratorv1.TaskEvent {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(testkit.As(s, scenario.Alice), 30*time.Second)
	defer cancel()
	// WatchTask replays what is stored, then follows; the stream is cut
	// once the replay has had time to arrive.
	stream, err := s.Orchestrator.WatchTask(ctx, &orchestratorv1.WatchTaskRequest{TaskId: e.taskID})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []*orchestratorv1.TaskEvent
	for {
		ev, err := stream.Recv()
		if err != nil {
			e.t.Fatalf("watch: %v", err)
		}
		if ev.GetRequestId() == requestID {
			out = append(out, ev)
			if ev.GetType() == "request.executed" || ev.GetType() == "request.failed" || ev.GetType() == "request.refused" {
				return out
			}
		}
	}
}

func eventTypes(evs []*orchestratorv1.TaskEvent) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.GetType()
	}
	return out
}

// A replica that starts while another works on a request leaves it alone:
// the request stays with its owner (whose lease is renewed for as long as
// it works, here many lease lifetimes), reaches the remote server once,
// and a WatchTask stream on the new replica sees every event the owner
// stored.
func TestReplicaStartingLeavesInFlightRequestAlone(t *testing.T) {
	t.Parallel()
	e := newReplicaEnv(t)
	fp := &failPoints{}
	a := e.start(fp)
	reached, resume := make(chan struct{}), make(chan struct{})
	var resumeOnce sync.Once
	// A test that fails before it resumes A lets A go before the replicas
	// close, instead of holding their close for the fail point's bound.
	t.Cleanup(func() { resumeOnce.Do(func() { close(resume) }) })
	fp.arm(orchestrator.FailPointAttemptPrepared, func() error {
		close(reached)
		select {
		case <-resume:
		case <-time.After(2 * time.Minute):
		}
		return nil
	})
	before := toolCallCount(t, e.calls)
	type result struct {
		r   *orchestratorv1.ToolRequest
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := e.submit(a, "call-inflight")
		done <- result{r, err}
	}()
	select {
	case <-reached:
	case <-time.After(60 * time.Second):
		t.Fatal("the request never reached the adapter call")
	}

	// B starts with the request in flight on A and runs its recovery
	// passes for three lease lifetimes: passes are a recovery interval
	// apart, so the last of these began that long after B's first.
	bfp := &failPoints{}
	b := e.start(bfp)
	watchCtx, cancel := context.WithTimeout(testkit.As(b, scenario.Alice), 60*time.Second)
	defer cancel()
	stream, err := b.Orchestrator.WatchTask(watchCtx, &orchestratorv1.WatchTaskRequest{TaskId: e.taskID})
	if err != nil {
		t.Fatal(err)
	}
	passes := int64(3*testLeaseTTL/testRecoveryInterval) + 1
	testkit.Eventually(t, "B's recovery passes over three lease lifetimes", func() bool { return bfp.passes.Load() >= passes })
	r := e.requestOf(b, "call-inflight")
	if n := len(r.GetAttempts()); n != 1 || r.GetAttempts()[0].GetEndTime() != nil || r.GetAttempts()[0].GetStage() != adapterv1.DeliveryStage_DELIVERY_STAGE_PREPARED {
		t.Errorf("while A works, the request has attempts %v; want A's one open PREPARED attempt untouched", r.GetAttempts())
	}
	if n := toolCallCount(t, e.calls) - before; n != 0 {
		t.Errorf("the remote server received %d tool calls before A made its call, want 0", n)
	}

	resumeOnce.Do(func() { close(resume) })
	var res result
	select {
	case res = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("the submission on A never returned")
	}
	if res.err != nil || res.r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
		t.Fatalf("submission on A = %v, %v; want EXECUTED", res.r, res.err)
	}
	if n := toolCallCount(t, e.calls) - before; n != 1 {
		t.Errorf("the remote server received %d tool calls for one request, want 1", n)
	}
	if got := e.requestOf(b, "call-inflight"); len(got.GetAttempts()) != 1 {
		t.Errorf("attempts = %v; want one", got.GetAttempts())
	}

	// B's stream, opened while A worked, delivers A's events as they are
	// stored: up to the request's end, with no recovery among them.
	var seen []*orchestratorv1.TaskEvent
	for len(seen) == 0 || seen[len(seen)-1].GetType() != "request.executed" {
		ev, err := stream.Recv()
		if err != nil {
			t.Fatalf("watch on B after %v: %v", eventTypes(seen), err)
		}
		if ev.GetRequestId() == res.r.GetId() {
			seen = append(seen, ev)
		}
	}
	want := eventTypes(e.events(a, res.r.GetId()))
	if got := eventTypes(seen); !slices.Equal(got, want) {
		t.Errorf("B's stream saw %v; A's events are %v", got, want)
	}
	for _, ev := range seen {
		if ev.GetType() == "request.recovering" {
			t.Errorf("a request in flight was recovered: %v", ev)
		}
	}
}

// A replica killed while it works on a request (at each fail point) leaves
// it to another replica, which takes it over only after the lease expired
// and brings it to a terminal state with one remote call in all.
func TestReplicaKilledRequestTakenOverAfterLeaseExpiry(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		point    string
		attempts int
	}{
		// Stopped before any decision: REQUESTED, decided again by B.
		{orchestrator.FailPointSubmitReceived, 1},
		// Stopped with a PREPARED attempt: B ends it as interrupted (a
		// bounded read may be made again) and makes the call.
		{orchestrator.FailPointAttemptPrepared, 2},
	} {
		t.Run(tc.point, func(t *testing.T) {
			t.Parallel()
			e := newReplicaEnv(t)
			fp := &failPoints{}
			a := e.start(fp)
			b := e.start(nil)
			fp.arm(tc.point, func() error { return errKilled })
			before := toolCallCount(t, e.calls)
			_, err := e.submit(a, "call-killed")
			if !apierror.Is(err, codes.Unavailable, "ORCHESTRATOR_STOPPED") {
				t.Fatalf("submission on the killed replica = %v; want UNAVAILABLE ORCHESTRATOR_STOPPED", err)
			}
			a.Close() // the process is gone

			var r *orchestratorv1.ToolRequest
			testkit.Eventually(t, "the killed replica's request ends on B", func() bool {
				r = e.requestOf(b, "call-killed")
				return r.GetState() == orchestratorv1.RequestState_REQUEST_STATE_EXECUTED || r.GetState() == orchestratorv1.RequestState_REQUEST_STATE_FAILED
			})
			if r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED || len(r.GetAttempts()) != tc.attempts {
				t.Errorf("request = %v with attempts %v; want EXECUTED after %d attempts", r.GetState(), r.GetAttempts(), tc.attempts)
			}
			if n := toolCallCount(t, e.calls) - before; n != 1 {
				t.Errorf("the remote server received %d tool calls for one request, want 1", n)
			}
			evs := e.events(b, r.GetId())
			var recovering *orchestratorv1.TaskEvent
			for _, ev := range evs {
				if ev.GetType() == "request.recovering" {
					if recovering != nil {
						t.Errorf("recovered twice: %v", eventTypes(evs))
					}
					recovering = ev
				}
			}
			if recovering == nil {
				t.Fatalf("events %v; want request.recovering", eventTypes(evs))
			}
			// The lease was taken just before the request was created; no
			// replica may act before it expired.
			earliest := r.GetCreateTime().AsTime().Add(testLeaseTTL - 100*time.Millisecond)
			if at := recovering.GetTime().AsTime(); at.Before(earliest) {
				t.Errorf("taken over at %s, %s after creation; the lease lasts %s", at, at.Sub(r.GetCreateTime().AsTime()), testLeaseTTL)
			}
		})
	}
}

// Two replicas submitting at once deliver each trace event once: what a
// call writes to the shared outbox it delivers itself, and the other
// replica's outbox loop (every 100 ms here) leaves it alone while the
// call's claim lasts. Before claims, the loop sent events a live call on
// the other replica was about to send (REQUEST_RECEIVED seen twice).
func TestReplicasDeliverEachTraceEventOnce(t *testing.T) {
	t.Parallel()
	e := newReplicaEnv(t)
	replicas := []*suite.Suite{e.replicas[0], e.start(nil)}
	const n = 12
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			r, err := e.submit(replicas[i%2], fmt.Sprint("call-once-", i))
			if err != nil {
				t.Errorf("submit %d: %v", i, err)
				return
			}
			ids[i] = r.GetId()
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	// An event delivered twice is stored twice with the same content and
	// the same time (set when the orchestrator made it).
	type key struct {
		kind      evidencev1.ProductEventKind
		requestID string
		detail    string
		time      int64
	}
	var (
		seen     map[key]int
		received map[string]int
	)
	delivered := func() bool {
		tr, err := replicas[1].Evidence.GetTrace(testkit.As(replicas[1], scenario.Auditor), &evidencev1.GetTraceRequest{TaskId: e.taskID})
		if err != nil {
			t.Fatal(err)
		}
		seen, received = map[key]int{}, map[string]int{}
		ended := map[string]bool{}
		for _, ev := range tr.GetEvents() {
			p := ev.GetProduct()
			seen[key{p.GetKind(), p.GetRequestId(), p.GetDetail(), ev.GetTime().AsTime().UnixNano()}]++
			switch p.GetKind() {
			case evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_REQUEST_RECEIVED:
				received[p.GetRequestId()]++
			case evidencev1.ProductEventKind_PRODUCT_EVENT_KIND_CONSEQUENCE:
				ended[p.GetRequestId()] = true
			}
		}
		for _, id := range ids {
			if !ended[id] {
				return false
			}
		}
		return true
	}
	testkit.Eventually(t, "every request's trace is delivered", delivered)
	for k, count := range seen {
		if count > 1 {
			t.Errorf("%v of request %s (%q) delivered %d times", k.kind, k.requestID, k.detail, count)
		}
	}
	for _, id := range ids {
		if received[id] != 1 {
			t.Errorf("request %s: REQUEST_RECEIVED %d times; want 1", id, received[id])
		}
	}
}
