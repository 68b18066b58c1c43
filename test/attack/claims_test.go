package attack_test

import (
	"context"
	"path/filepath"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/demo/scenario"
	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/paging"
	"github.com/v0m3/v0m3/internal/store"
	"github.com/v0m3/v0m3/internal/testkit"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
	"github.com/v0m3/v0m3/suite"
)

// TestClaimsOnlyOnOwnTasksEvidence: a product service used to link claims
// to the evidence of any task, including tasks it neither requested nor
// acts for. Now a claim link is decided with the task's requester and
// actor: a product service links claims to observations of the task it
// started for its user (and alice to her own task's), and is refused (PERMISSION_DENIED,
// ROLE_NOT_GRANTED) on alice's own task, on another service's task, and
// on an observation id it guesses; no refused link is stored, and every
// attempt is in the audit log.
func TestClaimsOnlyOnOwnTasksEvidence(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := context.Background()
	s, err := suite.Start(ctx, suite.Config{DataDir: dir,
		Reach: &suite.Reach{StdioRoots: []string{filepath.Dir(v0m3Bin)}, AllowLoopback: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	// alice's own source-review task, with a retrieval observed.
	r, err := scenario.Run(ctx, s.Clients, scenario.Config{Transport: scenario.StdioFixture(v0m3Bin), As: s.As})
	if err != nil {
		t.Fatal(err)
	}
	auditor := s.As(ctx, scenario.Auditor.ID, scenario.Auditor.Groups...)
	aliceObs := firstObservation(t, s, auditor, r.SourceTask.GetTask().GetId())

	// writer, a product service, starts a task for alice and retrieves.
	writer := s.As(ctx, "writer@apps", "product-services")
	own, err := s.Orchestrator.StartTask(writer, &orchestratorv1.StartTaskRequest{
		Profile: "source_review", Purpose: "review the FAQ for alice",
		SourceScope: []*orchestratorv1.SourceRef{{Uri: scenario.MigrationFAQURI, Title: "Migration FAQ"}},
		OnBehalfOf:  &policyv1.Principal{Id: scenario.Alice.ID, Groups: scenario.Alice.Groups},
	})
	if err != nil {
		t.Fatal(err)
	}
	handle := scenario.FindHandle(scenario.FindOffered(own.GetCatalogue(), scenario.Retrieve), "Migration FAQ")
	if _, err := s.Orchestrator.SubmitToolRequest(writer, &orchestratorv1.SubmitToolRequestRequest{
		TaskId: own.GetTask().GetId(), ProviderCallId: "w-1", Capability: scenario.Retrieve,
		Arguments: scenario.MustStruct(map[string]any{"source": handle, "query": "migration"}),
	}); err != nil {
		t.Fatal(err)
	}
	ownObs := firstObservation(t, s, auditor, own.GetTask().GetId())

	other := s.As(ctx, "other-app@apps", "product-services")
	for _, tc := range []struct {
		name string
		ctx  context.Context
		obs  string
	}{
		{"a product service on alice's own task", writer, aliceObs},
		{"a product service on another service's task", other, ownObs},
		{"a product service guessing an observation id", other, "obs_guessed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.Evidence.LinkClaim(tc.ctx, &evidencev1.LinkClaimRequest{ClaimId: "claim-forged", ObservationId: tc.obs})
			if !apierror.Is(err, codes.PermissionDenied, "ROLE_NOT_GRANTED") {
				t.Fatalf("LinkClaim = %v, want PERMISSION_DENIED ROLE_NOT_GRANTED", err)
			}
		})
	}
	// The service that acts for the task links its claim, and alice hers
	// on her own task.
	link, err := s.Evidence.LinkClaim(writer, &evidencev1.LinkClaimRequest{ClaimId: "claim-own", ObservationId: ownObs})
	if err != nil {
		t.Fatalf("writer linking a claim on its own task: %v", err)
	}
	aliceLink, err := s.Evidence.LinkClaim(s.As(ctx, scenario.Alice.ID, scenario.Alice.Groups...), &evidencev1.LinkClaimRequest{ClaimId: "claim-alice", ObservationId: aliceObs})
	if err != nil {
		t.Fatalf("alice linking a claim on her own task: %v", err)
	}

	// Every attempt is on record: three refused, two linked.
	testkit.Eventually(t, "five claim.link audit records", func() bool {
		l, err := s.Evidence.ListAuditRecords(auditor, &evidencev1.ListAuditRecordsRequest{Action: "claim.link", PageSize: 100})
		if err != nil || len(l.GetRecords()) != 5 {
			return false
		}
		refused := 0
		for _, rec := range l.GetRecords() {
			if rec.GetOutcome() == "ROLE_NOT_GRANTED" {
				refused++
			}
		}
		return refused == 3
	})

	// Nothing refused was stored: the evidence store holds the two links.
	s.Close()
	db, err := store.Open(filepath.Join(dir, "evidence.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Close() }()
	var links []*evidencev1.ClaimLink
	if err := db.View(func(x *store.Tx) error {
		return store.List(x, "claim_links", "", func() *evidencev1.ClaimLink { return &evidencev1.ClaimLink{} },
			func(_ string, l *evidencev1.ClaimLink) error { links = append(links, l); return nil })
	}); err != nil {
		t.Fatal(err)
	}
	stored := map[string]string{}
	for _, l := range links {
		stored[l.GetId()] = l.GetObservationId()
	}
	if len(links) != 2 || stored[link.GetId()] != ownObs || stored[aliceLink.GetId()] != aliceObs {
		t.Fatalf("claim links stored: %v, want only %v and %v", links, link, aliceLink)
	}
}

// firstObservation returns the id of a task's first observation, read as
// an auditor.
func firstObservation(t *testing.T, s *suite.Suite, auditor context.Context, task string) string {
	t.Helper()
	l, err := s.Evidence.ListObservations(auditor, &evidencev1.ListObservationsRequest{TaskId: task, PageSize: paging.MaxSize})
	if err != nil || len(l.GetObservations()) == 0 {
		t.Fatalf("observations of task %s: %v, %v", task, l, err)
	}
	return l.GetObservations()[0].GetId()
}
