package attack_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/demo/scenario"
	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/testkit"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	"github.com/v0m3/v0m3/suite"
)

// TestProductServiceCannotClaimGroups plays a product service that used to
// give the user it starts a task for any group by naming it in
// on_behalf_of: approvers and platform included. Now the user's groups are
// the groups of the user's own token (verified as any bearer token, its
// subject the user named), or the groups policy lets that product service
// assert (by default authors only); anything else is refused and leaves no
// task behind.
func TestProductServiceCannotClaimGroups(t *testing.T) {
	t.Parallel()
	s, err := suite.Start(context.Background(), suite.Config{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	ctx := context.Background()
	writer := s.As(ctx, "writer-service", "product-services")
	mint := func(subject string, groups ...string) string {
		tok, err := s.Dev.Issuer.Mint(subject, groups, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	aliceToken := mint(scenario.Alice.ID, scenario.Alice.Groups...)
	forAlice := func(groups ...string) *orchestratorv1.StartTaskRequest {
		return &orchestratorv1.StartTaskRequest{Profile: "source_review", Purpose: "review",
			SourceScope: []*orchestratorv1.SourceRef{{Uri: scenario.MigrationFAQURI, Title: "Migration FAQ"}},
			OnBehalfOf:  &policyv1.Principal{Id: scenario.Alice.ID, Groups: groups}}
	}

	for _, tc := range []struct {
		name   string
		ctx    context.Context
		req    *orchestratorv1.StartTaskRequest
		code   codes.Code
		reason string
		field  string
	}{
		{"approvers and platform claimed in the body", writer, forAlice("approvers", "platform"), codes.PermissionDenied, "GROUP_NOT_VERIFIED", "on_behalf_of.groups[0]"},
		{"a group it may assert, then one it may not", writer, forAlice("authors", "approvers"), codes.PermissionDenied, "GROUP_NOT_VERIFIED", "on_behalf_of.groups[1]"},
		{"a group beyond the user's token", identity.WithUserToken(writer, aliceToken), forAlice("authors", "platform"), codes.PermissionDenied, "GROUP_NOT_VERIFIED", "on_behalf_of.groups[1]"},
		{"another user's token", identity.WithUserToken(writer, mint("approver@corp", "approvers")), forAlice(), codes.InvalidArgument, "USER_TOKEN_MISMATCH", "on_behalf_of.id"},
		{"a user token without on_behalf_of", identity.WithUserToken(writer, aliceToken), &orchestratorv1.StartTaskRequest{Profile: "source_review"}, codes.InvalidArgument, "FIELD_REQUIRED", "on_behalf_of.id"},
		{"a person naming herself in groups she lacks", testkit.As(s, alice), forAlice("approvers"), codes.PermissionDenied, "GROUP_NOT_VERIFIED", "on_behalf_of.groups[0]"},
	} {
		_, err := s.Orchestrator.StartTask(tc.ctx, tc.req)
		if !apierror.Is(err, tc.code, tc.reason) || !slices.Equal(apierror.Fields(err), []string{tc.field}) {
			t.Errorf("%s: %v (fields %v), want %v %s on %s", tc.name, err, apierror.Fields(err), tc.code, tc.reason, tc.field)
		}
	}
	// A user token that does not verify refuses the call like a forged
	// bearer token, saying which header it was.
	_, err = s.Orchestrator.StartTask(identity.WithUserToken(writer, "not-a-token"), forAlice())
	if !apierror.Is(err, codes.Unauthenticated, "TOKEN_MALFORMED") || apierror.Info(err).GetMetadata()["header"] != identity.UserTokenHeader {
		t.Errorf("a forged user token: %v, want UNAUTHENTICATED TOKEN_MALFORMED naming %s", err, identity.UserTokenHeader)
	}
	// Nor may a user token name a service: the task would act as one.
	operatorReq := forAlice()
	operatorReq.OnBehalfOf.Id = "spiffe://v0m3/service/operator"
	_, err = s.Orchestrator.StartTask(identity.WithUserToken(writer, mint("spiffe://v0m3/service/operator")), operatorReq)
	if !apierror.Is(err, codes.Unauthenticated, identity.ReasonPrincipalReserved) || apierror.Info(err).GetMetadata()["header"] != identity.UserTokenHeader {
		t.Errorf("a user token naming the operator: %v, want UNAUTHENTICATED %s naming %s", err, identity.ReasonPrincipalReserved, identity.UserTokenHeader)
	}

	// Nothing was left behind: no task for alice or by the service.
	auditor := s.As(ctx, "auditor", "auditors")
	if list, err := s.Orchestrator.ListTasks(auditor, &orchestratorv1.ListTasksRequest{}); err != nil || len(list.GetTasks()) != 0 {
		t.Fatalf("tasks after the refused starts: %v, %v", list.GetTasks(), err)
	}

	// The ways that work: the user's own token (her groups, nothing the
	// service adds), and a group policy lets the service assert.
	for _, tc := range []struct {
		name string
		ctx  context.Context
		req  *orchestratorv1.StartTaskRequest
	}{
		{"alice's token", identity.WithUserToken(writer, aliceToken), forAlice()},
		{"an allowed group", writer, forAlice("authors")},
	} {
		resp, err := s.Orchestrator.StartTask(tc.ctx, tc.req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got := resp.GetTask()
		if got.GetRequester().GetId() != scenario.Alice.ID || !slices.Equal(got.GetRequester().GetGroups(), []string{"authors"}) || got.GetActor() != "writer-service" {
			t.Errorf("%s: requester %v actor %q, want alice of authors only, for writer-service", tc.name, got.GetRequester(), got.GetActor())
		}
	}
	// A delegated task with no group named and no user token has none:
	// the service's own groups are not the user's.
	resp, err := s.Orchestrator.StartTask(writer, &orchestratorv1.StartTaskRequest{Profile: "source_review", OnBehalfOf: &policyv1.Principal{Id: "carol"}})
	if err != nil || len(resp.GetTask().GetRequester().GetGroups()) != 0 {
		t.Fatalf("a task for carol: %v, %v; want one with no groups", resp.GetTask().GetRequester(), err)
	}
}
