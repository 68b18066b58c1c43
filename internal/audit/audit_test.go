package audit_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/audit"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/testkit"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// appender keeps what it was asked to append (the interceptor's unit
// test; the end-to-end test uses the real evidence service).
type appender struct {
	mu   sync.Mutex
	recs []*evidencev1.AuditRecord
	// stored and refused are the request ids of the appends taken and
	// of those failed.
	stored, refused []string
	fail            bool
}

func (a *appender) AppendAuditRecord(_ context.Context, in *evidencev1.AppendAuditRecordRequest, _ ...grpc.CallOption) (*evidencev1.AuditRecord, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.fail {
		a.refused = append(a.refused, in.GetRequestId())
		return nil, errors.New("evidence down")
	}
	a.stored = append(a.stored, in.GetRequestId())
	a.recs = append(a.recs, in.GetRecord())
	return in.GetRecord(), nil
}

func TestInterceptor(t *testing.T) {
	t.Parallel()
	alice := testkit.AsUser(context.Background(), "alice")
	operator := identity.WithCaller(context.Background(), identity.Caller{ID: identity.Operator, Kind: identity.KindService})
	denied := apierror.New(codes.PermissionDenied, "SELF_REVIEW", "no", nil)
	cases := []struct {
		name      string
		ctx       context.Context
		method    string
		req, resp any
		err       error
		want      *evidencev1.AuditRecord // nil: no record
	}{
		{"create", alice, "/v0m3.registry.v1.RegistryService/CreateConnection", &registryv1.CreateConnectionRequest{Owner: "team"},
			&registryv1.Connection{Id: "con_1", ConfigRevision: 1}, nil,
			&evidencev1.AuditRecord{Principal: "alice", Action: audit.ConnectionCreate, Resource: "connection:con_1", Revision: "config_revision=1", Outcome: "ok"}},
		{"refused review", alice, "/v0m3.registry.v1.RegistryService/ReviewMapping", &registryv1.ReviewMappingRequest{MappingId: "map_1", Revision: 2, Approve: true},
			nil, denied,
			&evidencev1.AuditRecord{Principal: "alice", Action: audit.MappingReview, Resource: "mapping:map_1", Revision: "mapping_revision=2", Outcome: "SELF_REVIEW"}},
		{"rotation by the operator", operator, "/v0m3.registry.v1.RegistryService/UpdateConnection",
			&registryv1.UpdateConnectionRequest{Id: "con_1", CredentialRef: "secret/token", CredentialVersion: "7"}, &registryv1.Connection{Id: "con_1", ConfigRevision: 4}, nil,
			&evidencev1.AuditRecord{Principal: "spiffe://v0m3/service/operator", Action: audit.CredentialRotate, Resource: "connection:con_1", Revision: "config_revision=4", Outcome: "ok"}},
		// Every update is a state change: one that leaves the credential
		// is audited too, naming what changed but no value.
		{"update without credential", operator, "/v0m3.registry.v1.RegistryService/UpdateConnection",
			&registryv1.UpdateConnectionRequest{Id: "con_1", DisplayName: "x", ExpectedConfigRevision: 3}, &registryv1.Connection{Id: "con_1", ConfigRevision: 3}, nil,
			&evidencev1.AuditRecord{Principal: "spiffe://v0m3/service/operator", Action: audit.ConnectionUpdate, Resource: "connection:con_1", Revision: "config_revision=3", Outcome: "ok", Detail: "changed display_name"}},
		{"prune", alice, "/v0m3.evidence.v1.EvidenceService/Prune", &evidencev1.PruneRequest{OlderThan: durationpb.New(time.Hour)},
			&evidencev1.PruneResponse{SummarizedEvents: 4}, nil,
			&evidencev1.AuditRecord{Principal: "alice", Action: audit.EvidencePrune, Resource: "evidence:traces", Outcome: "ok", Detail: "older than 1h0m0s, 4 protocol events summarized"}},
		{"refused claim link", alice, "/v0m3.evidence.v1.EvidenceService/LinkClaim", &evidencev1.LinkClaimRequest{ClaimId: "c1", ObservationId: "obs_1"},
			nil, denied,
			&evidencev1.AuditRecord{Principal: "alice", Action: audit.ClaimLink, Resource: "observation:obs_1", Outcome: "SELF_REVIEW", Detail: "claim c1"}},
		{"approve", alice, "/v0m3.orchestrator.v1.OrchestratorService/Approve", &orchestratorv1.ApproveRequest{RequestId: "req_1"},
			&orchestratorv1.ToolRequest{Id: "req_1", MappingRevision: 2, PolicyRevision: "p1"}, nil,
			&evidencev1.AuditRecord{Principal: "alice", Action: audit.RequestApprove, Resource: "request:req_1", Revision: "mapping_revision=2 policy_revision=p1", Outcome: "ok"}},
		{"reload", alice, "/v0m3.policy.v1.PolicyService/ReloadPolicy", &policyv1.ReloadPolicyRequest{}, &policyv1.PolicyRevision{Revision: "r9"}, nil,
			&evidencev1.AuditRecord{Principal: "alice", Action: audit.PolicyReload, Resource: "policy:default", Revision: "policy_revision=r9", Outcome: "ok"}},
		{"not privileged", alice, "/v0m3.orchestrator.v1.OrchestratorService/GetRequest", &orchestratorv1.GetRequestRequest{}, &orchestratorv1.ToolRequest{}, nil, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			a := &appender{}
			resp, err := audit.UnaryServer(audit.New(a, "test", nil, nil))(c.ctx, c.req, &grpc.UnaryServerInfo{FullMethod: c.method},
				func(context.Context, any) (any, error) { return c.resp, c.err })
			if !errors.Is(err, c.err) || (c.err == nil && resp != c.resp) {
				t.Fatalf("the interceptor changed the answer: %v, %v", resp, err)
			}
			if c.want == nil {
				if len(a.recs) != 0 {
					t.Fatalf("recorded %v", a.recs)
				}
				return
			}
			if len(a.recs) != 1 {
				t.Fatalf("%d records", len(a.recs))
			}
			got := a.recs[0]
			if got.GetPrincipal() != c.want.GetPrincipal() || got.GetAction() != c.want.GetAction() || got.GetResource() != c.want.GetResource() ||
				got.GetRevision() != c.want.GetRevision() || got.GetOutcome() != c.want.GetOutcome() || (c.want.GetDetail() != "" && got.GetDetail() != c.want.GetDetail()) {
				t.Errorf("recorded %v, want %v", got, c.want)
			}
		})
	}
	// Every audited method is a real RPC of the access table.
	for _, m := range audit.Audited() {
		if _, ok := identity.AccessFor(m); !ok {
			t.Errorf("%s is audited but no RPC of the access table", m)
		}
	}
}

