package attack_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/v0m3/v0m3/demo/scenario"
	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/testkit"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	"github.com/v0m3/v0m3/suite"
)

// TestPruneIsAudited: EvidenceService/Prune strips protocol evidence from
// every trace, and used to leave no record of who did it. Now a prune
// leaves an audit record naming the person who pruned, how far back and
// how much went; a refused prune changes nothing and is on record with
// its reason too.
func TestPruneIsAudited(t *testing.T) {
	t.Parallel()
	s := startServices(t, suite.Registry, suite.Policy, suite.Evidence)
	ctx := context.Background()
	const task = "task_pruned"
	adapter := peers(t, s, suite.Adapter)
	if _, err := adapter.Evidence.AppendTrace(ctx, &evidencev1.AppendTraceRequest{Event: &evidencev1.TraceEvent{TaskId: task,
		Layer: &evidencev1.TraceEvent_Protocol{Protocol: &evidencev1.ProtocolEvent{
			Method: "tools/call", ResponseDigest: "sha256:abc", SafeArguments: scenario.MustStruct(map[string]any{"query": "migration"}),
		}}}}); err != nil {
		t.Fatal(err)
	}
	auditor := testkit.As(s, audrey)
	trace := func() *evidencev1.Trace {
		t.Helper()
		tr, err := s.Evidence.GetTrace(auditor, &evidencev1.GetTraceRequest{TaskId: task})
		if err != nil {
			t.Fatal(err)
		}
		return tr
	}
	before := trace()
	all := &evidencev1.PruneRequest{OlderThan: durationpb.New(0)}

	// alice may not prune: refused, and the trace is as it was.
	if _, err := s.Evidence.Prune(testkit.As(s, alice), all); !apierror.Is(err, codes.PermissionDenied, "ROLE_NOT_GRANTED") {
		t.Fatalf("alice pruning: %v, want PERMISSION_DENIED ROLE_NOT_GRANTED", err)
	}
	if after := trace(); !proto.Equal(before, after) {
		t.Fatalf("a refused prune changed the trace:\n%v\n%v", before, after)
	}

	// ivan of the platform prunes.
	resp, err := s.Evidence.Prune(testkit.As(s, ivan), all)
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetSummarizedEvents() < 1 {
		t.Fatalf("prune summarized %d events of %v", resp.GetSummarizedEvents(), before)
	}
	var records []*evidencev1.AuditRecord
	testkit.Eventually(t, "two evidence.prune audit records", func() bool {
		l, err := s.Evidence.ListAuditRecords(auditor, &evidencev1.ListAuditRecordsRequest{Action: "evidence.prune", PageSize: 100})
		records = l.GetRecords()
		return err == nil && len(records) == 2
	})
	refused, done := records[0], records[1]
	if refused.GetPrincipal() != alice.ID || refused.GetOutcome() != "ROLE_NOT_GRANTED" {
		t.Errorf("refused prune recorded as %v", refused)
	}
	if done.GetPrincipal() != ivan.ID || done.GetOutcome() != "ok" || done.GetResource() != "evidence:traces" ||
		done.GetRecordedBy() != suite.Evidence || !strings.Contains(done.GetDetail(), "protocol events summarized") {
		t.Errorf("prune recorded as %v, want ivan's, ok, recorded by evidence, with what went", done)
	}
}
