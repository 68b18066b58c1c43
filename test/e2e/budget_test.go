package e2e_test

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/demo/scenario"
	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/testkit"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	"github.com/v0m3/v0m3/services/policy"
	"github.com/v0m3/v0m3/suite"
)

// TestBudgetsThroughTheRealPolicy exhausts a task's budget of calls and of
// response bytes through the real services: RESOURCE_EXHAUSTED naming the
// budget and the dimension, and a withheld result is recorded as failed.
func TestBudgetsThroughTheRealPolicy(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		budget    policy.Limits
		calls     int // successful calls before the refusal
		dimension string
	}{
		{"calls", policy.Limits{Calls: 1}, 1, "calls"},
		{"response bytes", policy.Limits{ResponseBytes: 100}, 0, "response_bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, err := suite.Start(context.Background(), suite.Config{DataDir: t.TempDir(), TaskBudget: tt.budget})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(s.Close)
			w := &world{t: t, s: s}
			w.connect(scenario.StdioFixture(v0m3Bin))
			task := w.startTask()
			for i := range tt.calls {
				if _, err := w.retrieve(task, "ok-"+string(rune('a'+i))); err != nil {
					t.Fatalf("call %d within budget: %v", i+1, err)
				}
			}
			_, err = w.retrieve(task, "over")
			if !apierror.Is(err, codes.ResourceExhausted, "BUDGET_EXCEEDED") {
				t.Fatalf("over budget: %v, want RESOURCE_EXHAUSTED BUDGET_EXCEEDED", err)
			}
			md := apierror.Info(err).GetMetadata()
			if md["budget"] != "task/"+task.GetTask().GetId() || md["dimension"] != tt.dimension {
				t.Errorf("error names budget %q dimension %q, want task/%s %s", md["budget"], md["dimension"], task.GetTask().GetId(), tt.dimension)
			}
			reqs, err := s.Orchestrator.ListRequests(testkit.As(s, scenario.Alice), &orchestratorv1.ListRequestsRequest{TaskId: task.GetTask().GetId()})
			if err != nil {
				t.Fatal(err)
			}
			last := reqs.GetRequests()[len(reqs.GetRequests())-1]
			if last.GetState() == orchestratorv1.RequestState_REQUEST_STATE_EXECUTED || len(last.GetExcerpts()) != 0 {
				t.Errorf("the over-budget request is %v with %d excerpts, want it refused or failed with nothing returned", last.GetState(), len(last.GetExcerpts()))
			}
		})
	}
}
