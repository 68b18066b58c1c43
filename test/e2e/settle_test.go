package e2e_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/demo/fixture/renderer"
	"github.com/v0m3/v0m3/demo/scenario"
	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	"github.com/v0m3/v0m3/services/orchestrator"
)

var (
	settler   = scenario.Person{ID: "settler@platform", Groups: []string{"settler"}}
	superuser = scenario.Person{ID: "admin@platform", Groups: []string{"admins"}}
)

// TestUnknownRendersGetSettled runs the real renderer that dies after
// committing its artifact and stays down (its status unreadable): the
// render ends FAILED / UNKNOWN. One such request is settled by hand: the
// requester, an approver and an auditor are refused by the real policy with
// nothing changed, a settler settles it with the artifact as evidence. The
// other is settled by the continuous recovery once the renderer is back,
// by the server's status, with its receipt. Each rendered exactly once,
// and each settlement is in the trace.
func TestUnknownRendersGetSettled(t *testing.T) {
	t.Parallel()
	c := startWithOrchestrator(t, orchestrator.Deps{AttemptTimeout: 20 * time.Second, RecoveryInterval: 200 * time.Millisecond})
	down := filepath.Join(testkit.WritableDir(t), "down")
	env := connectRenderer(t, c, "--mode", renderer.ModeCrashAfterRender, "--down-if-exists", down)
	task := startPreviewTask(t, c).GetTask().GetId()
	unknown := func(call string) *orchestratorv1.ToolRequest {
		t.Helper()
		if err := os.Remove(down); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		r := submitPreview(t, c, task, call)
		got, err := approve(c, r.GetId(), documentDigest)
		if err != nil || got.GetState() != orchestratorv1.RequestState_REQUEST_STATE_FAILED || got.GetOutcome() != adapterv1.Outcome_OUTCOME_UNKNOWN {
			t.Fatalf("approve = %v, %v; want FAILED / UNKNOWN", got, err)
		}
		if _, err := os.Stat(down); err != nil {
			t.Fatalf("the renderer did not stay down: %v", err)
		}
		return got
	}
	get := func(id string) *orchestratorv1.ToolRequest {
		t.Helper()
		r, err := c.Orchestrator.GetRequest(testkit.As(c, scenario.Alice), &orchestratorv1.GetRequestRequest{Id: id})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	settledIn := func(id string) []*evidencev1.ProductEvent {
		t.Helper()
		tr, err := c.Evidence.GetTrace(testkit.As(c, scenario.Auditor), &evidencev1.GetTraceRequest{TaskId: task})
		if err != nil {
			t.Fatal(err)
		}
		var out []*evidencev1.ProductEvent
		for _, ev := range tr.GetEvents() {
			if p := ev.GetProduct(); p.GetRequestId() == id && strings.HasPrefix(p.GetReason(), "SETTLED_BY_") {
				out = append(out, p)
			}
		}
		return out
	}

	// By hand, while the renderer stays down.
	r1 := unknown("call-1")
	// An operator finds what to settle across every task: the settler
	// lists r1 with the attempt to examine; people policy does not let
	// settle it see nothing; the task's requester finds it in her task.
	awaiting := func(p scenario.Person, task string) ([]string, error) {
		t.Helper()
		resp, err := c.Orchestrator.ListRequests(testkit.As(c, p), &orchestratorv1.ListRequestsRequest{TaskId: task, AwaitingSettlement: true})
		var ids []string
		for _, r := range resp.GetRequests() {
			ids = append(ids, r.GetId()+"/"+lastAttemptID(r))
		}
		return ids, err
	}
	want := []string{r1.GetId() + "/" + r1.GetAttempts()[0].GetId()}
	if got, err := awaiting(settler, "-"); err != nil || !slices.Equal(got, want) {
		t.Errorf("the settler lists %v, %v awaiting settlement; want %v", got, err, want)
	}
	for _, p := range []scenario.Person{scenario.Alice, approver, scenario.Auditor} {
		if got, err := awaiting(p, "-"); err != nil || len(got) != 0 {
			t.Errorf("%s lists %v, %v awaiting settlement across tasks; want nothing", p.ID, got, err)
		}
	}
	if got, err := awaiting(scenario.Alice, task); err != nil || !slices.Equal(got, want) {
		t.Errorf("the requester lists %v, %v awaiting settlement in her task; want %v", got, err, want)
	}
	if _, err := c.Orchestrator.ListRequests(testkit.As(c, settler), &orchestratorv1.ListRequestsRequest{TaskId: "-"}); !apierror.Is(err, codes.InvalidArgument, "TASK_WILDCARD_UNSUPPORTED") {
		t.Errorf(`listing every task's requests without awaiting_settlement: %v, want INVALID_ARGUMENT TASK_WILDCARD_UNSUPPORTED`, err)
	}
	artifact := "sha256:" + strings.Repeat("c", 64)
	in := &orchestratorv1.SettleRequestRequest{RequestId: r1.GetId(), AttemptId: r1.GetAttempts()[0].GetId(),
		Settlement: orchestratorv1.Settlement_SETTLEMENT_EXECUTED, ArtifactDigest: artifact, Note: "artifact found in the renderer's work directory"}
	for _, p := range []scenario.Person{scenario.Alice, approver, scenario.Auditor} {
		_, err := c.Orchestrator.SettleRequest(testkit.As(c, p), in)
		if !apierror.Is(err, codes.PermissionDenied, "ROLE_NOT_GRANTED") {
			t.Errorf("%s settles: %v, want PERMISSION_DENIED ROLE_NOT_GRANTED", p.ID, err)
		}
	}
	if now := get(r1.GetId()); !proto.Equal(now, r1) || len(settledIn(r1.GetId())) != 0 {
		t.Fatalf("a refused settlement changed the request: %v", now)
	}
	var got *orchestratorv1.ToolRequest
	testkit.EventuallySucceeds(t, "settle as settler", func() error {
		var err error
		got, err = c.Orchestrator.SettleRequest(testkit.As(c, settler), in)
		if err != nil && status.Code(err) != codes.Aborted {
			// ABORTED: the recovery is checking it right now: try
			// again, as the error says. Anything else fails at once.
			t.Fatalf("settle as settler: %v", err)
		}
		return err
	})
	if got.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED || got.GetArtifactDigest() != artifact {
		t.Fatalf("settled by hand = %v", got)
	}
	if evs := settledIn(r1.GetId()); len(evs) != 1 || evs[0].GetReason() != "SETTLED_BY_HAND" || !strings.Contains(evs[0].GetDetail(), settler.ID) {
		t.Errorf("trace of the settlement = %v", evs)
	}
	if got, err := awaiting(settler, "-"); err != nil || len(got) != 0 {
		t.Errorf("after the settlement the settler lists %v, %v; want nothing left", got, err)
	}
	// The audit log names who settled what, and who was refused.
	audit, err := c.Evidence.ListAuditRecords(testkit.As(c, scenario.Auditor), &evidencev1.ListAuditRecordsRequest{Action: "outcome.settle", Resource: "request:" + r1.GetId(), PageSize: 1000})
	if err != nil {
		t.Fatalf("read the audit log: %v", err)
	}
	byOutcome := map[string][]string{}
	for _, rec := range audit.GetRecords() {
		byOutcome[rec.GetOutcome()] = append(byOutcome[rec.GetOutcome()], rec.GetPrincipal())
		if rec.GetRevision() != "attempt="+r1.GetAttempts()[0].GetId() || rec.GetDetail() != "executed" || strings.Contains(rec.GetDetail(), "work directory") {
			t.Errorf("audit record %v: want the attempt bound and the settlement named, never the note", rec)
		}
	}
	if got := byOutcome["ok"]; len(got) != 1 || got[0] != settler.ID {
		t.Errorf("audited settlements = %v, want one by %s", got, settler.ID)
	}
	if got := byOutcome["ROLE_NOT_GRANTED"]; len(got) != 3 {
		t.Errorf("audited refused settlements = %v, want the three refused people", got)
	}
	_, err = c.Orchestrator.SettleRequest(testkit.As(c, superuser), &orchestratorv1.SettleRequestRequest{RequestId: r1.GetId(), AttemptId: r1.GetAttempts()[0].GetId(),
		Settlement: orchestratorv1.Settlement_SETTLEMENT_NOT_EXECUTED, Note: "rewrite it"})
	if !apierror.Is(err, codes.FailedPrecondition, "OUTCOME_NOT_UNKNOWN") {
		t.Errorf("settling a settled request: %v, want OUTCOME_NOT_UNKNOWN", err)
	}

	// By evidence, once the renderer is back.
	r2 := unknown("call-2")
	if err := os.Remove(down); err != nil {
		t.Fatal(err)
	}
	testkit.EventuallyWithin(t, 90*time.Second, "settled once the renderer is back", func() bool {
		got = get(r2.GetId())
		return got.GetOutcome() != adapterv1.Outcome_OUTCOME_UNKNOWN
	})
	if got.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED || got.GetReceiptId() == "" || got.GetArtifactDigest() == "" ||
		!strings.Contains(got.GetAttempts()[0].GetResolution(), "server's status") || len(got.GetAttempts()) != 1 {
		t.Fatalf("settled by evidence = %v", got)
	}
	testkit.Eventually(t, "the settlement by evidence is in the trace", func() bool { return len(settledIn(r2.GetId())) > 0 })
	if n := env.renders(t); n != 2 {
		t.Errorf("rendered %d times for two requests, want 2", n)
	}
}

// lastAttemptID is the id of r's last attempt, "" without one.
func lastAttemptID(r *orchestratorv1.ToolRequest) string {
	if n := len(r.GetAttempts()); n > 0 {
		return r.GetAttempts()[n-1].GetId()
	}
	return ""
}
