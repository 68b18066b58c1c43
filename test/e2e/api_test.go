package e2e_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/demo/scenario"
	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/paging"
	"github.com/v0m3/v0m3/internal/redistest"
	"github.com/v0m3/v0m3/internal/testkit"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/suite"
)

// The product API of issue 20 (items 2 and 3), through the real services.

// walk calls list for every page at size and returns all items, failing
// on an error or a list that does not end.
func walk[T any](t *testing.T, size int32, list func(size int32, token string) ([]T, string, error)) []T {
	t.Helper()
	var all []T
	tok := ""
	for range 1000 {
		items, next, err := list(size, tok)
		if err != nil {
			t.Fatalf("list page (size %d): %v", size, err)
		}
		if size > 0 && len(items) > int(size) {
			t.Fatalf("page of %d items at size %d", len(items), size)
		}
		all = append(all, items...)
		if next == "" {
			return all
		}
		tok = next
	}
	t.Fatal("the list did not end")
	return nil
}

func taskIDs(ts []*orchestratorv1.Task) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.GetId()
	}
	return out
}

// startAs starts a source-review task over the FAQ as p.
func (w *world) startAs(p scenario.Person, purpose string) *orchestratorv1.StartTaskResponse {
	w.t.Helper()
	resp, err := w.s.Orchestrator.StartTask(testkit.As(w.s, p), &orchestratorv1.StartTaskRequest{
		Profile: "source_review", Purpose: purpose, SourceScope: faqScope,
	})
	if err != nil {
		w.t.Fatalf("start task as %s: %v", p.ID, err)
	}
	return resp
}

