package policy

import (
	"context"
	"path/filepath"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/testkit"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
)

// TestDefaultRoles: the built-in policy's roles and separation of duties,
// as the services ask them.
func TestDefaultRoles(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	p := func(id string, groups ...string) *policyv1.Principal {
		return &policyv1.Principal{Id: id, Groups: groups}
	}
	tests := []struct {
		name    string
		req     *policyv1.AuthorizeActionRequest
		allowed bool
		refusal string
	}{
		{"platform creates connections", &policyv1.AuthorizeActionRequest{Principal: p("ines", "platform"), Action: "connection.create", ResourceType: "connection"}, true, ""},
		{"an author does not", &policyv1.AuthorizeActionRequest{Principal: p("alice", "authors"), Action: "connection.create", ResourceType: "connection"}, false, "ROLE_NOT_GRANTED"},
		{"a reviewer reviews another's mapping", &policyv1.AuthorizeActionRequest{Principal: p("rita", "reviewers"), Action: "mapping.review", ResourceType: "mapping", ResourceId: "map_1",
			Attributes: map[string]string{"proposed_by": "ines"}}, true, ""},
		{"nobody reviews their own", &policyv1.AuthorizeActionRequest{Principal: p("ines", "platform", "reviewers"), Action: "mapping.review", ResourceType: "mapping", ResourceId: "map_1",
			Attributes: map[string]string{"proposed_by": "ines"}}, false, "SELF_REVIEW"},
		{"an approver approves another's request", &policyv1.AuthorizeActionRequest{Principal: p("bob", "approvers"), Action: "request.approve", ResourceType: "request",
			Attributes: map[string]string{"requester": "alice", "actor": "writer"}}, true, ""},
		{"not the requester's own", &policyv1.AuthorizeActionRequest{Principal: p("alice", "approvers"), Action: "request.approve", ResourceType: "request",
			Attributes: map[string]string{"requester": "alice", "actor": ""}}, false, "SELF_APPROVAL"},
		{"not the delegating service's own", &policyv1.AuthorizeActionRequest{Principal: p("writer", "approvers"), Action: "request.approve", ResourceType: "request",
			Attributes: map[string]string{"requester": "alice", "actor": "writer"}}, false, "SELF_APPROVAL"},
		{"platform reads connections", &policyv1.AuthorizeActionRequest{Principal: p("ines", "platform"), Action: "connection.read", ResourceType: "connection"}, true, ""},
		{"a reviewer reads mappings", &policyv1.AuthorizeActionRequest{Principal: p("rita", "reviewers"), Action: "mapping.read", ResourceType: "mapping"}, true, ""},
		{"an auditor reads snapshots", &policyv1.AuthorizeActionRequest{Principal: p("audrey", "auditors"), Action: "snapshot.read", ResourceType: "snapshot"}, true, ""},
		{"a caller in no group reads no connection", &policyv1.AuthorizeActionRequest{Principal: p("mallory"), Action: "connection.read", ResourceType: "connection"}, false, "ROLE_NOT_GRANTED"},
		{"an author reads no mapping", &policyv1.AuthorizeActionRequest{Principal: p("alice", "authors"), Action: "mapping.read", ResourceType: "mapping"}, false, "ROLE_NOT_GRANTED"},
		{"anyone authenticated reads capabilities", &policyv1.AuthorizeActionRequest{Principal: p("mallory"), Action: "capability.read", ResourceType: "capability"}, true, ""},
		{"a product service links claims on its own task", &policyv1.AuthorizeActionRequest{Principal: p("writer", "product-services"), Action: "claim.link", ResourceType: "observation",
			Attributes: map[string]string{"requester": "alice", "actor": "writer"}}, true, ""},
		{"a requester links claims on her own task", &policyv1.AuthorizeActionRequest{Principal: p("alice", "authors"), Action: "claim.link", ResourceType: "task",
			Attributes: map[string]string{"requester": "alice", "actor": ""}}, true, ""},
		{"not on another's task", &policyv1.AuthorizeActionRequest{Principal: p("writer", "product-services"), Action: "claim.link", ResourceType: "observation",
			Attributes: map[string]string{"requester": "bob", "actor": "other-app"}}, false, "ROLE_NOT_GRANTED"},
		{"not on a task it cannot name", &policyv1.AuthorizeActionRequest{Principal: p("writer", "product-services"), Action: "claim.link", ResourceType: "observation"}, false, "ROLE_NOT_GRANTED"},
		{"product services act for users", &policyv1.AuthorizeActionRequest{Principal: p("writer", "product-services"), Action: "task.act_for", ResourceType: "user", ResourceId: "alice"}, true, ""},
		{"others do not", &policyv1.AuthorizeActionRequest{Principal: p("mallory", "authors"), Action: "task.act_for", ResourceType: "user", ResourceId: "alice"}, false, "ROLE_NOT_GRANTED"},
		{"auditors read traces", &policyv1.AuthorizeActionRequest{Principal: p("ada", "auditors"), Action: "trace.read", ResourceType: "task", ResourceId: "task_1"}, true, ""},
		{"a settler settles an unknown outcome", &policyv1.AuthorizeActionRequest{Principal: p("carol", "settler"), Action: "request.settle", ResourceType: "request",
			Attributes: map[string]string{"requester": "alice", "actor": ""}}, true, ""},
		{"an admin settles an unknown outcome", &policyv1.AuthorizeActionRequest{Principal: p("dana", "admins"), Action: "request.settle", ResourceType: "request",
			Attributes: map[string]string{"requester": "alice", "actor": ""}}, true, ""},
		{"the requester does not", &policyv1.AuthorizeActionRequest{Principal: p("alice", "authors"), Action: "request.settle", ResourceType: "request",
			Attributes: map[string]string{"requester": "alice", "actor": ""}}, false, "ROLE_NOT_GRANTED"},
		{"an approver does not", &policyv1.AuthorizeActionRequest{Principal: p("bob", "approvers"), Action: "request.settle", ResourceType: "request",
			Attributes: map[string]string{"requester": "alice", "actor": ""}}, false, "ROLE_NOT_GRANTED"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := e.client.AuthorizeAction(context.Background(), tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if got := resp.GetDecision() == policyv1.Decision_DECISION_ALLOW; got != tc.allowed || resp.GetRefusalReason() != tc.refusal {
				t.Fatalf("decision %v refusal %q (policies %v), want allowed=%v refusal %q", resp.GetDecision(), resp.GetRefusalReason(), resp.GetReasons(), tc.allowed, tc.refusal)
			}
		})
	}
}