// TestCredentialMoveSaysPendingReview: an update that moved a
// connection's credential reference (so the registry sent it back to
// review) is recorded as such; a rotation is recorded without it.
func TestCredentialMoveSaysPendingReview(t *testing.T) {
	t.Parallel()
	ivan := testkit.AsUser(context.Background(), "ivan")
	for _, c := range []struct {
		name    string
		state   registryv1.ReviewState
		wantEnd string
	}{
		{"moved", registryv1.ReviewState_REVIEW_STATE_PENDING, "version 2; connection pending review"},
		{"rotated", registryv1.ReviewState_REVIEW_STATE_APPROVED, "version 2"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			a := &appender{}
			resp := &registryv1.Connection{Id: "con_1", ConfigRevision: 2, ReviewState: c.state}
			_, err := audit.UnaryServer(audit.New(a, "test", nil, nil))(ivan,
				&registryv1.UpdateConnectionRequest{Id: "con_1", CredentialRef: "file:token", CredentialVersion: "2"},
				&grpc.UnaryServerInfo{FullMethod: "/v0m3.registry.v1.RegistryService/UpdateConnection"},
				func(context.Context, any) (any, error) { return resp, nil })
			if err != nil || len(a.recs) != 1 {
				t.Fatalf("err %v, %d records", err, len(a.recs))
			}
			if d := a.recs[0].GetDetail(); !strings.HasSuffix(d, c.wantEnd) {
				t.Errorf("detail %q, want it to end in %q", d, c.wantEnd)
			}
		})
	}
}

