package evidence_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
)

const auditSecret = "ghp_AUDITsecretVALUE0123456789abcdefABCD"

// TestAuditRecords: records are stamped (time, order, recorder from the
// caller's certificate, never the request), credential-shaped words are
// redacted, incomplete records are refused with nothing stored, and the
// list pages in order with tokens bound to their filters.
func TestAuditRecords(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	for i := range 5 {
		action := "connection.create"
		if i%2 == 1 {
			action = "request.approve"
		}
		got, err := e.client.AppendAuditRecord(ctx, &evidencev1.AppendAuditRecordRequest{Record: &evidencev1.AuditRecord{
			Principal: "alice", Action: action, Resource: fmt.Sprintf("connection:con_%d", i), Outcome: "ok",
			Revision: "config_revision=2", Detail: "credential sources version " + auditSecret, RecordedBy: "forged", Sequence: 99,
		}})
		if err != nil {
			t.Fatal(err)
		}
		if got.GetSequence() != int64(i+1) || got.GetRecordedBy() != "orchestrator" || got.GetTime() == nil || got.GetId() == "" {
			t.Errorf("record %d stamped %v", i, got)
		}
		if strings.Contains(got.GetDetail(), auditSecret) || !strings.Contains(got.GetDetail(), "[redacted]") {
			t.Errorf("detail %q: the credential-shaped word was not redacted", got.GetDetail())
		}
	}
	for _, c := range []struct {
		name   string
		rec    *evidencev1.AuditRecord
		fields []string
	}{
		{"empty", &evidencev1.AuditRecord{}, []string{"record.principal", "record.action", "record.resource", "record.outcome"}},
		{"no outcome", &evidencev1.AuditRecord{Principal: "a", Action: "x", Resource: "r"}, []string{"record.outcome"}},
		{"huge detail", &evidencev1.AuditRecord{Principal: "a", Action: "x", Resource: "r", Outcome: "ok", Detail: strings.Repeat("d", 5000)}, []string{"record.detail"}},
	} {
		_, err := e.client.AppendAuditRecord(ctx, &evidencev1.AppendAuditRecordRequest{Record: c.rec})
		wantError(t, err, codes.InvalidArgument, "AUDIT_RECORD_INVALID", c.fields...)
	}
	all, err := e.client.ListAuditRecords(ctx, &evidencev1.ListAuditRecordsRequest{})
	if err != nil || len(all.GetRecords()) != 5 || all.GetNextPageToken() != "" {
		t.Fatalf("listed %d records (next %q), err %v; want the 5 valid ones and no refused one", len(all.GetRecords()), all.GetNextPageToken(), err)
	}
	// Two approvals, one per page.
	req := &evidencev1.ListAuditRecordsRequest{PageSize: 1, Action: "request.approve"}
	var seqs []int64
	for range 5 {
		page, err := e.client.ListAuditRecords(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range page.GetRecords() {
			seqs = append(seqs, r.GetSequence())
		}
		if req.PageToken = page.GetNextPageToken(); req.PageToken == "" {
			break
		}
	}
	if fmt.Sprint(seqs) != "[2 4]" {
		t.Errorf("paged approvals %v, want [2 4]", seqs)
	}
	first, err := e.client.ListAuditRecords(ctx, &evidencev1.ListAuditRecordsRequest{PageSize: 1})
	if err != nil || first.GetNextPageToken() == "" {
		t.Fatalf("first page: %v", err)
	}
	for _, c := range []struct {
		name   string
		req    *evidencev1.ListAuditRecordsRequest
		reason string
	}{
		{"token with other filters", &evidencev1.ListAuditRecordsRequest{PageToken: first.GetNextPageToken(), Principal: "alice"}, "PAGE_TOKEN_INVALID"},
		{"made-up token", &evidencev1.ListAuditRecordsRequest{PageToken: "bm90LWEtdG9rZW4"}, "PAGE_TOKEN_INVALID"},
		{"not base64", &evidencev1.ListAuditRecordsRequest{PageToken: "!!"}, "PAGE_TOKEN_INVALID"},
		{"negative page size", &evidencev1.ListAuditRecordsRequest{PageSize: -1}, "REQUEST_INVALID"},
	} {
		_, err := e.client.ListAuditRecords(ctx, c.req)
		wantError(t, err, codes.InvalidArgument, c.reason)
	}
}