// TestListTasksPagesAndFilters lists tasks as their requester, as an
// auditor and as someone asking for another's tasks, walking pages of
// several sizes, and refuses tokens that do not belong to the list.
func TestListTasksPagesAndFilters(t *testing.T) {
	t.Parallel()
	s := startSuite(t, t.TempDir())
	w := &world{t: t, s: s}
	var alice, bob []string
	for i := range 5 {
		alice = append(alice, w.startAs(scenario.Alice, fmt.Sprint("alice ", i)).GetTask().GetId())
	}
	for i := range 2 {
		bob = append(bob, w.startAs(scenario.Bob, fmt.Sprint("bob ", i)).GetTask().GetId())
	}
	if _, err := s.Orchestrator.CancelTask(testkit.As(w.s, scenario.Alice), &orchestratorv1.CancelTaskRequest{Id: alice[1]}); err != nil {
		t.Fatal(err)
	}
	list := func(p scenario.Person, req *orchestratorv1.ListTasksRequest) func(int32, string) ([]*orchestratorv1.Task, string, error) {
		return func(size int32, tok string) ([]*orchestratorv1.Task, string, error) {
			r := proto.Clone(req).(*orchestratorv1.ListTasksRequest)
			r.PageSize, r.PageToken = size, tok
			resp, err := s.Orchestrator.ListTasks(testkit.As(w.s, p), r)
			return resp.GetTasks(), resp.GetNextPageToken(), err
		}
	}
	active := orchestratorv1.TaskState_TASK_STATE_ACTIVE
	cancelled := orchestratorv1.TaskState_TASK_STATE_CANCELLED
	all := append(slices.Clone(alice), bob...)
	for _, tc := range []struct {
		name string
		as   scenario.Person
		req  *orchestratorv1.ListTasksRequest
		want []string
	}{
		{"a requester sees her own", scenario.Alice, &orchestratorv1.ListTasksRequest{}, alice},
		{"another requester sees his own", scenario.Bob, &orchestratorv1.ListTasksRequest{}, bob},
		{"naming herself", scenario.Alice, &orchestratorv1.ListTasksRequest{Requester: scenario.Alice.ID}, alice},
		{"an auditor sees all", scenario.Auditor, &orchestratorv1.ListTasksRequest{}, all},
		{"an approver sees all", approver, &orchestratorv1.ListTasksRequest{}, all},
		{"an auditor filters by requester", scenario.Auditor, &orchestratorv1.ListTasksRequest{Requester: scenario.Bob.ID}, bob},
		{"by state", scenario.Alice, &orchestratorv1.ListTasksRequest{State: cancelled}, alice[1:2]},
		{"active only", scenario.Auditor, &orchestratorv1.ListTasksRequest{State: active},
			slices.DeleteFunc(slices.Clone(all), func(id string) bool { return id == alice[1] })},
		{"by profile", scenario.Auditor, &orchestratorv1.ListTasksRequest{Profile: "source_review"}, all},
		{"another profile", scenario.Auditor, &orchestratorv1.ListTasksRequest{Profile: "preview"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, size := range []int32{0, 1, 2, 3, 5000} {
				got := taskIDs(walk(t, size, list(tc.as, tc.req)))
				if !slices.Equal(got, tc.want) {
					t.Fatalf("size %d: got %v, want %v (oldest first)", size, got, tc.want)
				}
			}
		})
	}

	// Refusals: nothing listed, an error a person can act on.
	_, firstNext, err := list(scenario.Auditor, &orchestratorv1.ListTasksRequest{State: active})(2, "")
	if err != nil || firstNext == "" {
		t.Fatalf("first page: %q, %v", firstNext, err)
	}
	_, aliceNext, err := list(scenario.Alice, &orchestratorv1.ListTasksRequest{})(2, "")
	if err != nil || aliceNext == "" {
		t.Fatalf("alice's first page: %q, %v", aliceNext, err)
	}
	for _, tc := range []struct {
		name   string
		as     scenario.Person
		req    *orchestratorv1.ListTasksRequest
		code   codes.Code
		reason string
	}{
		{"another's tasks", scenario.Alice, &orchestratorv1.ListTasksRequest{Requester: scenario.Bob.ID}, codes.PermissionDenied, "ROLE_NOT_GRANTED"},
		{"token with other filters", scenario.Auditor, &orchestratorv1.ListTasksRequest{State: cancelled, PageToken: firstNext}, codes.InvalidArgument, paging.ReasonPageTokenFilterMismatch},
		{"token without its filter", scenario.Auditor, &orchestratorv1.ListTasksRequest{PageToken: firstNext}, codes.InvalidArgument, paging.ReasonPageTokenFilterMismatch},
		{"another caller's token", scenario.Auditor, &orchestratorv1.ListTasksRequest{PageToken: aliceNext}, codes.InvalidArgument, paging.ReasonPageTokenFilterMismatch},
		{"made-up token", scenario.Auditor, &orchestratorv1.ListTasksRequest{PageToken: "eyJmIjoiYSJ9"}, codes.InvalidArgument, paging.ReasonPageTokenInvalid},
		{"garbage token", scenario.Auditor, &orchestratorv1.ListTasksRequest{PageToken: "not a token"}, codes.InvalidArgument, paging.ReasonPageTokenInvalid},
		{"negative size", scenario.Auditor, &orchestratorv1.ListTasksRequest{PageSize: -1}, codes.InvalidArgument, paging.ReasonPageSizeNegative},
	} {
		t.Run("refused/"+tc.name, func(t *testing.T) {
			t.Parallel()
			resp, err := s.Orchestrator.ListTasks(testkit.As(w.s, tc.as), tc.req)
			if !apierror.Is(err, tc.code, tc.reason) || len(resp.GetTasks()) != 0 {
				t.Fatalf("got %d tasks, %v; want %v %s", len(resp.GetTasks()), err, tc.code, tc.reason)
			}
		})
	}
	if _, err := s.Orchestrator.ListTasks(context.Background(), &orchestratorv1.ListTasksRequest{}); apierror.Code(err) != codes.Unauthenticated {
		t.Errorf("listing without a token = %v, want UNAUTHENTICATED", err)
	}
}