// TestRecordFailureDoesNotFailTheAction: the action already happened; an
// evidence service that cannot record it never fails it. The record
// waits, with the records after it in order, and is appended once
// evidence is back, with the time the action was taken.
func TestRecordFailureDoesNotFailTheAction(t *testing.T) {
	t.Parallel()
	a := &appender{fail: true}
	r := audit.New(a, "test", nil, nil)
	r.SetRetryWait(time.Millisecond)
	want := &orchestratorv1.Task{Id: "tsk_1"}
	before := time.Now()
	resp, err := audit.UnaryServer(r)(context.Background(), &orchestratorv1.CancelTaskRequest{Id: "tsk_1"},
		&grpc.UnaryServerInfo{FullMethod: "/v0m3.orchestrator.v1.OrchestratorService/CancelTask"},
		func(context.Context, any) (any, error) { return want, nil })
	if err != nil || resp != want {
		t.Fatalf("cancel failed because the audit record could not be appended: %v", err)
	}
	r.Record(context.Background(), audit.TaskCancel, "task:tsk_2", "", nil, "")
	a.mu.Lock()
	a.fail = false
	a.mu.Unlock()
	r.Record(context.Background(), audit.TaskCancel, "task:tsk_3", "", nil, "")
	testkit.Eventually(t, "all 3 records appended once evidence is back", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return len(a.recs) == 3
	})
	a.mu.Lock()
	defer a.mu.Unlock()
	// Sent again under the request id of its first try: evidence stores
	// a record it took before the timeout once.
	if a.refused[0] == "" || a.stored[0] != a.refused[0] || a.stored[0] == a.stored[1] {
		t.Errorf("request ids: refused %v, stored %v; want each record's tries to share one, records apart", a.refused, a.stored)
	}
	for i, res := range []string{"task:tsk_1", "task:tsk_2", "task:tsk_3"} {
		got := a.recs[i]
		if got.GetResource() != res {
			t.Errorf("record %d is for %s, want %s (in the order the actions were taken)", i, got.GetResource(), res)
		}
		if at := got.GetActionTime().AsTime(); at.Before(before.Truncate(time.Microsecond)) || at.After(time.Now()) {
			t.Errorf("record %d says the action was taken at %s", i, at)
		}
	}
	var none *audit.Recorder
	none.Record(context.Background(), audit.TaskCancel, "task:x", "", nil, "") // a nil recorder records nothing and does not panic
}

// TestCloseAppendsWhatWaits: a service stopping appends the records still
// waiting for evidence; records after that are not queued.
func TestCloseAppendsWhatWaits(t *testing.T) {
	t.Parallel()
	a := &appender{fail: true}
	r := audit.New(a, "test", nil, nil)
	r.SetRetryWait(time.Hour) // only Close appends them
	r.Record(context.Background(), audit.TaskCancel, "task:tsk_1", "", nil, "")
	r.Record(context.Background(), audit.TaskCancel, "task:tsk_2", "", nil, "")
	a.mu.Lock()
	a.fail = false
	a.mu.Unlock()
	r.Close(context.Background())
	a.mu.Lock()
	if len(a.recs) != 2 || a.recs[0].GetResource() != "task:tsk_1" || a.recs[1].GetResource() != "task:tsk_2" {
		t.Fatalf("appended at close: %v, want both records in order", a.recs)
	}
	a.fail = true
	a.mu.Unlock()
	r.Record(context.Background(), audit.TaskCancel, "task:tsk_3", "", nil, "")
	r.Close(context.Background())
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.recs) != 2 {
		t.Fatalf("a record after close was appended later: %v", a.recs)
	}
}
