package attack_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
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

// scopedPolicy is the README's example of a platform team scoping sources
// to groups, in place of the default's scope rule: authors read notes,
// HR reads HR files, product services reach only notes, and the docs site
// is a destination publishers reach.
const scopedPolicy = `
@id("authors-read-notes")
permit (principal in V0M3::Group::"authors", action == V0M3::Action::"source.read", resource)
when { resource.id like "v0m3-sources://notes/*" };

@id("hr-reads-hr-files")
permit (principal in V0M3::Group::"hr", action == V0M3::Action::"source.read", resource)
when { resource.id like "v0m3-sources://hr/*" };

@id("product-services-reach-notes")
permit (principal in V0M3::Group::"product-services", action == V0M3::Action::"source.read", resource)
when { resource.id like "v0m3-sources://notes/*" };

@id("publishers-reach-docs")
permit (principal in V0M3::Group::"publishers", action == V0M3::Action::"destination.reach", resource)
when { resource.id like "https://docs.example/*" };
`

// TestScopeIsWhatTheRequesterMayRead plays people who used to scope a task
// to any source: the handles a task's model gets are bound to its scope,
// so a scope the requester chose was a read of whatever they named. Now
// StartTask asks policy about every entry, for the requester and, when a
// product service starts the task for a user, for that service too, and
// refuses the first one either may not use, naming it, with no task left
// behind.
func TestScopeIsWhatTheRequesterMayRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	faq := &orchestratorv1.SourceRef{Uri: scenario.MigrationFAQURI, Title: "Migration FAQ"}
	salaries := &orchestratorv1.SourceRef{Uri: "v0m3-sources://hr/salary-review", Title: "Salary review"}
	docs := &orchestratorv1.SourceRef{Uri: "https://docs.example/api", Title: "Docs site"}

	// The default policy: people who write and publish may scope tasks;
	// anyone else (an auditor, a platform engineer, someone in no group)
	// may not.
	t.Run("default policy", func(t *testing.T) {
		t.Parallel()
		s, err := suite.Start(ctx, suite.Config{DataDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		for _, who := range []person{{"mallory", nil}, {"auditor", []string{"auditors"}}, ivan} {
			_, err := s.Orchestrator.StartTask(testkit.As(s, who), &orchestratorv1.StartTaskRequest{Profile: "source_review", SourceScope: []*orchestratorv1.SourceRef{faq}})
			if !apierror.Is(err, codes.PermissionDenied, "SCOPE_NOT_AUTHORIZED") || !slices.Equal(apierror.Fields(err), []string{"source_scope[0].uri"}) {
				t.Errorf("%s scoping a task to a source: %v (fields %v)", who.ID, err, apierror.Fields(err))
			}
		}
		noTasks(t, s)
		if _, err := s.Orchestrator.StartTask(testkit.As(s, alice), &orchestratorv1.StartTaskRequest{Profile: "source_review", SourceScope: []*orchestratorv1.SourceRef{faq}}); err != nil {
			t.Fatalf("an author scoping a task to a source: %v", err)
		}
	})

	t.Run("sources scoped to groups", func(t *testing.T) {
		t.Parallel()
		def, err := os.ReadFile("../../services/policy/default.cedar")
		if err != nil {
			t.Fatal(err)
		}
		// The default's scope rule goes; the platform team's rules come in.
		text := string(def)
		i := strings.Index(text, `@id("authors-and-publishers-scope-tasks")`)
		if i < 0 {
			t.Fatal("the default policy has no scope rule to replace")
		}
		file := filepath.Join(t.TempDir(), "policy.cedar")
		if err := os.WriteFile(file, []byte(text[:i]+scopedPolicy), 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := suite.Start(ctx, suite.Config{DataDir: t.TempDir(), PolicyFile: file})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		writer := s.As(ctx, "writer-service", "product-services")
		harriet, err := s.Dev.Issuer.Mint("harriet", []string{"hr"}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		aliceTok, err := s.Dev.Issuer.Mint(alice.ID, alice.Groups, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		scope := func(sources []*orchestratorv1.SourceRef, destinations ...*orchestratorv1.SourceRef) *orchestratorv1.StartTaskRequest {
			return &orchestratorv1.StartTaskRequest{Profile: "source_review", SourceScope: sources, DestinationScope: destinations}
		}
		forUser := func(id string, req *orchestratorv1.StartTaskRequest) *orchestratorv1.StartTaskRequest {
			req.OnBehalfOf = &policyv1.Principal{Id: id}
			return req
		}
		for _, tc := range []struct {
			name      string
			ctx       context.Context
			req       *orchestratorv1.StartTaskRequest
			field     string
			principal string
		}{
			{"an author naming an HR file after a note", testkit.As(s, alice), scope([]*orchestratorv1.SourceRef{faq, salaries}), "source_scope[1].uri", alice.ID},
			{"an author naming a destination", testkit.As(s, alice), scope([]*orchestratorv1.SourceRef{faq}, docs), "destination_scope[0].uri", alice.ID},
			{"a service for a user who may not read it", identity.WithUserToken(writer, aliceTok), forUser(alice.ID, scope([]*orchestratorv1.SourceRef{salaries})), "source_scope[0].uri", alice.ID},
			{"a service that may not reach what its user may read", identity.WithUserToken(writer, harriet), forUser("harriet", scope([]*orchestratorv1.SourceRef{salaries})), "source_scope[0].uri", "writer-service"},
		} {
			_, err := s.Orchestrator.StartTask(tc.ctx, tc.req)
			if !apierror.Is(err, codes.PermissionDenied, "SCOPE_NOT_AUTHORIZED") || !slices.Equal(apierror.Fields(err), []string{tc.field}) ||
				apierror.Info(err).GetMetadata()["principal"] != tc.principal {
				t.Errorf("%s: %v (fields %v), want SCOPE_NOT_AUTHORIZED on %s for %s", tc.name, err, apierror.Fields(err), tc.field, tc.principal)
			}
		}
		noTasks(t, s)

		// What each may read, they get.
		if _, err := s.Orchestrator.StartTask(testkit.As(s, alice), scope([]*orchestratorv1.SourceRef{faq})); err != nil {
			t.Errorf("alice scoping a task to a note: %v", err)
		}
		if _, err := s.Orchestrator.StartTask(s.As(ctx, "harriet", "hr"), scope([]*orchestratorv1.SourceRef{salaries})); err != nil {
			t.Errorf("harriet scoping a task to an HR file: %v", err)
		}
		if _, err := s.Orchestrator.StartTask(identity.WithUserToken(writer, aliceTok), forUser(alice.ID, scope([]*orchestratorv1.SourceRef{faq}))); err != nil {
			t.Errorf("a service scoping alice's task to a note: %v", err)
		}
	})
}

// noTasks checks that no task exists: an auditor reads every task.
func noTasks(t *testing.T, s *suite.Suite) {
	t.Helper()
	list, err := s.Orchestrator.ListTasks(s.As(context.Background(), "auditor", "auditors"), &orchestratorv1.ListTasksRequest{})
	if err != nil || len(list.GetTasks()) != 0 {
		t.Fatalf("tasks after the refused starts: %v, %v", list.GetTasks(), err)
	}
}