// TestListsPageInEveryService walks the lists of the registry, evidence
// and orchestrator page by page: the same items as one large page, and
// ListRequests filtered by state.
func TestListsPageInEveryService(t *testing.T) {
	t.Parallel()
	s := startSuite(t, t.TempDir())
	w := &world{t: t, s: s}
	w.connect(scenario.StdioFixture(v0m3Bin))
	task := w.startTask()
	id := task.GetTask().GetId()
	for i := range 3 {
		if _, err := w.retrieve(task, fmt.Sprint("call-", i)); err != nil {
			t.Fatalf("retrieve %d: %v", i, err)
		}
	}
	// Two refused: a capability not offered.
	for i := range 2 {
		_, err := s.Orchestrator.SubmitToolRequest(testkit.As(w.s, scenario.Alice), &orchestratorv1.SubmitToolRequestRequest{
			TaskId: id, ProviderCallId: fmt.Sprint("refused-", i), Capability: scenario.Deliver,
		})
		if !apierror.Is(err, codes.PermissionDenied, "CAPABILITY_NOT_OFFERED") {
			t.Fatalf("deliver in a review task = %v", err)
		}
	}
	integrator, alice, auditor := testkit.As(w.s, scenario.Integrator), testkit.As(w.s, scenario.Alice), testkit.As(w.s, scenario.Auditor)
	ids := func(n int, id func(int) string) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = id(i)
		}
		return out
	}
	for _, tc := range []struct {
		name string
		// list returns the ids on one page.
		list func(size int32, tok string) ([]string, string, error)
		want int
	}{
		{"capabilities", func(size int32, tok string) ([]string, string, error) {
			r, err := s.Registry.ListCapabilities(integrator, &registryv1.ListCapabilitiesRequest{PageSize: size, PageToken: tok})
			return ids(len(r.GetCapabilities()), func(i int) string { return r.GetCapabilities()[i].GetName() }), r.GetNextPageToken(), err
		}, -1},
		{"task profiles", func(size int32, tok string) ([]string, string, error) {
			r, err := s.Registry.ListTaskProfiles(integrator, &registryv1.ListTaskProfilesRequest{PageSize: size, PageToken: tok})
			return ids(len(r.GetProfiles()), func(i int) string { return r.GetProfiles()[i].GetName() }), r.GetNextPageToken(), err
		}, -1},
		{"connections", func(size int32, tok string) ([]string, string, error) {
			r, err := s.Registry.ListConnections(integrator, &registryv1.ListConnectionsRequest{PageSize: size, PageToken: tok})
			return ids(len(r.GetConnections()), func(i int) string { return r.GetConnections()[i].GetId() }), r.GetNextPageToken(), err
		}, 1},
		{"config revisions", func(size int32, tok string) ([]string, string, error) {
			r, err := s.Registry.ListConfigRevisions(integrator, &registryv1.ListConfigRevisionsRequest{ConnectionId: w.conn.GetId(), PageSize: size, PageToken: tok})
			return ids(len(r.GetRevisions()), func(i int) string { return fmt.Sprint(r.GetRevisions()[i].GetRevision()) }), r.GetNextPageToken(), err
		}, 1},
		{"snapshots", func(size int32, tok string) ([]string, string, error) {
			r, err := s.Registry.ListSnapshots(integrator, &registryv1.ListSnapshotsRequest{ConnectionId: w.conn.GetId(), PageSize: size, PageToken: tok})
			return ids(len(r.GetSnapshots()), func(i int) string { return r.GetSnapshots()[i].GetId() }), r.GetNextPageToken(), err
		}, 1},
		{"mappings", func(size int32, tok string) ([]string, string, error) {
			r, err := s.Registry.ListMappings(integrator, &registryv1.ListMappingsRequest{PageSize: size, PageToken: tok})
			return ids(len(r.GetMappings()), func(i int) string { return r.GetMappings()[i].GetId() }), r.GetNextPageToken(), err
		}, 1},
		{"observations", func(size int32, tok string) ([]string, string, error) {
			r, err := s.Evidence.ListObservations(auditor, &evidencev1.ListObservationsRequest{TaskId: id, PageSize: size, PageToken: tok})
			return ids(len(r.GetObservations()), func(i int) string { return r.GetObservations()[i].GetId() }), r.GetNextPageToken(), err
		}, -1},
		{"source revisions", func(size int32, tok string) ([]string, string, error) {
			r, err := s.Evidence.ListRevisions(auditor, &evidencev1.ListRevisionsRequest{ConnectionId: w.conn.GetId(), ResourceUri: scenario.MigrationFAQURI, PageSize: size, PageToken: tok})
			return ids(len(r.GetRevisions()), func(i int) string { return r.GetRevisions()[i].GetId() }), r.GetNextPageToken(), err
		}, 1},
		{"requests", func(size int32, tok string) ([]string, string, error) {
			r, err := s.Orchestrator.ListRequests(alice, &orchestratorv1.ListRequestsRequest{TaskId: id, PageSize: size, PageToken: tok})
			return ids(len(r.GetRequests()), func(i int) string { return r.GetRequests()[i].GetProviderCallId() }), r.GetNextPageToken(), err
		}, 5},
		{"executed requests", func(size int32, tok string) ([]string, string, error) {
			r, err := s.Orchestrator.ListRequests(alice, &orchestratorv1.ListRequestsRequest{TaskId: id, State: orchestratorv1.RequestState_REQUEST_STATE_EXECUTED, PageSize: size, PageToken: tok})
			return ids(len(r.GetRequests()), func(i int) string { return r.GetRequests()[i].GetProviderCallId() }), r.GetNextPageToken(), err
		}, 3},
		{"refused requests", func(size int32, tok string) ([]string, string, error) {
			r, err := s.Orchestrator.ListRequests(alice, &orchestratorv1.ListRequestsRequest{TaskId: id, State: orchestratorv1.RequestState_REQUEST_STATE_REFUSED, PageSize: size, PageToken: tok})
			return ids(len(r.GetRequests()), func(i int) string { return r.GetRequests()[i].GetProviderCallId() }), r.GetNextPageToken(), err
		}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			whole := walk(t, paging.MaxSize, tc.list)
			if tc.want >= 0 && len(whole) != tc.want {
				t.Fatalf("%d items %v, want %d", len(whole), whole, tc.want)
			}
			if len(whole) < 2 && tc.want < 0 {
				t.Fatalf("%d items: too few to page", len(whole))
			}
			for _, size := range []int32{1, 2} {
				if got := walk(t, size, tc.list); !slices.Equal(got, whole) {
					t.Errorf("size %d: %v, want %v", size, got, whole)
				}
			}
			if len(whole) > 1 {
				_, next, err := tc.list(1, "")
				if err != nil || next == "" {
					t.Fatalf("first page of one: %q, %v", next, err)
				}
				if _, _, err := tc.list(1, next+"x"); !apierror.Is(err, codes.InvalidArgument, paging.ReasonPageTokenInvalid) {
					t.Errorf("a changed token = %v, want INVALID_ARGUMENT %s", err, paging.ReasonPageTokenInvalid)
				}
			}
			if _, _, err := tc.list(-5, ""); !apierror.Is(err, codes.InvalidArgument, paging.ReasonPageSizeNegative) {
				t.Errorf("negative page size = %v", err)
			}
		})
	}
	// A token of the executed requests is not one of the refused ones.
	r, err := s.Orchestrator.ListRequests(alice, &orchestratorv1.ListRequestsRequest{TaskId: id, State: orchestratorv1.RequestState_REQUEST_STATE_EXECUTED, PageSize: 1})
	if err != nil || r.GetNextPageToken() == "" {
		t.Fatal(r, err)
	}
	_, err = s.Orchestrator.ListRequests(alice, &orchestratorv1.ListRequestsRequest{TaskId: id, State: orchestratorv1.RequestState_REQUEST_STATE_REFUSED, PageSize: 1, PageToken: r.GetNextPageToken()})
	if !apierror.Is(err, codes.InvalidArgument, paging.ReasonPageTokenFilterMismatch) {
		t.Errorf("a token of another state filter = %v, want %s", err, paging.ReasonPageTokenFilterMismatch)
	}
	// Bob may not list alice's requests.
	if _, err := s.Orchestrator.ListRequests(testkit.As(w.s, scenario.Bob), &orchestratorv1.ListRequestsRequest{TaskId: id}); apierror.Code(err) != codes.PermissionDenied {
		t.Errorf("bob listing alice's requests = %v, want PERMISSION_DENIED", err)
	}
}