// TestCapabilityIsNotAnAction: a capability's name is not an action this
// RPC decides, so a permit for a capability never grants an
// administrative action of the same name.
func TestCapabilityIsNotAnAction(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	_, err := e.client.AuthorizeAction(context.Background(), &policyv1.AuthorizeActionRequest{
		Principal: &policyv1.Principal{Id: "alice", Groups: []string{"authors"}}, Action: "render_preview", ResourceType: "connection"})
	if !apierror.Is(err, codes.InvalidArgument, "FIELD_INVALID") {
		t.Fatalf("capability as action: %v", err)
	}
}

// TestReloadPolicyNeedsItsRole: only a policy administrator reloads the
// policy; a refused reload changes nothing.
func TestReloadPolicyNeedsItsRole(t *testing.T) {
	t.Parallel()
	const admins = `
@id("admins-reload")
permit (principal in V0M3::Group::"policy-admins", action == V0M3::Action::"policy.reload", resource);
`
	path := filepath.Join(t.TempDir(), "policy.cedar")
	writePolicy(t, path, policyV1+admins)
	e := newEnv(t, options{policyFile: path})
	before := revision(t, e)
	writePolicy(t, path, policyV2+admins)

	if _, err := e.srv.ReloadPolicy(testkit.AsUser(context.Background(), "mallory", "authors"), &policyv1.ReloadPolicyRequest{}); !apierror.Is(err, codes.PermissionDenied, "ROLE_NOT_GRANTED") {
		t.Fatalf("reload by an author: %v, want ROLE_NOT_GRANTED", err)
	}
	if got := revision(t, e); got.GetRevision() != before.GetRevision() {
		t.Fatal("a refused reload changed the policy")
	}
	got, err := e.srv.ReloadPolicy(testkit.AsUser(context.Background(), "pat", "policy-admins"), &policyv1.ReloadPolicyRequest{})
	if err != nil || got.GetRevision() == before.GetRevision() {
		t.Fatalf("reload by a policy administrator: %v, %v", got, err)
	}
}
