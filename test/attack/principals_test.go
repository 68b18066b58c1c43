package attack_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/testkit"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// TestNoTokenNamesAService plays mallory, whose identity provider lets
// her pick her own subject: she takes the operator's names, in the form
// audit records used ("service:operator"), in the form certificates carry
// (its SPIFFE URI, in any case), and a Kubernetes ServiceAccount's name
// (a product service's). Every such token is refused before anything
// runs, with PRINCIPAL_RESERVED; a product service cannot start a task
// for such a "user" either. The audit log then shows the real operator
// (by its certificate) and a person who is merely called "operator" as
// two principals, and nothing of mallory's attempts.
func TestNoTokenNamesAService(t *testing.T) {
	t.Parallel()
	s := start(t)
	ctx := context.Background()
	create := func(ctx context.Context, c registryv1.RegistryServiceClient, name string) (*registryv1.Connection, error) {
		return c.CreateConnection(ctx, &registryv1.CreateConnectionRequest{
			DisplayName: name, Owner: "platform", Transport: markingStdio(t.TempDir() + "/never")})
	}
	for _, sub := range []string{
		"service:operator",
		"spiffe://v0m3/service/operator",
		"SPIFFE://v0m3/service/operator",
		"Service:Operator",
		"spiffe://elsewhere/ns/default/sa/operator",
		"system:serviceaccount:writer:writer",
	} {
		t.Run(sub, func(t *testing.T) {
			mallory := s.As(ctx, sub, "platform", "reviewers", "approvers", "auditors", "product-services")
			_, err := create(mallory, s.Registry, "by "+sub)
			if !apierror.Is(err, codes.Unauthenticated, identity.ReasonPrincipalReserved) {
				t.Fatalf("CreateConnection as %q: %v, want UNAUTHENTICATED %s", sub, err, identity.ReasonPrincipalReserved)
			}
			_, err = s.Orchestrator.StartTask(mallory, &orchestratorv1.StartTaskRequest{Profile: "source_review", Purpose: "review"})
			if !apierror.Is(err, codes.Unauthenticated, identity.ReasonPrincipalReserved) {
				t.Fatalf("StartTask as %q: %v, want UNAUTHENTICATED %s", sub, err, identity.ReasonPrincipalReserved)
			}
			// A product service naming such a user gets no task acting
			// (and recorded) as a service.
			writer := s.As(ctx, "writer", "product-services")
			_, err = s.Orchestrator.StartTask(writer, &orchestratorv1.StartTaskRequest{Profile: "source_review", Purpose: "review",
				OnBehalfOf: &policyv1.Principal{Id: sub, Groups: []string{"authors"}}})
			if !apierror.Is(err, codes.InvalidArgument, identity.ReasonPrincipalReserved) {
				t.Fatalf("StartTask for %q: %v, want INVALID_ARGUMENT %s", sub, err, identity.ReasonPrincipalReserved)
			}
		})
	}

	// The real operator, by its certificate, and a person named
	// "operator", by a token: two records, two principals.
	op := peers(t, s, identity.Operator)
	real, err := create(ctx, op.Registry, "by the operator")
	if err != nil {
		t.Fatal(err)
	}
	person, err := create(s.As(ctx, "operator", "platform"), s.Registry, "by a person called operator")
	if err != nil {
		t.Fatal(err)
	}
	const operatorPrincipal = "spiffe://v0m3/service/operator"
	auditor := s.As(ctx, "ada", "auditors")
	var records []*evidencev1.AuditRecord
	testkit.Eventually(t, "both connections' audit records", func() bool {
		list, err := s.Evidence.ListAuditRecords(auditor, &evidencev1.ListAuditRecordsRequest{PageSize: 1000})
		if err != nil {
			t.Fatal(err)
		}
		records = list.GetRecords()
		return len(records) >= 2
	})
	by := map[string]string{}
	for _, r := range records {
		by[r.GetResource()] = r.GetPrincipal()
		if p := r.GetPrincipal(); strings.HasPrefix(strings.ToLower(p), "service:") ||
			(strings.HasPrefix(strings.ToLower(p), "spiffe:") && r.GetResource() != "connection:"+real.GetId()) {
			t.Errorf("audit record %v names a service it is not", r)
		}
	}
	if len(records) != 2 || by["connection:"+real.GetId()] != operatorPrincipal || by["connection:"+person.GetId()] != "operator" {
		t.Fatalf("audit records %v; want exactly the operator's (as %s) and the person's (as operator)", records, operatorPrincipal)
	}
	// Nothing of mallory's: only the two connections exist, and no task.
	list, err := s.Registry.ListConnections(s.As(ctx, "auditor", "platform", "auditors"), &registryv1.ListConnectionsRequest{})
	if err != nil || len(list.GetConnections()) != 2 {
		t.Fatalf("connections after the attack: %v, %v", list, err)
	}
	tasks, err := s.Orchestrator.ListTasks(auditor, &orchestratorv1.ListTasksRequest{PageSize: 1000})
	if err != nil || len(tasks.GetTasks()) != 0 {
		t.Fatalf("tasks after the attack: %v, %v", tasks, err)
	}
}