// TestStartTaskIdempotent retries StartTask with one request id: the
// same task and handles, once; another payload is refused and starts
// nothing; another requester's key is their own.
func TestStartTaskIdempotent(t *testing.T) {
	t.Parallel()
	// The store's create-if-absent decides between concurrent retries:
	// both stores.
	for _, store := range []string{"file", "redis"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			cfg := suite.Config{DataDir: t.TempDir()}
			if store == "redis" {
				addr, _ := redistest.Start(t)
				cfg.Store = "redis://" + addr + "/0?prefix=" + redistest.Prefix(t)
			}
			s, err := suite.Start(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(s.Close)
			testStartTaskIdempotent(t, s)
		})
	}
}

func testStartTaskIdempotent(t *testing.T, s *suite.Suite) {
	w := &world{t: t, s: s}
	w.connect(scenario.StdioFixture(v0m3Bin))
	start := func(p scenario.Person, requestID, purpose string) (*orchestratorv1.StartTaskResponse, error) {
		return s.Orchestrator.StartTask(testkit.As(w.s, p), &orchestratorv1.StartTaskRequest{
			Profile: "source_review", Purpose: purpose, SourceScope: faqScope, RequestId: requestID,
		})
	}
	const key = "6f0e4f6e-3c1a-4d7b-9a55-8d1c2b7e0f11"
	// Concurrent retries of one call: one task.
	const n = 4
	got := make([]*orchestratorv1.StartTaskResponse, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = start(scenario.Alice, key, "review")
		}()
	}
	wg.Wait()
	first := got[0]
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("call %d: %v", i, errs[i])
		}
		if got[i].GetTask().GetId() != first.GetTask().GetId() {
			t.Fatalf("call %d started task %s, call 0 %s", i, got[i].GetTask().GetId(), first.GetTask().GetId())
		}
		if !proto.Equal(got[i].GetCatalogue(), first.GetCatalogue()) {
			t.Errorf("call %d got another catalogue (other handles)", i)
		}
	}
	if first.GetTask().GetRequestId() != key {
		t.Errorf("task request_id %q", first.GetTask().GetRequestId())
	}
	handle := scenario.FindHandle(scenario.FindOffered(first.GetCatalogue(), scenario.Retrieve), "Migration FAQ")
	if handle == "" {
		t.Fatal("no handle offered")
	}
	// A later retry: the same task and handle, which still works.
	again, err := start(scenario.Alice, key, "review")
	if err != nil || again.GetTask().GetId() != first.GetTask().GetId() ||
		scenario.FindHandle(scenario.FindOffered(again.GetCatalogue(), scenario.Retrieve), "Migration FAQ") != handle {
		t.Fatalf("retry = %v, %v", again.GetTask(), err)
	}
	if r, err := w.retrieve(again, "after-retry"); err != nil || r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
		t.Fatalf("retrieve with the retried catalogue's handle = %v, %v", r.GetState(), err)
	}
	count := func(p scenario.Person) int {
		r, err := s.Orchestrator.ListTasks(testkit.As(w.s, p), &orchestratorv1.ListTasksRequest{PageSize: paging.MaxSize})
		if err != nil {
			t.Fatal(err)
		}
		return len(r.GetTasks())
	}
	if c := count(scenario.Alice); c != 1 {
		t.Fatalf("alice has %d tasks after retries, want 1", c)
	}
	// The same key with another payload: refused, nothing started.
	_, err = start(scenario.Alice, key, "another purpose")
	if !apierror.Is(err, codes.AlreadyExists, "IDEMPOTENCY_KEY_REUSED") || apierror.Info(err).GetMetadata()["request_id"] != key {
		t.Fatalf("reused key, other payload = %v, want ALREADY_EXISTS IDEMPOTENCY_KEY_REUSED naming the request id", err)
	}
	if c := count(scenario.Alice); c != 1 {
		t.Errorf("alice has %d tasks after a refused reuse, want 1", c)
	}
	// Bob's key is his own: a task of his, not alice's.
	bobs, err := start(scenario.Bob, key, "review")
	if err != nil || bobs.GetTask().GetId() == first.GetTask().GetId() || bobs.GetTask().GetRequester().GetId() != scenario.Bob.ID {
		t.Fatalf("bob with alice's key = %v, %v; want his own task", bobs.GetTask(), err)
	}
	// Without a key every call is a new task.
	a, errA := start(scenario.Alice, "", "review")
	b, errB := start(scenario.Alice, "", "review")
	if errA != nil || errB != nil || a.GetTask().GetId() == b.GetTask().GetId() {
		t.Errorf("two calls without a key = %v, %v (%v, %v); want two tasks", a.GetTask().GetId(), b.GetTask().GetId(), errA, errB)
	}
	for _, bad := range []string{"has space", string(make([]byte, 129))} {
		if _, err := start(scenario.Alice, bad, "review"); !apierror.Is(err, codes.InvalidArgument, "FIELD_INVALID") {
			t.Errorf("request id %q = %v, want FIELD_INVALID", bad, err)
		}
	}
}
