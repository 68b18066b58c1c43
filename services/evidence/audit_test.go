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
	// An append sent again under its request id (after a timeout) is
	// stored once.
	retried := &evidencev1.AppendAuditRecordRequest{RequestId: "audreq_retried", Record: &evidencev1.AuditRecord{
		Principal: "alice", Action: "connection.create", Resource: "connection:con_r", Outcome: "ok"}}
	var firstTry *evidencev1.AuditRecord
	for try := range 2 {
		got, err := e.client.AppendAuditRecord(ctx, retried)
		if err != nil {
			t.Fatal(err)
		}
		if try == 0 {
			firstTry = got
		} else if got.GetId() != firstTry.GetId() || got.GetSequence() != firstTry.GetSequence() {
			t.Errorf("the append sent again returned %v, want the record of its first try %v", got, firstTry)
		}
	}
	ok := &evidencev1.AuditRecord{Principal: "a", Action: "x", Resource: "r", Outcome: "ok"}
	for _, c := range []struct {
		name   string
		req    *evidencev1.AppendAuditRecordRequest
		fields []string
	}{
		{"empty", &evidencev1.AppendAuditRecordRequest{Record: &evidencev1.AuditRecord{}}, []string{"record.principal", "record.action", "record.resource", "record.outcome"}},
		{"no outcome", &evidencev1.AppendAuditRecordRequest{Record: &evidencev1.AuditRecord{Principal: "a", Action: "x", Resource: "r"}}, []string{"record.outcome"}},
		{"huge detail", &evidencev1.AppendAuditRecordRequest{Record: &evidencev1.AuditRecord{Principal: "a", Action: "x", Resource: "r", Outcome: "ok", Detail: strings.Repeat("d", 5000)}}, []string{"record.detail"}},
		{"huge request id", &evidencev1.AppendAuditRecordRequest{Record: ok, RequestId: strings.Repeat("r", 65)}, []string{"request_id"}},
	} {
		_, err := e.client.AppendAuditRecord(ctx, c.req)
		wantError(t, err, codes.InvalidArgument, "AUDIT_RECORD_INVALID", c.fields...)
	}
	all, err := e.client.ListAuditRecords(ctx, &evidencev1.ListAuditRecordsRequest{})
	if err != nil || len(all.GetRecords()) != 6 || all.GetNextPageToken() != "" {
		t.Fatalf("listed %d records (next %q), err %v; want the 6 valid ones and no refused one", len(all.GetRecords()), all.GetNextPageToken(), err)
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
		{"negative page size", &evidencev1.ListAuditRecordsRequest{PageSize: -1}, "FIELD_INVALID"},
	} {
		_, err := e.client.ListAuditRecords(ctx, c.req)
		wantError(t, err, codes.InvalidArgument, c.reason)
	}
}
